#include "common/model_spec.h"

#include <climits>
#include <optional>

namespace headway {
namespace {

constexpr int kMaxReportedTpSize = 64;

// Gemma 3 alternates five sliding-window layers with one full layer
// (llama.cpp src/llama-model.cpp, LLM_ARCH_GEMMA3: set_swa_pattern(6)).
constexpr int kGemma3SwaPattern = 6;
// RoPE base of Gemma 3's sliding-window layers, fixed by the architecture
// rather than stored in the file (llama.cpp: rope_freq_base_train_swa).
constexpr float kGemma3SlidingRopeBase = 10000.0f;

std::string FileName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A positive int at `key`; NotFound when absent and required.
Result<std::optional<int>> ReadPositiveInt(const GgufFile& file, const std::string& key,
                                           bool required) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) {
    if (required) {
      return Status::NotFound("GGUF file " + file.path() + " has no metadata key '" + key + "'");
    }
    return std::optional<int>();
  }
  auto n = v->AsInt();
  if (!n.ok()) return n.status().WithContext("GGUF file " + file.path() + ", key '" + key + "'");
  if (*n <= 0 || *n > INT_MAX) {
    return Status::InvalidArgument("GGUF file " + file.path() + ": '" + key + "' is " +
                                   std::to_string(*n) + ", expected a positive count");
  }
  return std::optional<int>(static_cast<int>(*n));
}

Result<int> RequiredInt(const GgufFile& file, const std::string& key) {
  HW_ASSIGN_OR_RETURN(std::optional<int> v, ReadPositiveInt(file, key, true));
  return *v;
}

Result<float> OptionalFloat(const GgufFile& file, const std::string& key, float fallback) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return fallback;
  auto f = v->AsFloat();
  if (!f.ok()) return f.status().WithContext("GGUF file " + file.path() + ", key '" + key + "'");
  return static_cast<float>(*f);
}

// Why `tp_size` breaks the TP sharding rule for `spec`, or nothing if it holds.
std::optional<std::string> TpViolation(const ModelSpec& spec, int tp_size) {
  const std::string& a = spec.architecture;
  if (tp_size < 1) return "TP size must be at least 1";
  if (spec.num_heads % tp_size != 0) {
    return std::to_string(spec.num_heads) + " query heads (num_heads, " + a +
           ".attention.head_count) do not divide by " + std::to_string(tp_size);
  }
  if (spec.num_kv_heads >= tp_size) {
    if (spec.num_kv_heads % tp_size != 0) {
      return std::to_string(spec.num_kv_heads) + " KV heads (num_kv_heads, " + a +
             ".attention.head_count_kv) do not divide by " + std::to_string(tp_size);
    }
  } else if (tp_size % spec.num_kv_heads != 0) {
    return "TP size " + std::to_string(tp_size) + " is not a multiple of " +
           std::to_string(spec.num_kv_heads) + " KV heads (num_kv_heads, " + a +
           ".attention.head_count_kv), so KV heads cannot be replicated evenly";
  }
  if (spec.intermediate_size % tp_size != 0) {
    return "intermediate size " + std::to_string(spec.intermediate_size) +
           " (intermediate_size, " + a + ".feed_forward_length) does not divide by " +
           std::to_string(tp_size);
  }
  return std::nullopt;
}

}  // namespace

