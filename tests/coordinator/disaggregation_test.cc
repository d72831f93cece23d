// The disaggregation coordinator's job, transfer, retry, drain and fallback
// paths, with instances registered by hand and a ControlServer that records
// the plans instead of processes.
#include "coordinator/engine/disaggregation.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "tests/coordinator/fake_instances.h"
#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeControlServer;
using testing::FakeLlamaSpec;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;
constexpr uint64_t kRequest = 7;
// What each fake prefill rank reports as its send time (TransferResult.seconds).
constexpr double kSendSeconds = 0.25;

std::unique_ptr<ServingMetrics> MakeMetrics(const std::vector<int>& tp_sizes) {
  Result<std::unique_ptr<ServingMetrics>> m = ServingMetrics::Create("fake", tp_sizes);
  EXPECT_TRUE(m.ok());
  return std::move(*m);
}

// One prefill instance (id 0, TP 1) and one decode instance (id 1, TP
// `decode_tp`), every rank registered.
class DisaggregationCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(1); }

  void Start(int decode_tp) {
    spec_ = FakeLlamaSpec();
    config_ = Config();
    config_.block_size = kBlockSize;
    config_.kv_transfer_timeout_ms = 1000;
    config_.routing_max_local_prefill_tokens = 0;  // Request()'s 40 tokens go remote
    PoolConfig prefill;
    prefill.name = "prefill";
    prefill.role = PoolRole::kPrefill;
    prefill.instances = {InstanceConfig{}};
    PoolConfig decode;
    decode.name = "decode";
    decode.role = PoolRole::kDecode;
    InstanceConfig d;
    d.tp_size = decode_tp;
    decode.instances = {d};
    config_.pools = {prefill, decode};
    metrics_ = MakeMetrics({1, decode_tp});
    registry_ = std::make_unique<InstanceRegistry>(config_, spec_, &server_, metrics_.get());
    ASSERT_TRUE(testing::RegisterAll(*registry_, config_, spec_, kNumBlocks));
    server_.sent.clear();
    pd_ = std::make_unique<DisaggregationCoordinator>(config_, spec_, registry_.get(), &router_,
                                                      metrics_.get());
  }

  Instance& prefill() { return registry_->at(0); }
  Instance& decode() { return registry_->at(1); }

  // A request of 40 prompt tokens: 32 positions (2 whole blocks) to move.
  EngineRequest Request() const {
    EngineRequest r;
    for (int i = 0; i < 40; ++i) r.prompt_ids.push_back(100 + i);
    r.max_tokens = 4;
    return r;
  }

  // Begins the job and computes its prompt on the prefill instance, as the
  // engine would with the workers' step results. Returns OnPrefillDone's handoffs.
  std::vector<Handoff> Prefill() {
    EXPECT_TRUE(pd_->Begin(kRequest, Request(), prefill(), decode(), Clock::now()).ok());
    Scheduler& s = *prefill().scheduler;
    for (int step = 0; step < 10; ++step) {
      ScheduledBatch batch = s.Schedule();
      for (const ScheduledSeq& seq : batch.seqs) EXPECT_FALSE(seq.sample);  // prefill-only
      s.OnStepComputed(batch);
      const Sequence* seq = s.Find(kRequest);
      if (seq != nullptr && seq->IsPrefillDone()) return pd_->OnPrefillDone(prefill(), kRequest);
    }
    ADD_FAILURE() << "the prefill job did not finish";
    return {};
  }

  proto::TransferResult Result(const proto::TransferPlan& plan, const std::string& error = "") {
    proto::TransferResult r;
    r.set_transfer_id(plan.transfer_id());
    r.set_error(error);
    r.set_bytes(1000);
    r.set_seconds(kSendSeconds);
    return r;
  }

  int ReferencedBlocks(const Instance& inst) const {
    int n = 0;
    for (int r = 0; r < inst.tp_size; ++r) n += inst.scheduler->kv().Usage(r).num_referenced;
    return n;
  }

  void ExpectConsistent() {
    EXPECT_TRUE(prefill().scheduler->kv().CheckConsistency().ok())
        << prefill().scheduler->kv().CheckConsistency().message();
    EXPECT_TRUE(decode().scheduler->kv().CheckConsistency().ok())
        << decode().scheduler->kv().CheckConsistency().message();
  }

  // The sum of the samples of `name` whose labels contain `label` ("" for
  // any); -1 if there is none.
  double Counter(const std::string& name, const std::string& label = "") const {
    const std::string text = metrics_->RenderPrometheus();
    double sum = 0;
    bool found = false;
    for (size_t at = text.find("\n" + name + "{"); at != std::string::npos;
         at = text.find("\n" + name + "{", at + 1)) {
      const size_t close = text.find('}', at);
      if (text.substr(at, close - at).find(label) == std::string::npos) continue;
      sum += std::stod(text.substr(text.find(' ', close) + 1));
      found = true;
    }
    return found ? sum : -1;
  }

  // Place() for `request`, with the decode instance's hit as the router
  // reports it.
  DisaggregationCoordinator::Placement Place(const EngineRequest& request) {
    const TokenIds prompt{request.prompt_ids, {}};
    const int64_t hit =
        decode().scheduler->kv().MatchPrefix(prompt, int64_t(prompt.size())).num_positions;
    return pd_->Place(prompt, decode(), hit);
  }

  ModelSpec spec_;
  Config config_;
  FakeControlServer server_;
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<InstanceRegistry> registry_;
  Router router_{RoutingPolicy::kPrefixAware, 1.0};
  std::unique_ptr<DisaggregationCoordinator> pd_;
};

