// The routing policies (coordinator/engine/router.h) on instances
// registered by hand: exact prefix hits, ties, load overriding a hit,
// instances going down, draining and joining, round robin.
#include "coordinator/engine/router.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "tests/coordinator/fake_instances.h"
#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeControlServer;
using testing::FakeLlamaSpec;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(size_t(n), 0);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `num_instances` mixed instances (ids 0..n-1, TP 1), all registered.
class RouterTest : public ::testing::Test {
 protected:
  void Start(int num_instances) {
    spec_ = FakeLlamaSpec();
    config_.block_size = kBlockSize;
    PoolConfig pool;
    pool.name = "main";
    pool.role = PoolRole::kMixed;
    pool.instances.assign(size_t(num_instances), InstanceConfig{});
    config_.pools = {pool};
    Result<std::unique_ptr<ServingMetrics>> m =
        ServingMetrics::Create("fake", std::vector<int>(size_t(num_instances), 1));
    ASSERT_TRUE(m.ok());
    metrics_ = std::move(*m);
    registry_ = std::make_unique<InstanceRegistry>(config_, spec_, &server_, metrics_.get());
    ASSERT_TRUE(testing::RegisterAll(*registry_, config_, spec_, kNumBlocks));
  }

  Instance& at(int id) { return registry_->at(id); }

  std::unique_ptr<Sequence> NewSequence(uint64_t id, std::vector<int32_t> prompt) {
    StopConditions stop;
    stop.max_tokens = 8;
    stop.max_model_len = 4096;
    return std::make_unique<Sequence>(id, std::move(prompt), SamplingOptions{}, stop,
                                      Clock::now());
  }

  // Computes `prompt` on instance `id` and ends the sequence: its whole
  // blocks stay in the instance's prefix cache.
  void Cache(int id, const std::vector<int32_t>& prompt) {
    const uint64_t seq_id = next_seq_id_++;
    Run(id, seq_id, prompt);
    ASSERT_NE(at(id).scheduler->Remove(seq_id), nullptr);
  }

  // Computes `prompt` on instance `id` and keeps the sequence running.
  void Run(int id, uint64_t seq_id, const std::vector<int32_t>& prompt) {
    Scheduler& s = *at(id).scheduler;
    ASSERT_TRUE(s.Add(NewSequence(seq_id, prompt)).ok());
    for (int step = 0; step < 100 && s.Find(seq_id)->num_uncomputed() > 0; ++step) {
      s.OnStepComputed(s.Schedule());
      if (s.Find(seq_id)->num_uncomputed() == 0) break;
    }
  }

  // Queues a sequence on instance `id` without scheduling it.
  void Queue(int id, int prompt_tokens) {
    ASSERT_TRUE(
        at(id).scheduler->Add(NewSequence(next_seq_id_++, Tokens(prompt_tokens, 5000))).ok());
  }

  Route Pick(Router& router, const std::vector<int32_t>& prompt) {
    return router.Pick(*registry_, PoolRole::kMixed, TokenIds{prompt, {}}, int64_t(prompt.size()));
  }

  ModelSpec spec_;
  Config config_;
  FakeControlServer server_;
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<InstanceRegistry> registry_;
  uint64_t next_seq_id_ = 1;
};

TEST(RoutingPolicyTest, NamesRoundTrip) {
  for (RoutingPolicy p :
       {RoutingPolicy::kLeastLoaded, RoutingPolicy::kPrefixAware, RoutingPolicy::kRoundRobin}) {
    EXPECT_EQ(ParseRoutingPolicy(RoutingPolicyName(p)), p);
  }
  EXPECT_FALSE(ParseRoutingPolicy("cache_aware").has_value());
  // The names ValidateConfig accepts are exactly the ones parsed here.
  std::set<std::string> named;
  for (RoutingPolicy p :
       {RoutingPolicy::kLeastLoaded, RoutingPolicy::kPrefixAware, RoutingPolicy::kRoundRobin}) {
    named.insert(RoutingPolicyName(p));
  }
  EXPECT_EQ(named, std::set<std::string>(kRoutingPolicyNames.begin(), kRoutingPolicyNames.end()));
  EXPECT_EQ(Router(Config{}).policy(), RoutingPolicy::kPrefixAware);  // the default
}

