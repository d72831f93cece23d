#include "tests/support/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

namespace headway::testing {
namespace {

// gguf.md value types used here.
constexpr uint32_t kTypeUInt32 = 4;
constexpr uint32_t kTypeInt32 = 5;
constexpr uint32_t kTypeFloat32 = 6;
constexpr uint32_t kTypeBool = 7;
constexpr uint32_t kTypeString = 8;
constexpr uint32_t kTypeArray = 9;
constexpr uint32_t kTypeUInt64 = 10;

template <typename T>
void Put(std::vector<uint8_t>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

void PutString(std::vector<uint8_t>& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void PadTo(std::vector<uint8_t>& out, uint64_t alignment) {
  out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
}

// splitmix64: the same stream on every platform, unlike <random>'s distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>(static_cast<double>(Next() >> 11) * 0x1.0p-52 - 1.0); }

 private:
  uint64_t state_;
};

std::vector<float> RandomValues(Rng& rng, uint64_t n, float center, float scale) {
  std::vector<float> v(n);
  for (float& x : v) x = center + scale * rng.Symmetric();
  return v;
}

// GPT-2's byte-to-unicode table (openai/gpt-2 encoder.py bytes_to_unicode):
// printable Latin-1 bytes map to themselves, the rest to U+0100 upwards.
std::vector<std::string> ByteTokens() {
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  std::vector<std::string> tokens(256);
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : 256u + next_extra++;
    std::string utf8;
    if (cp < 0x80) {
      utf8.push_back(static_cast<char>(cp));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    tokens[b] = utf8;
  }
  return tokens;
}

}  // namespace

uint16_t FloatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);  // NaN
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to inf
  if (abs < 0x38800000) {
    // Subnormal half (or zero): value / 2^-24, rounded to nearest even.
    float f;
    const uint32_t a = abs;
    std::memcpy(&f, &a, 4);
    const float scaled = f * 16777216.0f;  // exact: power of two
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to even.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

std::vector<uint8_t> QuantizeQ8_0(const std::vector<float>& values) {
  std::vector<uint8_t> out;
  out.reserve(values.size() / 32 * 34);
  for (size_t b = 0; b + 32 <= values.size(); b += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(values[b + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    Put<uint16_t>(out, FloatToHalf(d));
    for (int j = 0; j < 32; ++j) {
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::round(values[b + j] * id))));
    }
  }
  return out;
}

std::vector<uint8_t> QuantizeQ4_1(const std::vector<float>& values) {
  std::vector<uint8_t> out;
  out.reserve(values.size() / 32 * 20);
  for (size_t b = 0; b + 32 <= values.size(); b += 32) {
    float lo = values[b];
    float hi = values[b];
    for (int j = 1; j < 32; ++j) {
      lo = std::min(lo, values[b + j]);
      hi = std::max(hi, values[b + j]);
    }
    const float d = (hi - lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    Put<uint16_t>(out, FloatToHalf(d));
    Put<uint16_t>(out, FloatToHalf(lo));
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>((values[b + j] - lo) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((values[b + 16 + j] - lo) * id + 0.5f));
      out.push_back(static_cast<uint8_t>(q0 | (q1 << 4)));
    }
  }
  return out;
}

// ---- GgufWriter

void GgufWriter::AddKey(const std::string& key, uint32_t value_type) {
  PutString(kv_bytes_, key);
  Put<uint32_t>(kv_bytes_, value_type);
  ++num_kv_;
}

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  AddKey(key, kTypeString);
  PutString(kv_bytes_, value);
}

void GgufWriter::AddUInt32(const std::string& key, uint32_t value) {
  AddKey(key, kTypeUInt32);
  Put(kv_bytes_, value);
}

void GgufWriter::AddInt32(const std::string& key, int32_t value) {
  AddKey(key, kTypeInt32);
  Put(kv_bytes_, value);
}

void GgufWriter::AddUInt64(const std::string& key, uint64_t value) {
  AddKey(key, kTypeUInt64);
  Put(kv_bytes_, value);
}

void GgufWriter::AddFloat32(const std::string& key, float value) {
  AddKey(key, kTypeFloat32);
  Put(kv_bytes_, value);
}

void GgufWriter::AddBool(const std::string& key, bool value) {
  AddKey(key, kTypeBool);
  Put<uint8_t>(kv_bytes_, value ? 1 : 0);
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  AddKey(key, kTypeArray);
  Put<uint32_t>(kv_bytes_, kTypeString);
  Put<uint64_t>(kv_bytes_, values.size());
  for (const std::string& s : values) PutString(kv_bytes_, s);
}