// Every target of `plan` carries write ranges that cover exactly its
// destination blocks, in order, and verify under the receiver's `key` for
// the plan's transfer id and lifetime (the coordinator's wait for it).
void ExpectGrantedBy(const proto::TransferPlan& plan, const std::string& key) {
  EXPECT_EQ(plan.write_lifetime_ms(), plan.timeout_ms() + 2000u);
  for (const proto::TransferTarget& t : plan.targets()) {
    std::vector<uint32_t> covered;
    for (const proto::KvWriteRange& r : t.write_ranges()) {
      ASSERT_EQ(r.tag().size(), kKvWriteTagBytes);
      KvWriteTag tag;
      std::memcpy(tag.data(), r.tag().data(), tag.size());
      EXPECT_TRUE(VerifyKvWriteRange(key, plan.transfer_id(), plan.write_lifetime_ms(),
                                     r.first_block(), r.num_blocks(), tag));
      EXPECT_FALSE(VerifyKvWriteRange(testing::FakeKvWriteKey(0, 0), plan.transfer_id(),
                                      plan.write_lifetime_ms(), r.first_block(), r.num_blocks(),
                                      tag));
      for (uint32_t b = 0; b < r.num_blocks(); ++b) covered.push_back(r.first_block() + b);
    }
    EXPECT_EQ(covered, std::vector<uint32_t>(t.dst_blocks().begin(), t.dst_blocks().end()));
  }
}

TEST_F(DisaggregationCoordinatorTest, PrefillPositionsAreThePromptsWholeBlocksBeforeItsLastPosition) {
  EXPECT_EQ(pd_->PrefillPositions(16), 0);
  EXPECT_EQ(pd_->PrefillPositions(17), 16);
  EXPECT_EQ(pd_->PrefillPositions(40), 32);
  EXPECT_EQ(pd_->PrefillPositions(48), 32);
}

