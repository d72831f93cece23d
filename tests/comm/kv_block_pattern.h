// Pools of recognisable bytes for KV transfer tests (host and GPU): every
// byte depends on its block, its offset and the pool's seed, so a block
// that lands in the wrong place, or a part of one, shows.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/kv_transfer.h"

namespace headway::testing {

// 96 KiB blocks: a run of blocks splits into 256 KiB messages that start
// and end inside blocks, and a long run needs more messages than the agent
// has staging buffers (8).
constexpr uint64_t kPatternBlockBytes = 96 * 1024;
constexpr uint32_t kPatternNumBlocks = 48;
constexpr uint64_t kPatternPoolBytes = kPatternBlockBytes * kPatternNumBlocks;

inline std::vector<uint8_t> MakePattern(uint8_t seed) {
  std::vector<uint8_t> pool(kPatternPoolBytes);
  for (uint64_t i = 0; i < kPatternPoolBytes; ++i) {
    const uint64_t block = i / kPatternBlockBytes, offset = i % kPatternBlockBytes;
    pool[i] = static_cast<uint8_t>(block * 131u + offset * 7u + (offset >> 8) * 3u + seed);
  }
  return pool;
}

// A run of 20 blocks (1,920 KiB: 8 messages when coalesced, more than the
// staging buffers), shorter runs, single blocks and the last block.
inline std::vector<BlockCopy> PatternCopies() {
  std::vector<BlockCopy> copies;
  for (uint32_t i = 0; i < 20; ++i) copies.push_back({2 + i, 25 + i});
  for (const BlockCopy& c : std::vector<BlockCopy>{{30, 0}, {31, 1}, {32, 2}, {40, 10},
                                                   {47, 47}, {0, 20}, {45, 46}}) {
    copies.push_back(c);
  }
  return copies;
}

// Every byte of `got` (a destination pool that started as
// MakePattern(dst_seed)) is `src`'s per `copies`, else its own pattern.
inline void ExpectCopied(const std::vector<uint8_t>& src, const std::vector<uint8_t>& got,
                         const std::vector<BlockCopy>& copies, uint8_t dst_seed) {
  std::vector<uint8_t> want = MakePattern(dst_seed);
  for (const BlockCopy& c : copies) {
    std::memcpy(&want[c.dst * kPatternBlockBytes], &src[c.src * kPatternBlockBytes],
                kPatternBlockBytes);
  }
  ASSERT_EQ(got.size(), want.size());
  for (uint32_t b = 0; b < kPatternNumBlocks; ++b) {
    uint64_t mismatches = 0, first = 0;
    for (uint64_t i = 0; i < kPatternBlockBytes; ++i) {
      const uint64_t at = b * kPatternBlockBytes + i;
      if (got[at] != want[at] && mismatches++ == 0) first = i;
    }
    EXPECT_EQ(mismatches, 0u) << "destination block " << b << ", first bad byte " << first;
  }
}

}  // namespace headway::testing
