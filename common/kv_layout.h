// What a KV block is, byte for byte, and what attention a slot applies: the
// facts the coordinator (allocation, transfer planning, registration), the
// worker (pools, transfer) and the kernels must agree on. Kernel argument
// views over a batch (BatchLayout, LayerBlockTable) are kernels/kv_cache.h's.
//
// A rank's KV pool is one byte arena (common/kv_arena.h; host or device),
// and a block of a slot whose dtype is d, id b, is at pool + b * BlockBytes():
//   block b: K rows [block_size] | V rows [block_size]
// (one dtype: an array of equal blocks). Row p of K (of V) holds the key (value) vector
// of position p of the block, head_dim values encoded in the slot's KV cache
// dtype (cache.kv_cache_dtype, or cache.kv_cache_dtype_sliding), little-endian:
//   float32  head_dim x IEEE 754 binary32                   4 bytes a value
//   float16  head_dim x IEEE 754 binary16 (round to nearest even)
//                                                           2 bytes a value
//   q8_0     head_dim / 32 groups, each llama.cpp's block_q8_0:
//              f16 d | int8 q[32]          value i = d * q[i]
//              d = max|x| / 127 (x: the group's 32 values, f32), id = 1 / d
//              (0 when d = 0), q[i] = x[i] * id rounded to nearest even
//              (f32 product, then the rounding); d is stored rounded to f16
//                                                           34 bytes / 32 values
//   q4_0     head_dim / 32 groups, each llama.cpp's block_q4_0:
//              f16 d | uint8 qs[16]        value i = d * (nibble_i - 8),
//              nibble_i = qs[i] & 15 for i < 16, qs[i - 16] >> 4 otherwise;
//              d = m / -8 where m is the group's first value of largest
//              magnitude, id = 1 / d (0 when d = 0), nibble = min(15,
//              floor(fma(x, id, 8.5))), one rounding for x * id + 8.5
//                                                          18 bytes / 32 values
//   q4_0_hadamard  q4_0 of each group of 32 values rotated first:
//              y = H x / sqrt(32), H the 32 x 32 Sylvester Walsh-Hadamard
//              matrix, in f32 as 5 butterfly stages (stage s = 0..4 replaces
//              y[i], y[i + 2^s] by their sum and difference for every i
//              whose bit s is clear), each value then multiplied by
//              1/sqrt(32) rounded to f32. H H = 32 I, so readers rotate back
//              the same way, and q . k = (Hq/sqrt(32)) . (Hk/sqrt(32)): the
//              CPU attention rotates queries instead of keys, and its
//              outputs back. A channel far larger than its 31 neighbours
//              then spreads over the group instead of setting the step that
//              rounds them to zero (QuaRot, Ashkboos et al. 2024, rotates
//              K and V for the same reason)                18 bytes / 32 values
// (ggml-common.h defines block_q8_0 and block_q4_0; ggml-quants.c's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref quantize them: q8_0 here
// rounds ties to even, as ggml's AVX2 path does, where its scalar path
// rounds them away from zero, and q4_0 fuses x * id + 8.5, where ggml rounds
// the product first.) Rows holding NaN or infinity are not specified. A block carries its own scales, so it is
// recycled, cached and transferred as one unit.
//
// Any slot (layer, local KV head) can take any block. Logical block i of a
// slot covers positions [i*block_size, (i+1)*block_size); its block id comes
// from the slot's row of the head-wise block table, where -1 means "no
// block" (recycled out of a sliding window).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace headway {

// Version of the block byte layout above. KV transfer refuses to pair ranks
// whose versions differ (their blocks would be misread): bump it whenever the
// layout of a block changes. 2: blocks are bytes in a KV cache dtype (1 was
// f32 only).
constexpr uint32_t kKvBlockLayoutVersion = 2;

// How a K or V value is stored (cache.kv_cache_dtype).
enum class KvCacheDtype : uint8_t { kFloat32, kFloat16, kQ8_0, kQ4_0, kQ4_0Hadamard };

// "float32", "float16", "q8_0", "q4_0", "q4_0_hadamard": the config's and the
// wire's names.
const char* KvCacheDtypeName(KvCacheDtype dtype);
// The dtype named `name` (as KvCacheDtypeName writes it); nullopt otherwise.
std::optional<KvCacheDtype> ParseKvCacheDtype(const std::string& name);
// "float32, float16, q8_0, q4_0, q4_0_hadamard": for error messages.
const char* KvCacheDtypeNames();

// Values that share one scale: 32 for the q types, 1 for the float types.
// head_dim must be a multiple of it (KvCacheLayout::Check).
int KvCacheDtypeGroup(KvCacheDtype dtype);

// Whether the dtype stores each group of 32 values rotated (q4_0_hadamard).
inline bool KvCacheDtypeIsRotated(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kQ4_0Hadamard;
}

// The shape of one block. Sizes are bytes unless named otherwise.
struct KvCacheLayout {
  int block_size = 16;  // positions per block
  int head_dim = 64;    // values per head vector
  KvCacheDtype dtype = KvCacheDtype::kFloat32;

  // Bytes of one K (or V) row: head_dim values in `dtype`, scales included.
  size_t RowBytes() const;
  // Bytes of one block: K and V, block_size rows each.
  size_t BlockBytes() const { return size_t(2) * block_size * RowBytes(); }
  // Byte offset of K and V of `pos_in_block` inside a block.
  // REQUIRES: 0 <= pos_in_block < block_size.
  size_t KOffset(int pos_in_block) const { return size_t(pos_in_block) * RowBytes(); }
  size_t VOffset(int pos_in_block) const {
    return (size_t(block_size) + size_t(pos_in_block)) * RowBytes();
  }

  // Empty when the layout can be built: block_size and head_dim positive,
  // head_dim a multiple of the dtype's group. Otherwise why not, naming
  // cache.kv_cache_dtype, the dtype and head_dim.
  std::string Check() const;
};

// Attention spec of one slot. window == 0: full causal attention. Otherwise
// sliding: a query at position p sees keys k <= p with k > p - window or
// k < sink (DESIGN.md "Attention spec").
struct SlotSpec {
  int32_t window = 0;  // positions; 0 = full attention
  int32_t sink = 0;    // leading positions every query sees; used only when sliding

  bool IsSliding() const { return window > 0; }
  // Whether a query at `query_pos` attends to the key at `key_pos`.
  bool Sees(int64_t query_pos, int64_t key_pos) const {
    if (key_pos > query_pos) return false;
    if (window <= 0) return true;
    return key_pos > query_pos - window || key_pos < sink;
  }
};

}  // namespace headway