TEST_F(DisaggregationCoordinatorTest, SuccessfulTransferHandsOffWithTheBlocksCached) {
  EXPECT_TRUE(Prefill().empty());
  EXPECT_TRUE(pd_->HasJob(kRequest));
  EXPECT_EQ(prefill().scheduler->Find(kRequest), nullptr);  // the job's sequence is gone
  std::vector<std::pair<std::string, proto::TransferPlan>> plans = server_.TakeTransferPlans();
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].first, "i0r0");
  // 2 blocks x 2 layers x 3 KV heads, to the decode rank's endpoint.
  int blocks = 0;
  for (const proto::TransferTarget& t : plans[0].second.targets()) {
    EXPECT_EQ(t.endpoint().worker_address(), "ucx-address-i1r0");
    blocks += t.src_blocks_size();
  }
  EXPECT_EQ(blocks, 2 * 2 * 3);
  EXPECT_EQ(plans[0].second.timeout_ms(), 1000u);
  ExpectGrantedBy(plans[0].second, testing::FakeKvWriteKey(1, 0));
  EXPECT_EQ(ReferencedBlocks(prefill()), 12);  // pinned
  EXPECT_EQ(ReferencedBlocks(decode()), 12);   // reserved
  ExpectConsistent();

  std::vector<Handoff> out = pd_->OnTransferResult(Result(plans[0].second));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].request_id, kRequest);
  EXPECT_TRUE(out[0].transferred);
  EXPECT_TRUE(out[0].status.ok());
  EXPECT_EQ(out[0].decode, 1);
  EXPECT_EQ(out[0].request.prompt_ids, Request().prompt_ids);
  EXPECT_FALSE(pd_->HasJob(kRequest));
  // The received blocks are the decode instance's cached prefix.
  const TokenIds prompt{out[0].request.prompt_ids, {}};
  EXPECT_EQ(decode().scheduler->kv().MatchPrefix(prompt, 39).num_positions, 32);
  EXPECT_EQ(ReferencedBlocks(prefill()), 0);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
  ExpectConsistent();
  EXPECT_EQ(Counter("headway:kv_transfer_blocks_total"), 12);
  EXPECT_EQ(Counter("headway:kv_transfer_fallbacks_total"), 0);
  // The sending rank's own time for its plan, one observation per result.
  EXPECT_EQ(Counter("headway:kv_transfer_send_seconds_count"), 1);
  EXPECT_EQ(Counter("headway:kv_transfer_send_seconds_sum"), kSendSeconds);
}

TEST_F(DisaggregationCoordinatorTest, AFailedTransferIsRetriedOnceWithTheSameBlocksThenFallsBack) {
  ASSERT_TRUE(Prefill().empty());
  auto first = server_.TakeTransferPlans();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(pd_->OnTransferResult(Result(first[0].second, "connection reset")).empty());
  auto retry = server_.TakeTransferPlans();
  ASSERT_EQ(retry.size(), 1u);
  EXPECT_NE(retry[0].second.transfer_id(), first[0].second.transfer_id());
  // Fresh grants: the first attempt's tags do not cover the retry's id.
  ExpectGrantedBy(retry[0].second, testing::FakeKvWriteKey(1, 0));
  EXPECT_NE(retry[0].second.targets(0).write_ranges(0).tag(),
            first[0].second.targets(0).write_ranges(0).tag());
  ASSERT_EQ(retry[0].second.targets_size(), first[0].second.targets_size());
  for (int i = 0; i < retry[0].second.targets_size(); ++i) {
    EXPECT_EQ(retry[0].second.targets(i).dst_blocks_size(), first[0].second.targets(i).dst_blocks_size());
    for (int b = 0; b < retry[0].second.targets(i).dst_blocks_size(); ++b) {
      EXPECT_EQ(retry[0].second.targets(i).dst_blocks(b), first[0].second.targets(i).dst_blocks(b));
    }
  }
  // A late result of the failed attempt changes nothing.
  EXPECT_TRUE(pd_->OnTransferResult(Result(first[0].second)).empty());
  EXPECT_TRUE(pd_->HasJob(kRequest));

  std::vector<Handoff> out = pd_->OnTransferResult(Result(retry[0].second, "connection reset"));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].transferred);  // the decode instance prefills it
  EXPECT_TRUE(out[0].status.ok());
  EXPECT_EQ(Counter("headway:kv_transfer_fallbacks_total"), 1);
  // Failed sends are not timed; the late success of the first attempt is.
  EXPECT_EQ(Counter("headway:kv_transfer_send_seconds_count"), 1);
  // Every sender answered: nothing drains, every block is back.
  EXPECT_EQ(pd_->num_draining(), 0u);
  EXPECT_EQ(ReferencedBlocks(prefill()), 0);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
  const TokenIds prompt{out[0].request.prompt_ids, {}};
  EXPECT_EQ(decode().scheduler->kv().MatchPrefix(prompt, 39).num_positions, 0);
  ExpectConsistent();
}