TEST_F(RouterTest, ExactHitWinsAndIsReported) {
  Start(3);
  const std::vector<int32_t> turn1 = Tokens(100, 1);  // 6 whole blocks
  Cache(2, turn1);
  const std::vector<int32_t> turn2 = Concat(turn1, Tokens(40, 900));
  Router aware(RoutingPolicy::kPrefixAware, 1.0);
  Route r = Pick(aware, turn2);
  ASSERT_NE(r.instance, nullptr);
  EXPECT_EQ(r.instance->id, 2);
  EXPECT_EQ(r.hit_positions, 96);
  // Least loaded ignores the hit (all idle: the lowest id), but reports it.
  Router least(RoutingPolicy::kLeastLoaded, 1.0);
  r = Pick(least, turn2);
  EXPECT_EQ(r.instance->id, 0);
  EXPECT_EQ(r.hit_positions, 0);
}

TEST_F(RouterTest, LongerHitBeatsShorterHit) {
  Start(2);
  const std::vector<int32_t> base = Tokens(64, 1);
  Cache(0, base);                                // 4 blocks
  Cache(1, Concat(base, Tokens(64, 700)));       // 8 blocks
  Router aware(RoutingPolicy::kPrefixAware, 1.0);
  const Route r = Pick(aware, Concat(Concat(base, Tokens(64, 700)), Tokens(10, 3000)));
  EXPECT_EQ(r.instance->id, 1);
  EXPECT_EQ(r.hit_positions, 128);
}

TEST_F(RouterTest, TiesGoToFewerSequencesThenTheLowerId) {
  Start(3);
  Router aware(RoutingPolicy::kPrefixAware, 1.0);
  // No hit anywhere, no load: the lowest id.
  EXPECT_EQ(Pick(aware, Tokens(50, 1)).instance->id, 0);
  // At weight 0 only the load counts, here the queued prompt tokens:
  // instance 2 has none; then 0 and 1 tie (20 tokens, one sequence each)
  // and the lower id wins.
  Router load_only(RoutingPolicy::kPrefixAware, 0.0);
  Queue(0, 20);
  Queue(1, 20);
  EXPECT_EQ(Pick(load_only, Tokens(50, 1)).instance->id, 2);
  Queue(2, 20);
  Queue(2, 20);
  EXPECT_EQ(Pick(load_only, Tokens(50, 1)).instance->id, 0);
}

TEST_F(RouterTest, LoadOverridesAHitAtTheWeight) {
  Start(2);
  const std::vector<int32_t> prefix = Tokens(160, 1);  // 10 blocks
  Cache(1, prefix);
  const std::vector<int32_t> request = Concat(prefix, Tokens(16, 4000));
  // Instance 1 runs a sequence holding 300 positions of KV.
  Run(1, 99, Tokens(300, 8000));
  ASSERT_EQ(at(1).scheduler->Load().active_tokens, 300);
  // cost(0) = w * 176; cost(1) = w * 16 + 300: the hit of 160 wins while
  // w * 160 > 300.
  Router w2(RoutingPolicy::kPrefixAware, 2.0);
  EXPECT_EQ(Pick(w2, request).instance->id, 1);
  Router w1(RoutingPolicy::kPrefixAware, 1.0);
  EXPECT_EQ(Pick(w1, request).instance->id, 0);
  // Queued prompt tokens count as load.
  Queue(0, 400);
  EXPECT_EQ(Pick(w1, request).instance->id, 1);
}

// The guard routes by sequences alone while the pool is imbalanced past
// both thresholds, and leaves the cost to decide otherwise.
TEST_F(RouterTest, BalanceGuardRoutesByLoadOnlyPastBothThresholds) {
  Start(2);
  const std::vector<int32_t> prefix = Tokens(160, 1);
  Cache(1, prefix);
  const std::vector<int32_t> request = Concat(prefix, Tokens(16, 4000));
  const BalanceGuard guard{/*abs_threshold=*/1, /*rel_threshold=*/1.5};
  Router guarded(RoutingPolicy::kPrefixAware, 1e6, guard);
  Router unguarded(RoutingPolicy::kPrefixAware, 1e6);
  // 1 sequence against 0: a difference of 1 is not past abs 1.
  Queue(1, 16);
  EXPECT_EQ(Pick(guarded, request).instance->id, 1);
  // 2 against 0: past both thresholds, so the least busy instance takes
  // the request and is reported with what it holds (nothing).
  Queue(1, 16);
  const Route balanced = Pick(guarded, request);
  EXPECT_EQ(balanced.instance->id, 0);
  EXPECT_EQ(balanced.hit_positions, 0);
  EXPECT_EQ(Pick(unguarded, request).instance->id, 1);  // the weight alone keeps the hit
  // 6 against 4: past abs 1 but not past 1.5 times: the hit decides again.
  for (int i = 0; i < 4; ++i) Queue(0, 16);
  for (int i = 0; i < 4; ++i) Queue(1, 16);
  EXPECT_EQ(Pick(guarded, request).instance->id, 1);
  // 7 against 4: past both again.
  Queue(1, 16);
  EXPECT_EQ(Pick(guarded, request).instance->id, 0);
  EXPECT_FALSE(BalanceGuard{}.Imbalanced(0, 1000));  // the default never triggers
  EXPECT_TRUE((BalanceGuard{0, 1.0}).Imbalanced(0, 1));
  EXPECT_FALSE((BalanceGuard{0, 1.0}).Imbalanced(3, 3));
}