Result<ModelSpec> LoadModelSpec(const GgufFile& file) {
  ModelSpec spec;
  auto arch_value = file.Get("general.architecture");
  if (!arch_value.ok()) return arch_value.status();
  auto arch = (*arch_value)->AsString();
  if (!arch.ok()) return arch.status().WithContext("GGUF file " + file.path() + ", key 'general.architecture'");
  spec.architecture = *arch;
  const std::string& a = spec.architecture;
  if (a != "llama" && a != "gemma3") {
    return Status::Unimplemented("GGUF file " + file.path() + " has architecture '" + a +
                                 "'; Headway supports llama and gemma3");
  }

  spec.name = FileName(file.path());
  if (const GgufValue* n = file.Find("general.name")) {
    if (auto s = n->AsString(); s.ok() && !s->empty()) spec.name = *s;
  }

  HW_ASSIGN_OR_RETURN(spec.num_layers, RequiredInt(file, a + ".block_count"));
  HW_ASSIGN_OR_RETURN(spec.hidden_size, RequiredInt(file, a + ".embedding_length"));
  HW_ASSIGN_OR_RETURN(spec.num_heads, RequiredInt(file, a + ".attention.head_count"));
  HW_ASSIGN_OR_RETURN(spec.intermediate_size, RequiredInt(file, a + ".feed_forward_length"));
  HW_ASSIGN_OR_RETURN(spec.context_length, RequiredInt(file, a + ".context_length"));
  HW_ASSIGN_OR_RETURN(auto kv_heads, ReadPositiveInt(file, a + ".attention.head_count_kv", false));
  spec.num_kv_heads = kv_heads.value_or(spec.num_heads);
  HW_ASSIGN_OR_RETURN(spec.rope_freq_base, OptionalFloat(file, a + ".rope.freq_base", 10000.0f));
  HW_ASSIGN_OR_RETURN(spec.rms_norm_eps,
                      OptionalFloat(file, a + ".attention.layer_norm_rms_epsilon", 1e-5f));

  const std::string where = "GGUF file " + file.path() + " (model '" + spec.name + "'): ";
  HW_ASSIGN_OR_RETURN(auto key_length, ReadPositiveInt(file, a + ".attention.key_length", false));
  HW_ASSIGN_OR_RETURN(auto value_length, ReadPositiveInt(file, a + ".attention.value_length", false));
  if (key_length) {
    spec.head_dim = *key_length;
  } else if (spec.hidden_size % spec.num_heads != 0) {
    return Status::InvalidArgument(where + std::to_string(spec.num_heads) +
                                   " heads do not divide hidden size " +
                                   std::to_string(spec.hidden_size) + " and no " + a +
                                   ".attention.key_length gives the head size");
  } else {
    spec.head_dim = spec.hidden_size / spec.num_heads;
  }
  if (value_length && *value_length != spec.head_dim) {
    return Status::Unimplemented(where + "value head size " + std::to_string(*value_length) +
                                 " differs from key head size " + std::to_string(spec.head_dim));
  }
  if (spec.num_heads % spec.num_kv_heads != 0) {
    return Status::InvalidArgument(where + std::to_string(spec.num_heads) +
                                   " query heads are not a multiple of " +
                                   std::to_string(spec.num_kv_heads) + " KV heads");
  }

  // Vocabulary: the tokenizer's list, else the declared size, else the
  // embedding's row count.
  if (const GgufValue* tokens = file.Find("tokenizer.ggml.tokens")) {
    const auto* array = std::get_if<GgufValue::Array>(&tokens->value);
    if (array == nullptr) {
      return Status::InvalidArgument(where + "tokenizer.ggml.tokens is not an array");
    }
    spec.vocab_size = static_cast<int>(array->size());
  } else if (const GgufValue* v = file.Find(a + ".vocab_size"); v != nullptr) {
    HW_ASSIGN_OR_RETURN(spec.vocab_size, RequiredInt(file, a + ".vocab_size"));
  } else if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
             embd != nullptr && embd->dims.size() == 2) {
    spec.vocab_size = static_cast<int>(embd->dims[1]);
  }
  if (spec.vocab_size <= 0) {
    return Status::NotFound(where + "no vocabulary (tokenizer.ggml.tokens, " + a +
                            ".vocab_size or token_embd.weight)");
  }
  spec.tied_embeddings = file.FindTensor("output.weight") == nullptr;

  spec.slot_specs.assign(static_cast<size_t>(spec.num_layers) * spec.num_kv_heads, SlotSpec{});
  if (a == "gemma3") {
    HW_ASSIGN_OR_RETURN(int window, RequiredInt(file, a + ".attention.sliding_window"));
    spec.layer_rope_freq_base.assign(spec.num_layers, spec.rope_freq_base);
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      if (layer % kGemma3SwaPattern == kGemma3SwaPattern - 1) continue;  // full layer
      spec.layer_rope_freq_base[layer] = kGemma3SlidingRopeBase;
      for (int h = 0; h < spec.num_kv_heads; ++h) {
        spec.slot_specs[static_cast<size_t>(layer) * spec.num_kv_heads + h].window = window;
      }
    }
  }
  return spec;
}