TEST_F(DisaggregationCoordinatorTest, ATimedOutTransferDrainsItsBlocksUntilTheSenderAnswers) {
  ASSERT_TRUE(Prefill().empty());
  auto first = server_.TakeTransferPlans();
  ASSERT_EQ(first.size(), 1u);
  Clock::time_point late = Clock::now() + std::chrono::seconds(4);
  EXPECT_TRUE(pd_->CheckDeadlines(late).empty());  // timed out: retried
  auto retry = server_.TakeTransferPlans();
  ASSERT_EQ(retry.size(), 1u);
  std::vector<Handoff> out = pd_->CheckDeadlines(late + std::chrono::seconds(4));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].transferred);
  // The retry's sender has not answered: its blocks stay out of use.
  EXPECT_EQ(pd_->num_draining(), 1u);
  EXPECT_EQ(ReferencedBlocks(decode()), 12);
  EXPECT_EQ(ReferencedBlocks(prefill()), 0);  // the pin is gone
  ExpectConsistent();
  EXPECT_TRUE(pd_->CheckDeadlines(late + std::chrono::milliseconds(4500)).empty());
  EXPECT_EQ(pd_->num_draining(), 1u);  // not before the sender answers or the grace ends
  EXPECT_TRUE(pd_->OnTransferResult(Result(retry[0].second, "late")).empty());
  EXPECT_TRUE(pd_->CheckDeadlines(Clock::now()).empty());
  EXPECT_EQ(pd_->num_draining(), 0u);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
  ExpectConsistent();
}

TEST_F(DisaggregationCoordinatorTest, APrefillInstanceLostMidTransferFallsBackAndDrainsBriefly) {
  ASSERT_TRUE(Prefill().empty());
  ASSERT_EQ(server_.TakeTransferPlans().size(), 1u);
  registry_->Reset(prefill());
  std::vector<Handoff> out = pd_->OnInstanceDown(0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].transferred);
  EXPECT_TRUE(server_.TakeTransferPlans().empty());  // no retry: the sender is gone
  EXPECT_EQ(pd_->num_draining(), 1u);
  EXPECT_EQ(ReferencedBlocks(decode()), 12);
  // A dead sender's grace (1 s), not the transfer timeout.
  EXPECT_TRUE(pd_->CheckDeadlines(Clock::now() + std::chrono::milliseconds(1100)).empty());
  EXPECT_EQ(pd_->num_draining(), 0u);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
  EXPECT_TRUE(decode().scheduler->kv().CheckConsistency().ok());
}

TEST_F(DisaggregationCoordinatorTest, APrefillInstanceLostBeforeTheTransferHandsOffAtOnce) {
  ASSERT_TRUE(pd_->Begin(kRequest, Request(), prefill(), decode(), Clock::now()).ok());
  EXPECT_EQ(ReferencedBlocks(decode()), 12);  // reserved before the prefill starts
  registry_->Reset(prefill());
  std::vector<Handoff> out = pd_->OnInstanceDown(0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].transferred);
  EXPECT_EQ(out[0].decode, 1);  // the decode instance chosen on arrival
  EXPECT_FALSE(pd_->HasJob(kRequest));
  EXPECT_EQ(ReferencedBlocks(decode()), 0);  // the reservation is given back
  EXPECT_EQ(Counter("headway:kv_transfer_fallbacks_total", "prefill_instance_down"), 1);
  EXPECT_EQ(Counter("headway:kv_transfer_fallbacks_total"), 1);
  EXPECT_TRUE(decode().scheduler->kv().CheckConsistency().ok());
}

TEST_F(DisaggregationCoordinatorTest, ADroppedRequestEndsItsTransferWithoutAHandoff) {
  ASSERT_TRUE(Prefill().empty());
  auto plans = server_.TakeTransferPlans();
  ASSERT_EQ(plans.size(), 1u);
  pd_->Drop(kRequest);
  EXPECT_TRUE(pd_->HasJob(kRequest));  // until its sender answers
  EXPECT_TRUE(pd_->OnTransferResult(Result(plans[0].second)).empty());
  EXPECT_FALSE(pd_->HasJob(kRequest));
  EXPECT_EQ(ReferencedBlocks(prefill()), 0);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
  ExpectConsistent();
}

TEST_F(DisaggregationCoordinatorTest, ADroppedJobStillPrefillingLeavesNothingBehind) {
  ASSERT_TRUE(pd_->Begin(kRequest, Request(), prefill(), decode(), Clock::now()).ok());
  (void)prefill().scheduler->Schedule();
  pd_->Drop(kRequest);
  EXPECT_FALSE(pd_->HasJob(kRequest));
  EXPECT_EQ(prefill().scheduler->Find(kRequest), nullptr);
  EXPECT_EQ(ReferencedBlocks(prefill()), 0);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
  ExpectConsistent();
}