void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  AddKey(key, kTypeArray);
  Put<uint32_t>(kv_bytes_, kTypeInt32);
  Put<uint64_t>(kv_bytes_, values.size());
  for (int32_t v : values) Put(kv_bytes_, v);
}

void GgufWriter::AddFloat32Array(const std::string& key, const std::vector<float>& values) {
  AddKey(key, kTypeArray);
  Put<uint32_t>(kv_bytes_, kTypeFloat32);
  Put<uint64_t>(kv_bytes_, values.size());
  for (float v : values) Put(kv_bytes_, v);
}

void GgufWriter::SetAlignment(uint32_t alignment) {
  alignment_ = alignment;
  AddUInt32("general.alignment", alignment);
}

Status GgufWriter::AddTensor(const std::string& name, const std::vector<uint64_t>& dims,
                             GgmlType type, const std::vector<float>& values) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  if (dims.empty() || n != values.size()) {
    return Status::InvalidArgument("tensor " + name + ": " + std::to_string(values.size()) +
                                   " values do not fill its shape");
  }
  Tensor t{name, dims, static_cast<uint32_t>(type), {}};
  switch (type) {
    case GgmlType::kF32:
      t.bytes.resize(n * 4);
      std::memcpy(t.bytes.data(), values.data(), n * 4);
      break;
    case GgmlType::kF16:
      for (float v : values) Put<uint16_t>(t.bytes, FloatToHalf(v));
      break;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_1:
      if (dims[0] % 32 != 0) {
        return Status::InvalidArgument("tensor " + name + ": row length " +
                                       std::to_string(dims[0]) + " is not a multiple of 32 for " +
                                       GgmlTypeName(type));
      }
      t.bytes = type == GgmlType::kQ8_0 ? QuantizeQ8_0(values) : QuantizeQ4_1(values);
      break;
    default:
      return Status::Unimplemented("GgufWriter cannot store " + GgmlTypeName(type));
  }
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

void GgufWriter::AddRawTensor(const std::string& name, const std::vector<uint64_t>& dims,
                              uint32_t type_value, std::vector<uint8_t> bytes) {
  tensors_.push_back(Tensor{name, dims, type_value, std::move(bytes)});
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out;
  Put<uint32_t>(out, 0x46554747);  // "GGUF"
  Put<uint32_t>(out, 3);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, num_kv_);
  out.insert(out.end(), kv_bytes_.begin(), kv_bytes_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) Put<uint64_t>(out, d);
    Put<uint32_t>(out, t.type);
    Put<uint64_t>(out, offset);
    offset = (offset + t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  PadTo(out, alignment_);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    PadTo(out, alignment_);
  }
  return out;
}

Status GgufWriter::WriteFile(const std::string& path) const {
  std::vector<uint8_t> bytes = Serialize();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return Status::Internal("cannot write GGUF file " + path);
  return Status::Ok();
}

// ---- tiny llama

