// Write grants for KV transfer tests, made as the coordinator makes them
// (comm/kv_write_auth.h): the test plays the coordinator that holds the
// receiver's write key.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/kv_transfer.h"
#include "comm/kv_write_auth.h"

namespace headway::testing {

// Lifetime of test grants: longer than any test, so nothing expires unless
// a test says so.
constexpr uint32_t kTestGrantLifetimeMs = 10 * 60 * 1000;

// A transfer id no earlier grant of this process used (ids increase, as the
// coordinator's do).
inline uint64_t NextTestTransferId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

// A grant under the receiver's `write_key` for the destinations of
// `copies`, under a fresh transfer id.
inline KvWriteGrant Grant(const std::string& write_key, const std::vector<BlockCopy>& copies,
                          uint32_t lifetime_ms = kTestGrantLifetimeMs) {
  std::vector<uint32_t> dst;
  for (const BlockCopy& c : copies) dst.push_back(c.dst);
  Result<KvWriteGrant> grant = GrantKvWrites(write_key, NextTestTransferId(), lifetime_ms, dst);
  EXPECT_TRUE(grant.ok()) << grant.status().ToString();
  return grant.ok() ? *grant : KvWriteGrant{};
}

}  // namespace headway::testing