TEST_F(DisaggregationCoordinatorTest, ADecodeInstanceLostDuringThePrefillFallsBackWithItsReason) {
  ASSERT_TRUE(pd_->Begin(kRequest, Request(), prefill(), decode(), Clock::now()).ok());
  Scheduler& s = *prefill().scheduler;
  s.OnStepComputed(s.Schedule());
  ASSERT_TRUE(s.Find(kRequest)->IsPrefillDone());
  registry_->Reset(decode());
  std::vector<Handoff> out = pd_->OnPrefillDone(prefill(), kRequest);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].status.ok());  // the engine finds no decode instance and fails it
  EXPECT_FALSE(out[0].transferred);
  EXPECT_EQ(out[0].decode, -1);
  EXPECT_FALSE(pd_->HasJob(kRequest));
  EXPECT_TRUE(server_.TakeTransferPlans().empty());
  EXPECT_EQ(Counter("headway:kv_transfer_fallbacks_total", "decode_instance_down"), 1);
  EXPECT_EQ(ReferencedBlocks(prefill()), 0);
}

// Conditional disaggregation: each reason to prefill on the decode instance,
// decided on arrival, and the remote case.
TEST_F(DisaggregationCoordinatorTest, PlaceSendsAPromptRemoteOnlyWhenItPays) {
  DisaggregationCoordinator::Placement p = Place(Request());
  EXPECT_EQ(p.prefill, &prefill());
  EXPECT_EQ(p.prefill_hit, 0);

  config_.routing_max_local_prefill_tokens = 40;  // the whole prompt is short
  p = Place(Request());
  EXPECT_EQ(p.prefill, nullptr);
  EXPECT_EQ(p.reason, LocalPrefillReason::kShortUncached);
  config_.routing_max_local_prefill_tokens = 39;
  EXPECT_EQ(Place(Request()).prefill, &prefill());
  config_.routing_max_local_prefill_tokens = 0;

  EngineRequest one_block = Request();  // 17 tokens: one whole block before the last
  one_block.prompt_ids.resize(17);
  EXPECT_EQ(Place(one_block).prefill, &prefill());
  one_block.prompt_ids.pop_back();  // 16: no whole block to move
  EXPECT_EQ(Place(one_block).reason, LocalPrefillReason::kShortUncached);

  config_.enable_prefix_caching = false;
  EXPECT_EQ(Place(Request()).reason, LocalPrefillReason::kPrefixCachingOff);
  config_.enable_prefix_caching = true;

  EngineRequest huge;  // more blocks than the decode instance's pool
  for (int i = 0; i < 40 * kBlockSize; ++i) huge.prompt_ids.push_back(i);
  p = Place(huge);
  EXPECT_EQ(p.prefill, nullptr);
  EXPECT_EQ(p.reason, LocalPrefillReason::kDecodeNoRoom);

  ASSERT_TRUE(pd_->Begin(kRequest, Request(), prefill(), decode(), Clock::now()).ok());
  config_.routing_max_prefill_queue_tokens = 32;  // the job queues 32 tokens: at the limit
  EXPECT_EQ(Place(Request()).prefill, &prefill());
  config_.routing_max_prefill_queue_tokens = 31;
  EXPECT_EQ(Place(Request()).reason, LocalPrefillReason::kPrefillQueueFull);
  config_.routing_max_prefill_queue_tokens = 0;  // no limit

  registry_->Reset(prefill());
  EXPECT_EQ(Place(Request()).reason, LocalPrefillReason::kNoPrefillInstance);
}

// The decode instance reserves on Begin, before any prefill work: a prompt
// that no longer fits goes local up front instead of being prefilled twice.
TEST_F(DisaggregationCoordinatorTest, BeginReservesTheDecodeBlocksBeforeThePrefill) {
  ASSERT_TRUE(pd_->Begin(kRequest, Request(), prefill(), decode(), Clock::now()).ok());
  EXPECT_EQ(ReferencedBlocks(decode()), 12);
  EXPECT_EQ(Counter("headway:pd_remote_prefills_total"), 1);
  EXPECT_EQ(decode().scheduler->kv().Usage(0).num_free, kNumBlocks - 12);
  ExpectConsistent();
}

