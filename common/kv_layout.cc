#include "common/kv_layout.h"

namespace headway {

const char* KvCacheDtypeName(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kFloat32: return "float32";
    case KvCacheDtype::kFloat16: return "float16";
    case KvCacheDtype::kQ8_0: return "q8_0";
    case KvCacheDtype::kQ4_0: return "q4_0";
    case KvCacheDtype::kQ4_0Hadamard: return "q4_0_hadamard";
  }
  return "?";
}

std::optional<KvCacheDtype> ParseKvCacheDtype(const std::string& name) {
  for (KvCacheDtype d : {KvCacheDtype::kFloat32, KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0,
                         KvCacheDtype::kQ4_0, KvCacheDtype::kQ4_0Hadamard}) {
    if (name == KvCacheDtypeName(d)) return d;
  }
  return std::nullopt;
}

const char* KvCacheDtypeNames() { return "float32, float16, q8_0, q4_0, q4_0_hadamard"; }

int KvCacheDtypeGroup(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kFloat32 || dtype == KvCacheDtype::kFloat16 ? 1 : 32;
}

size_t KvCacheLayout::RowBytes() const {
  const size_t n = size_t(head_dim);
  switch (dtype) {
    case KvCacheDtype::kFloat32: return n * 4;
    case KvCacheDtype::kFloat16: return n * 2;
    case KvCacheDtype::kQ8_0: return n / 32 * 34;
    case KvCacheDtype::kQ4_0:
    case KvCacheDtype::kQ4_0Hadamard: return n / 32 * 18;
  }
  return 0;
}

std::string KvCacheLayout::Check() const {
  if (block_size <= 0 || head_dim <= 0) {
    return "block_size (" + std::to_string(block_size) + ") and head_dim (" +
           std::to_string(head_dim) + ") must be positive";
  }
  const int group = KvCacheDtypeGroup(dtype);
  if (head_dim % group != 0) {
    return std::string("cache.kv_cache_dtype ") + KvCacheDtypeName(dtype) + " stores groups of " +
           std::to_string(group) + " values, but the model's head_dim " +
           std::to_string(head_dim) + " is not a multiple of " + std::to_string(group) +
           "; use float32 or float16";
  }
  return "";
}

}  // namespace headway