Status ValidateTpSize(const ModelSpec& spec, int tp_size) {
  if (spec.num_heads <= 0 || spec.num_kv_heads <= 0 || spec.intermediate_size <= 0) {
    return Status::InvalidArgument("model '" + spec.name +
                                   "' has no heads or MLP size; load its spec first");
  }
  std::optional<std::string> violation = TpViolation(spec, tp_size);
  if (!violation) return Status::Ok();
  std::string valid;
  for (int tp : ValidTpSizes(spec, kMaxReportedTpSize)) {
    valid += (valid.empty() ? "" : ", ") + std::to_string(tp);
  }
  return Status::InvalidArgument("model '" + spec.name + "' cannot run at TP size " +
                                 std::to_string(tp_size) + ": " + *violation +
                                 "; valid TP sizes: " + valid);
}

std::vector<int> ValidTpSizes(const ModelSpec& spec, int max_tp_size) {
  std::vector<int> out;
  if (spec.num_heads <= 0 || spec.num_kv_heads <= 0 || spec.intermediate_size <= 0) return out;
  for (int tp = 1; tp <= max_tp_size; ++tp) {
    if (!TpViolation(spec, tp)) out.push_back(tp);
  }
  return out;
}

int FirstRankHoldingKvHead(const ModelSpec& spec, int tp_size, int kv_head) {
  HW_CHECK(ValidateTpSize(spec, tp_size).ok());
  HW_CHECK(kv_head >= 0 && kv_head < spec.num_kv_heads);
  if (spec.num_kv_heads >= tp_size) return kv_head / (spec.num_kv_heads / tp_size);
  return kv_head * (tp_size / spec.num_kv_heads);
}

TpShard ShardForRank(const ModelSpec& spec, int tp_size, int tp_rank) {
  HW_CHECK(ValidateTpSize(spec, tp_size).ok());
  HW_CHECK(tp_rank >= 0 && tp_rank < tp_size);
  TpShard s;
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  if (spec.num_kv_heads >= tp_size) {
    const int k = spec.num_kv_heads / tp_size;
    s.kv_head_begin = tp_rank * k;
    s.kv_head_end = (tp_rank + 1) * k;
  } else {
    // Each KV head is replicated on tp / num_kv_heads consecutive ranks.
    const int kv = tp_rank / (tp_size / spec.num_kv_heads);
    s.kv_head_begin = kv;
    s.kv_head_end = kv + 1;
  }
  // Query heads follow their KV head: with heads % tp == 0 the even split of
  // query heads lands every rank's heads inside its KV heads' groups.
  const int heads_per_rank = spec.num_heads / tp_size;
  s.q_head_begin = tp_rank * heads_per_rank;
  s.q_head_end = (tp_rank + 1) * heads_per_rank;
  const int ffn_per_rank = spec.intermediate_size / tp_size;
  s.intermediate_begin = tp_rank * ffn_per_rank;
  s.intermediate_end = (tp_rank + 1) * ffn_per_rank;
  const int vocab_per_rank = (spec.vocab_size + tp_size - 1) / tp_size;
  s.padded_vocab_size = vocab_per_rank * tp_size;
  s.vocab_begin = tp_rank * vocab_per_rank;
  s.vocab_end = (tp_rank + 1) * vocab_per_rank;  // rows >= vocab_size are padding
  return s;
}

}  // namespace headway