// Blocks the prefill instance does not hold when its job ends (prefix
// caching off there) cannot be sent: the fallback names the reason.
TEST_F(DisaggregationCoordinatorTest, UncachedPrefillBlocksFallBackWithTheirReason) {
  config_.enable_prefix_caching = false;
  metrics_ = MakeMetrics({1, 1});
  registry_ = std::make_unique<InstanceRegistry>(config_, spec_, &server_, metrics_.get());
  ASSERT_TRUE(testing::RegisterAll(*registry_, config_, spec_, kNumBlocks));
  pd_ = std::make_unique<DisaggregationCoordinator>(config_, spec_, registry_.get(), &router_,
                                                    metrics_.get());
  server_.sent.clear();
  std::vector<Handoff> out = Prefill();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].transferred);
  EXPECT_EQ(out[0].decode, 1);
  EXPECT_TRUE(server_.TakeTransferPlans().empty());
  EXPECT_EQ(Counter("headway:kv_transfer_fallbacks_total", "prefill_blocks_evicted"), 1);
  EXPECT_EQ(ReferencedBlocks(decode()), 0);
}

// A conversation's next turn on the decode instance that received the
// first: only the new whole blocks move, and the request reports the moved
// positions as transferred, the held ones as cached.
TEST_F(DisaggregationCoordinatorTest, TheHandoffNamesTheReceivedPositions) {
  ASSERT_TRUE(Prefill().empty());
  auto plans = server_.TakeTransferPlans();
  ASSERT_EQ(plans.size(), 1u);
  std::vector<Handoff> out = pd_->OnTransferResult(Result(plans[0].second));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].received_from, 0);
  EXPECT_EQ(out[0].received_to, 32);
  EXPECT_EQ(Counter("headway:kv_transfer_tokens_total"), 32);

  Sequence seq(kRequest, Request().prompt_ids, SamplingOptions{}, StopConditions{}, Clock::now());
  seq.set_received_positions(out[0].received_from, out[0].received_to);
  seq.RecordPrefixHit(32);
  EXPECT_EQ(seq.num_transferred_tokens(), 32);
  EXPECT_EQ(seq.num_cached_tokens(), 0);
  seq.RecordPrefixHit(16);  // part of it evicted before admission
  EXPECT_EQ(seq.num_transferred_tokens(), 16);
  EXPECT_EQ(seq.num_cached_tokens(), 0);
  Sequence later(kRequest + 1, Request().prompt_ids, SamplingOptions{}, StopConditions{},
                 Clock::now());
  later.set_received_positions(16, 32);
  later.RecordPrefixHit(32);
  EXPECT_EQ(later.num_cached_tokens(), 16);
  EXPECT_EQ(later.num_transferred_tokens(), 16);
}

// Decode at TP 3 (one KV head per rank): each KV head goes to the rank that
// holds it.
TEST_F(DisaggregationCoordinatorTest, HeterogeneousTpSendsEachKvHeadToItsRank) {
  Start(3);
  ASSERT_TRUE(Prefill().empty());
  auto plans = server_.TakeTransferPlans();
  ASSERT_EQ(plans.size(), 1u);
  std::set<std::string> endpoints;
  int blocks = 0;
  for (const proto::TransferTarget& t : plans[0].second.targets()) {
    endpoints.insert(t.endpoint().worker_address());
    blocks += t.src_blocks_size();
  }
  EXPECT_EQ(endpoints, (std::set<std::string>{"ucx-address-i1r0", "ucx-address-i1r1",
                                              "ucx-address-i1r2"}));
  EXPECT_EQ(blocks, 12);
  // Each target's grant is made with the key of the rank it writes to.
  for (int rank = 0; rank < 3; ++rank) {
    proto::TransferPlan to_rank = plans[0].second;
    to_rank.clear_targets();
    for (const proto::TransferTarget& t : plans[0].second.targets()) {
      if (t.endpoint().worker_address() == "ucx-address-i1r" + std::to_string(rank)) {
        *to_rank.add_targets() = t;
      }
    }
    ASSERT_GT(to_rank.targets_size(), 0);
    ExpectGrantedBy(to_rank, testing::FakeKvWriteKey(1, rank));
  }
  std::vector<Handoff> out = pd_->OnTransferResult(Result(plans[0].second));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].transferred);
  ExpectConsistent();
}

}  // namespace
}  // namespace headway
