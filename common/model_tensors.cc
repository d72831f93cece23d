#include "common/model_tensors.h"

#include <string>
#include <vector>

namespace headway {
namespace {

std::string DimsString(const std::vector<uint64_t>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "}";
}

std::string Where(const GgufFile& file, const ModelSpec& spec) {
  return "model '" + spec.name + "' (" + file.path() + "): ";
}

// InvalidArgument when `info` (present) is not of shape `dims`.
Status CheckShape(const GgufFile& file, const ModelSpec& spec, const GgufTensorInfo& info,
                  const std::vector<uint64_t>& dims) {
  if (info.dims == dims) return Status::Ok();
  return Status::InvalidArgument(Where(file, spec) + "tensor " + info.name + " has shape " +
                                 DimsString(info.dims) + ", the metadata implies " +
                                 DimsString(dims));
}

}  // namespace

Status CheckModelTensors(const GgufFile& file, const ModelSpec& spec) {
  // Sizes in 64 bits: the metadata's counts are each at most INT_MAX.
  const uint64_t hidden = uint64_t(spec.hidden_size);
  const uint64_t hd = uint64_t(spec.head_dim);
  const uint64_t q_rows = uint64_t(spec.num_heads) * hd;
  const uint64_t kv_rows = uint64_t(spec.num_kv_heads) * hd;
  const uint64_t inter = uint64_t(spec.intermediate_size);
  const uint64_t vocab = uint64_t(spec.vocab_size);
  const std::string& a = spec.architecture;
  int layer = -1;  // the layer being checked; -1 = the model's own tensors
  auto need = [&](const std::string& name, std::vector<uint64_t> dims) -> Status {
    const GgufTensorInfo* info = file.FindTensor(name);
    if (info != nullptr) return CheckShape(file, spec, *info, dims);
    std::string message = Where(file, spec) + "tensor " + name + " is missing";
    if (layer >= 0) {
      int present = 0;
      while (present < layer &&
             file.FindTensor("blk." + std::to_string(present) + ".attn_norm.weight") != nullptr) {
        ++present;
      }
      message += "; the metadata says " + std::to_string(spec.num_layers) + " layers (" + a +
                 ".block_count), the file has tensors for " + std::to_string(present);
    }
    return Status::NotFound(message);
  };
  HW_RETURN_IF_ERROR(need("token_embd.weight", {hidden, vocab}));
  if (const GgufTensorInfo* output = file.FindTensor("output.weight")) {
    HW_RETURN_IF_ERROR(CheckShape(file, spec, *output, {hidden, vocab}));
  }
  HW_RETURN_IF_ERROR(need("output_norm.weight", {hidden}));
  for (layer = 0; layer < spec.num_layers; ++layer) {
    const std::string p = "blk." + std::to_string(layer) + ".";
    HW_RETURN_IF_ERROR(need(p + "attn_norm.weight", {hidden}));
    HW_RETURN_IF_ERROR(need(p + "attn_q.weight", {hidden, q_rows}));
    HW_RETURN_IF_ERROR(need(p + "attn_k.weight", {hidden, kv_rows}));
    HW_RETURN_IF_ERROR(need(p + "attn_v.weight", {hidden, kv_rows}));
    HW_RETURN_IF_ERROR(need(p + "attn_output.weight", {q_rows, hidden}));
    HW_RETURN_IF_ERROR(need(p + "ffn_norm.weight", {hidden}));
    HW_RETURN_IF_ERROR(need(p + "ffn_gate.weight", {hidden, inter}));
    HW_RETURN_IF_ERROR(need(p + "ffn_up.weight", {hidden, inter}));
    HW_RETURN_IF_ERROR(need(p + "ffn_down.weight", {inter, hidden}));
    if (a == "gemma3") {
      HW_RETURN_IF_ERROR(need(p + "attn_q_norm.weight", {hd}));
      HW_RETURN_IF_ERROR(need(p + "attn_k_norm.weight", {hd}));
      HW_RETURN_IF_ERROR(need(p + "post_attention_norm.weight", {hidden}));
      HW_RETURN_IF_ERROR(need(p + "post_ffw_norm.weight", {hidden}));
    }
  }
  return Status::Ok();
}

}  // namespace headway
