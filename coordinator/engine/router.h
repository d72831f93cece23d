// Where a request runs: which accepting instance (ready, not draining) of a
// pool takes it, by the policy of config key routing.policy.
//
//   least_loaded   the fewest waiting + running sequences.
//   round_robin    the pool's accepting instances in turn, by instance id.
//   prefix_aware   the least cost, in tokens, of
//
//                    cost(i) = w * (n - hit(i)) + queued(i) + active(i)
//
//     n          positions of the request to place: its prompt, or the
//                whole blocks a prefill job computes;
//     hit(i)     the first of those that instance i's prefix cache holds
//                now (KvCacheManager::MatchPrefix). Exact, not estimated:
//                the coordinator allocates every block of every instance;
//     queued(i)  prompt tokens queued on i and not yet computed
//                (SchedulerLoad::queued_prefill_tokens);
//     active(i)  KV positions i's running sequences hold, the context its
//                decode steps attend over (SchedulerLoad::active_tokens);
//     w          routing.prefix_weight.
//
//   The first term is the prefill this request adds on i, the others the
//   load i already has. This is the cost of Dynamo's KV router ("overlap
//   score weight" x potential prefill blocks + potential decode blocks;
//   docs.nvidia.com/dynamo, Router Design), counted in tokens and with an
//   exact hit. Queued prompt tokens are load, weighed like active ones: with
//   w on them too, a few hundred queued tokens outweighed a conversation's
//   history and sent its turn to an instance that had to rebuild it
//   (bench/README.md, conversation_bench: hit rate 0.92-0.98 of the
//   oracle's with this cost, 0.85-0.91 with that one). SGLang's cache-aware
//   router gets the same balance from thresholds instead (route to the best
//   match unless the load is imbalanced past balance_abs/rel_threshold);
//   llm-d's precise prefix-cache scorer adds the resident-block fraction to
//   load scorers with weights.
//   w = 0 routes by load alone; a larger w keeps a conversation on the
//   instance holding its earlier turns under more imbalance: at w = 8 a
//   turn of 500 cached tokens moves only when its instance holds 4,000
//   more queued and active tokens than another.
//
//   Load-balance guard (config keys routing.balance_abs_threshold and
//   routing.balance_rel_threshold; SGLang's cache-aware router has the same
//   two thresholds): while the pool is imbalanced, the busiest accepting
//   instance holding more than `abs` sequences (running + waiting) over the
//   least busy one and more than `rel` times as many, prefix_aware routes
//   as least_loaded does, whatever the hits. It keeps a sticky weight from
//   piling sessions on one instance (bench/README.md, conversation_bench).
//
// Ties go to the fewer sequences, then the lower instance id, so a policy
// decides the same way for the same state.
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/config.h"
#include "coordinator/engine/instance_registry.h"

namespace headway {

enum class RoutingPolicy { kLeastLoaded, kPrefixAware, kRoundRobin };

// Parses config key routing.policy ("least_loaded", "prefix_aware",
// "round_robin"); nullopt for anything else (ValidateConfig refuses it).
std::optional<RoutingPolicy> ParseRoutingPolicy(const std::string& name);
const char* RoutingPolicyName(RoutingPolicy policy);

// True when the deployment has a prefill pool (and so a decode pool):
// requests are prefilled on one instance and decoded on another.
bool Disaggregated(const InstanceRegistry& registry);

// The accepting instance of pool role `role` with the fewest waiting +
// running sequences (the lowest id of equals); nullptr if none. Failover
// (moving a request off an instance that went down) uses it whatever the
// policy: the request's prefix went with the instance.
Instance* LeastLoaded(InstanceRegistry& registry, PoolRole role);

// A routing decision: the instance, and what it already holds of the
// request (0 when the policy does not look).
struct Route {
  Instance* instance = nullptr;  // nullptr: no accepting instance in the pool
  int64_t hit_positions = 0;     // of the n positions asked about
};

// prefix_aware's load-balance guard (above). The default never triggers.
struct BalanceGuard {
  int abs_threshold = -1;     // sequences; < 0: no guard
  double rel_threshold = 1.0;  // >= 1

  // Whether a pool whose accepting instances hold `least` and `most`
  // sequences is imbalanced.
  bool Imbalanced(size_t least, size_t most) const {
    return abs_threshold >= 0 && double(most) - double(least) > double(abs_threshold) &&
           double(most) > rel_threshold * double(least);
  }
};

class Router {
 public:
  // `prefix_weight` is w above, >= 0.
  Router(RoutingPolicy policy, double prefix_weight, BalanceGuard guard = {});
  // From config keys routing.policy, routing.prefix_weight and
  // routing.balance_{abs,rel}_threshold.
  // REQUIRES: ValidateConfig(config).ok().
  explicit Router(const Config& config);

  RoutingPolicy policy() const { return policy_; }

  // The instance of pool role `role` that takes a request whose first
  // `num_positions` positions of `prompt` are to be computed there (or
  // received there: a decode instance after a prefill job).
  // REQUIRES: 0 <= num_positions <= the prompt's length.
  Route Pick(InstanceRegistry& registry, PoolRole role, const TokenIds& prompt,
             int64_t num_positions);

 private:
  // Whether the guard applies to pool role `role` now.
  bool PoolImbalanced(InstanceRegistry& registry, PoolRole role) const;

  RoutingPolicy policy_;
  double prefix_weight_;
  BalanceGuard guard_;
  // round_robin: per pool role, the id of the instance that took the last
  // request; the next goes to the first accepting instance after it.
  std::map<PoolRole, int> last_;
};

}  // namespace headway