// A prompt queued where a conversation's history is counts once, like
// active KV, not at the weight: a turn stays with its hit until the queue
// outweighs w times the tokens the hit saves.
TEST_F(RouterTest, QueuedPromptsAreLoadNotWeightedPrefill) {
  Start(2);
  const std::vector<int32_t> prefix = Tokens(160, 1);
  Cache(1, prefix);
  const std::vector<int32_t> request = Concat(prefix, Tokens(16, 4000));
  Router w8(RoutingPolicy::kPrefixAware, 8.0);
  // cost(0) = 8 * 176 = 1408; cost(1) = 8 * 16 + 600 = 728.
  Queue(1, 600);
  EXPECT_EQ(Pick(w8, request).instance->id, 1);
  // cost(1) = 128 + 1400 = 1528 > 1408.
  Queue(1, 400);
  Queue(1, 400);
  EXPECT_EQ(Pick(w8, request).instance->id, 0);
}

TEST_F(RouterTest, InstancesGoingDownDrainingAndJoining) {
  Start(2);
  const std::vector<int32_t> prompt = Tokens(64, 1);
  Cache(1, prompt);
  Router aware(RoutingPolicy::kPrefixAware, 1.0);
  EXPECT_EQ(Pick(aware, prompt).instance->id, 1);
  // Draining: takes nothing new.
  at(1).drain_deadline = Clock::now() + std::chrono::seconds(10);
  EXPECT_EQ(Pick(aware, prompt).instance->id, 0);
  at(1).drain_deadline.reset();
  // Down: gone, its cache with it.
  registry_->Reset(at(1));
  Route r = Pick(aware, prompt);
  EXPECT_EQ(r.instance->id, 0);
  EXPECT_EQ(r.hit_positions, 0);
  registry_->Reset(at(0));
  EXPECT_EQ(Pick(aware, prompt).instance, nullptr);
  // Joining again: a candidate, with an empty cache.
  ASSERT_TRUE(testing::RegisterAll(*registry_, config_, spec_, kNumBlocks));
  r = Pick(aware, prompt);
  EXPECT_EQ(r.instance->id, 0);
  EXPECT_EQ(r.hit_positions, 0);
}

TEST_F(RouterTest, RoundRobinTakesInstancesInTurnAndSkipsOnesNotAccepting) {
  Start(3);
  Router rr(RoutingPolicy::kRoundRobin, 1.0);
  const std::vector<int32_t> prompt = Tokens(20, 1);
  std::vector<int> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(Pick(rr, prompt).instance->id);
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2, 0}));
  registry_->Reset(at(1));
  ids.clear();
  for (int i = 0; i < 3; ++i) ids.push_back(Pick(rr, prompt).instance->id);
  EXPECT_EQ(ids, (std::vector<int>{2, 0, 2}));
}

TEST_F(RouterTest, LoadCountsQueuedPromptsAndRunningContext) {
  Start(1);
  Queue(0, 30);
  Run(0, 50, Tokens(40, 1));
  const SchedulerLoad load = at(0).scheduler->Load();
  EXPECT_EQ(load.num_waiting + load.num_running, 2u);
  // The running sequence computed its 40 prompt tokens (Run schedules the
  // queued one too when it fits: then it counts as running and computed).
  EXPECT_EQ(load.queued_prefill_tokens + load.active_tokens, 70);
}

}  // namespace
}  // namespace headway
