// The sequences a randomized KvCacheManager test drives (kv_recycling_test,
// kv_mixed_dtypes_test): each starts from a prompt of one of three token
// families, so that later starts hit what earlier ones cached; it grows by
// recycling the blocks its windows left and then appending 1 to 24
// positions, each computed block cached; and it is released. The caller
// checks the manager between the operations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "coordinator/scheduling/kv_cache_manager.h"

namespace headway::testing {

// `n` token ids of family `family`: (i * 31 + family * 7) mod 997.
inline std::vector<int32_t> FamilyTokens(int n, int family) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 31 + family * 7) % 997;
  return t;
}

class RandomSequences {
 public:
  struct Live {
    std::vector<int32_t> tokens;
    int64_t computed = 0;  // positions whose K/V the sequence holds
  };

  // With `footprints`, starts pass the prompt length as the sequence's total
  // positions (admission that reserves a whole footprint); without, they
  // leave it to the manager's default.
  RandomSequences(KvCacheManager* kv, std::mt19937* rng, bool footprints)
      : kv_(kv), rng_(rng), footprints_(footprints) {}

  const std::map<uint64_t, Live>& live() const { return seqs_; }
  size_t size() const { return seqs_.size(); }
  bool empty() const { return seqs_.empty(); }

  // Starts a sequence of 40 to 239 tokens of a random family with a first
  // chunk of up to 40 positions past what its prefix hit. Returns the
  // positions the hit covered, or -1 when the chunk did not fit.
  int64_t TryStart() {
    Live s;
    s.tokens = FamilyTokens(40 + int((*rng_)() % 200), int((*rng_)() % 3));
    const TokenIds ids{s.tokens, {}};
    const int64_t total = int64_t(s.tokens.size());
    PrefixMatch m = kv_->MatchPrefix(ids, total - 1);
    const int64_t chunk = std::min<int64_t>(total, m.num_positions + 1 + (*rng_)() % 40);
    const bool fits = footprints_ ? kv_->CanStart(m, chunk, -1, total) : kv_->CanStart(m, chunk);
    if (!fits) return -1;
    const uint64_t id = next_id_++;
    if (footprints_) {
      (void)kv_->Start(id, m, chunk, -1, total);
    } else {
      (void)kv_->Start(id, m, chunk);
    }
    s.computed = chunk;
    kv_->CacheComputedBlocks(id, ids, chunk);
    seqs_[id] = std::move(s);
    return m.num_positions;
  }

  // Recycles what a random sequence's windows left behind; returns its id.
  // REQUIRES: !empty().
  uint64_t RecycleOne() {
    auto it = Pick();
    (void)kv_->Recycle(it->first, it->second.computed);
    return it->first;
  }

  // Appends 1 to 24 positions to sequence `id` (new tokens are random) and
  // caches its computed blocks; false when they did not fit.
  bool TryAppend(uint64_t id) {
    Live& s = seqs_.at(id);
    const int64_t end = s.computed + 1 + int64_t((*rng_)() % 24);
    if (int64_t(s.tokens.size()) < end) s.tokens.resize(size_t(end), int32_t((*rng_)() % 997));
    if (!kv_->CanAppend(id, end)) return false;
    (void)kv_->Append(id, end);
    s.computed = end;
    kv_->CacheComputedBlocks(id, TokenIds{s.tokens, {}}, end);
    return true;
  }

  // Releases a random sequence. REQUIRES: !empty().
  void ReleaseOne() {
    auto it = Pick();
    kv_->Release(it->first);
    seqs_.erase(it);
  }

  void ReleaseAll() {
    for (const auto& [id, s] : seqs_) kv_->Release(id);
    seqs_.clear();
  }

 private:
  std::map<uint64_t, Live>::iterator Pick() {
    auto it = seqs_.begin();
    std::advance(it, (*rng_)() % seqs_.size());
    return it;
  }

  KvCacheManager* const kv_;
  std::mt19937* const rng_;
  const bool footprints_;
  std::map<uint64_t, Live> seqs_;
  uint64_t next_id_ = 1;
};

}  // namespace headway::testing
