#include "worker/forward_model.h"

#include <cmath>
#include <string>

namespace headway {

ModelArchitecture ArchitectureOf(const ModelSpec& spec) {
  ModelArchitecture a;
  if (spec.architecture == "gemma3") {
    a.rope_style = cpu::RopeStyle::kNeox;
    a.qk_norm = true;
    a.post_norms = true;
    a.gelu_tanh_mlp = true;
    a.embedding_scale = std::sqrt(static_cast<float>(spec.hidden_size));
  }
  return a;
}

Status ValidateModel(const ModelSpec& spec, const ModelWeights* weights,
                     const Communicator* comm) {
  if (spec.architecture != "llama" && spec.architecture != "gemma3") {
    return Status::Unimplemented("model architecture '" + spec.architecture +
                                 "' is not supported (only llama and gemma3)");
  }
  if (weights == nullptr || weights->num_layers() != spec.num_layers) {
    return Status::InvalidArgument("weights do not match model spec '" + spec.name + "'");
  }
  const TpShard& shard = weights->shard();
  if (shard.tp_size > 1 && comm == nullptr) {
    return Status::InvalidArgument("tp_size " + std::to_string(shard.tp_size) +
                                   " needs a communicator");
  }
  if (comm != nullptr && (comm->size() != shard.tp_size || comm->rank() != shard.tp_rank)) {
    return Status::InvalidArgument(
        "communicator rank " + std::to_string(comm->rank()) + " of " +
        std::to_string(comm->size()) + " does not match the weight shard (rank " +
        std::to_string(shard.tp_rank) + " of " + std::to_string(shard.tp_size) + ")");
  }
  if (spec.head_dim % 2 != 0) {
    return Status::InvalidArgument("head_dim " + std::to_string(spec.head_dim) +
                                   " must be even for RoPE");
  }
  if (spec.slot_specs.size() != size_t(spec.num_layers) * spec.num_kv_heads) {
    return Status::InvalidArgument("model spec '" + spec.name + "' has " +
                                   std::to_string(spec.slot_specs.size()) +
                                   " slot specs, expected num_layers * num_kv_heads");
  }
  return Status::Ok();
}

std::vector<SlotSpec> LocalSlotSpecs(const ModelSpec& spec, const TpShard& shard) {
  std::vector<SlotSpec> specs;
  for (int l = 0; l < spec.num_layers; ++l) {
    for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) {
      specs.push_back(spec.slot_specs[size_t(l) * spec.num_kv_heads + h]);
    }
  }
  return specs;
}

}  // namespace headway