Status WriteTinyLlama(const std::string& path, const TinyLlamaOptions& o) {
  if (o.num_layers <= 0 || o.hidden_size <= 0 || o.num_heads <= 0 || o.num_kv_heads <= 0 ||
      o.intermediate_size <= 0 || o.vocab_size <= 0) {
    return Status::InvalidArgument("tiny llama: every size must be positive");
  }
  const int head_dim = o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
  const uint64_t hidden = o.hidden_size;
  const uint64_t q_dim = static_cast<uint64_t>(o.num_heads) * head_dim;
  const uint64_t kv_dim = static_cast<uint64_t>(o.num_kv_heads) * head_dim;
  const uint64_t ffn = o.intermediate_size;
  const uint64_t vocab = o.vocab_size;

  const std::string& a = o.architecture;
  if (a != "llama" && a != "gemma3") {
    return Status::InvalidArgument("tiny model: architecture must be llama or gemma3");
  }
  if (a == "gemma3" && o.sliding_window <= 0) {
    return Status::InvalidArgument("tiny gemma3: sliding_window must be positive");
  }
  GgufWriter w;
  w.AddString("general.architecture", a);
  w.AddString("general.name", o.name);
  w.AddUInt32(a + ".block_count", o.num_layers);
  w.AddUInt32(a + ".context_length", o.context_length);
  w.AddUInt32(a + ".embedding_length", o.hidden_size);
  w.AddUInt32(a + ".feed_forward_length", o.intermediate_size);
  w.AddUInt32(a + ".attention.head_count", o.num_heads);
  w.AddUInt32(a + ".attention.head_count_kv", o.num_kv_heads);
  w.AddFloat32(a + ".rope.freq_base", o.rope_freq_base);
  w.AddFloat32(a + ".attention.layer_norm_rms_epsilon", o.rms_norm_eps);
  w.AddUInt32(a + ".vocab_size", o.vocab_size);
  w.AddUInt32(a + ".rope.dimension_count", head_dim);
  if (o.head_dim > 0) {
    w.AddUInt32(a + ".attention.key_length", head_dim);
    w.AddUInt32(a + ".attention.value_length", head_dim);
  }
  if (a == "gemma3") w.AddUInt32(a + ".attention.sliding_window", o.sliding_window);

  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (const std::string& t : ByteTokens()) tokens.push_back(t);
  for (uint64_t i = tokens.size(); i < vocab; ++i) tokens.push_back("tok" + std::to_string(i));
  tokens.resize(vocab);
  std::vector<int32_t> token_types(vocab, 1);  // 1 = normal
  for (uint64_t i = 0; i < std::min<uint64_t>(3, vocab); ++i) token_types[i] = 3;  // control
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "smollm");
  w.AddStringArray("tokenizer.ggml.tokens", tokens);
  w.AddInt32Array("tokenizer.ggml.token_type", token_types);
  w.AddStringArray("tokenizer.ggml.merges", {});
  w.AddUInt32("tokenizer.ggml.bos_token_id", 1);
  w.AddUInt32("tokenizer.ggml.eos_token_id", 2);
  w.AddString("tokenizer.chat_template",
              "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
              "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}");

  Rng rng(o.seed);
  const float s = o.weight_scale;
  auto matrix = [&](const std::string& name, uint64_t cols, uint64_t rows, GgmlType type) {
    return w.AddTensor(name, {cols, rows}, type, RandomValues(rng, cols * rows, 0.0f, s));
  };
  auto norm = [&](const std::string& name, uint64_t size) {
    return w.AddTensor(name, {size}, GgmlType::kF32, RandomValues(rng, size, 1.0f, 0.1f));
  };

  HW_RETURN_IF_ERROR(matrix("token_embd.weight", hidden, vocab, o.embedding_type));
  for (int l = 0; l < o.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    HW_RETURN_IF_ERROR(norm(p + "attn_norm.weight", hidden));
    if (a == "gemma3") {
      HW_RETURN_IF_ERROR(norm(p + "attn_q_norm.weight", uint64_t(head_dim)));
      HW_RETURN_IF_ERROR(norm(p + "attn_k_norm.weight", uint64_t(head_dim)));
      HW_RETURN_IF_ERROR(norm(p + "post_attention_norm.weight", hidden));
      HW_RETURN_IF_ERROR(norm(p + "post_ffw_norm.weight", hidden));
    }
    HW_RETURN_IF_ERROR(matrix(p + "attn_q.weight", hidden, q_dim, o.matrix_type));
    HW_RETURN_IF_ERROR(matrix(p + "attn_k.weight", hidden, kv_dim, o.matrix_type));
    HW_RETURN_IF_ERROR(matrix(p + "attn_v.weight", hidden, kv_dim, o.matrix_type));
    HW_RETURN_IF_ERROR(matrix(p + "attn_output.weight", q_dim, hidden, o.matrix_type));
    HW_RETURN_IF_ERROR(norm(p + "ffn_norm.weight", hidden));
    HW_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", hidden, ffn, o.matrix_type));
    HW_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", hidden, ffn, o.matrix_type));
    HW_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", ffn, hidden, o.matrix_type));
  }
  HW_RETURN_IF_ERROR(norm("output_norm.weight", hidden));
  if (!o.tied_embeddings) {
    HW_RETURN_IF_ERROR(matrix("output.weight", hidden, vocab, o.embedding_type));
  }
  return w.WriteFile(path);
}

Status SetUInt32Key(const std::string& path, const std::string& key, uint32_t value) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::Internal("cannot read " + path);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // A key is stored as its u64 length then its bytes; the u32 value type
  // and the value follow.
  std::string stored(8, '\0');
  const uint64_t length = key.size();
  std::memcpy(stored.data(), &length, 8);
  stored += key;
  const size_t at = bytes.find(stored);
  if (at == std::string::npos) return Status::NotFound("no key " + key + " in " + path);
  const size_t type_at = at + stored.size();
  uint32_t type = 0;
  if (type_at + 8 > bytes.size()) return Status::InvalidArgument(key + " has no value");
  std::memcpy(&type, bytes.data() + type_at, 4);
  if (type != kTypeUInt32) {
    return Status::InvalidArgument(key + " is not a u32 (type " + std::to_string(type) + ")");
  }
  std::memcpy(bytes.data() + type_at + 4, &value, 4);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) return Status::Internal("cannot write " + path);
  return Status::Ok();
}

}  // namespace headway::testing
