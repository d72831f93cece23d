#include "coordinator/engine/router.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "common/status.h"

namespace headway {

std::optional<RoutingPolicy> ParseRoutingPolicy(const std::string& name) {
  if (name == "least_loaded") return RoutingPolicy::kLeastLoaded;
  if (name == "prefix_aware") return RoutingPolicy::kPrefixAware;
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  return std::nullopt;
}

const char* RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kLeastLoaded: return "least_loaded";
    case RoutingPolicy::kPrefixAware: return "prefix_aware";
    case RoutingPolicy::kRoundRobin: return "round_robin";
  }
  return "unknown";
}

bool Disaggregated(const InstanceRegistry& registry) {
  return std::any_of(registry.instances().begin(), registry.instances().end(),
                     [](const Instance& i) { return i.role == PoolRole::kPrefill; });
}

Instance* LeastLoaded(InstanceRegistry& registry, PoolRole role) {
  Instance* best = nullptr;
  for (Instance& inst : registry.instances()) {
    if (!inst.accepting() || inst.role != role) continue;
    if (best == nullptr || inst.load() < best->load()) best = &inst;
  }
  return best;
}

Router::Router(RoutingPolicy policy, double prefix_weight, BalanceGuard guard)
    : policy_(policy), prefix_weight_(prefix_weight), guard_(guard) {
  HW_CHECK(prefix_weight >= 0.0);
  HW_CHECK(guard.rel_threshold >= 1.0);
}

Router::Router(const Config& config)
    : Router(ParseRoutingPolicy(config.routing_policy).value_or(RoutingPolicy::kPrefixAware),
             config.routing_prefix_weight,
             BalanceGuard{config.routing_balance_abs_threshold,
                          config.routing_balance_rel_threshold}) {}

bool Router::PoolImbalanced(InstanceRegistry& registry, PoolRole role) const {
  if (guard_.abs_threshold < 0) return false;
  size_t least = std::numeric_limits<size_t>::max(), most = 0;
  for (Instance& inst : registry.instances()) {
    if (!inst.accepting() || inst.role != role) continue;
    least = std::min(least, inst.load());
    most = std::max(most, inst.load());
  }
  return most > 0 && guard_.Imbalanced(least, most);
}

Route Router::Pick(InstanceRegistry& registry, PoolRole role, const TokenIds& prompt,
                   int64_t num_positions) {
  Route route;
  switch (policy_) {
    case RoutingPolicy::kLeastLoaded:
      route.instance = LeastLoaded(registry, role);
      break;
    case RoutingPolicy::kRoundRobin: {
      auto last = last_.find(role);
      Instance* first = nullptr;
      for (Instance& inst : registry.instances()) {
        if (!inst.accepting() || inst.role != role) continue;
        if (first == nullptr) first = &inst;
        if (last == last_.end() || inst.id > last->second) {
          route.instance = &inst;
          break;
        }
      }
      if (route.instance == nullptr) route.instance = first;  // wrap around
      if (route.instance != nullptr) last_[role] = route.instance->id;
      break;
    }
    case RoutingPolicy::kPrefixAware: {
      if (PoolImbalanced(registry, role)) {
        route.instance = LeastLoaded(registry, role);
        break;
      }
      // (cost, sequences, id): the least wins.
      std::tuple<double, size_t, int> best{std::numeric_limits<double>::infinity(), 0, 0};
      for (Instance& inst : registry.instances()) {
        if (!inst.accepting() || inst.role != role) continue;
        const int64_t hit = inst.scheduler->kv().MatchPrefix(prompt, num_positions).num_positions;
        const SchedulerLoad load = inst.scheduler->Load();
        const double cost =
            prefix_weight_ * double(num_positions - hit) +
            double(load.queued_prefill_tokens + load.active_tokens);
        const std::tuple<double, size_t, int> key{cost, load.num_running + load.num_waiting,
                                                  inst.id};
        if (route.instance == nullptr || key < best) {
          best = key;
          route.instance = &inst;
          route.hit_positions = hit;
        }
      }
      return route;
    }
  }
  if (route.instance != nullptr && num_positions > 0) {
    route.hit_positions =
        route.instance->scheduler->kv().MatchPrefix(prompt, num_positions).num_positions;
  }
  return route;
}

}  // namespace headway
