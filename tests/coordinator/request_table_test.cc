// The request table on its own: outcomes and answers of finished, cancelled,
// failed and refused requests, the latency metrics it feeds, and its
// lookups. Sequences are sampled by hand, as the engine would with the
// workers' step results.
#include "coordinator/engine/request_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "tests/coordinator/fake_model_spec.h"
#include "tests/coordinator/tiny_vocab.h"
#include "tests/support/prometheus_parser.h"

namespace headway {
namespace {

using testing::PromLabels;

constexpr char kModel[] = "m";
const std::vector<int32_t> kPrompt = {'x', 'y', 'z'};

StopConditions Stop(int max_tokens, std::vector<std::string> stop_strings = {}) {
  StopConditions stop;
  stop.max_tokens = max_tokens;
  stop.stop_strings = std::move(stop_strings);
  return stop;
}

proto::SampledToken Sampled(int32_t token_id) {
  proto::SampledToken t;
  t.set_token_id(token_id);
  t.set_logprob(-0.5f);
  return t;
}

std::vector<uint64_t> Sorted(std::vector<uint64_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

PromLabels Inst(int id) { return {{"model_name", kModel}, {"instance", std::to_string(id)}}; }
PromLabels Reason(const char* finished_reason) {
  PromLabels labels = Inst(0);
  labels["finished_reason"] = finished_reason;
  return labels;
}

// Two instances (ids 0 and 1, TP 1) and the tiny vocabulary.
class RequestTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<ServingMetrics>> m = ServingMetrics::Create(kModel, {1, 1});
    ASSERT_TRUE(m.ok());
    metrics_ = std::move(*m);
    Result<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(testing::TinyVocab());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tokenizer_ = std::move(*t);
    table_ = std::make_unique<RequestTable>(metrics_.get());
  }

  // Admits request `id` on `instance`; its future.
  std::future<CompletionOutcome> Add(uint64_t id, int instance, StopConditions stop,
                                     std::shared_ptr<OutputStream> stream = nullptr,
                                     Clock::time_point deadline = Clock::time_point::max()) {
    std::promise<CompletionOutcome> promise;
    std::future<CompletionOutcome> future = promise.get_future();
    table_->Add(id, instance, deadline, std::move(promise),
                std::make_unique<OutputProcessor>(*tokenizer_, stop, false, std::move(stream)));
    return future;
  }

  static std::unique_ptr<Sequence> Seq(uint64_t id, StopConditions stop) {
    return std::make_unique<Sequence>(id, kPrompt, SamplingOptions{}, std::move(stop),
                                      Clock::now());
  }

  // The value of one sample of the metrics' current render (NaN if absent).
  double Metric(const std::string& name, const PromLabels& labels) const {
    Result<testing::PromExposition> e = testing::ParsePrometheusText(metrics_->RenderPrometheus());
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    std::optional<double> v = e.ok() ? e->Value(name, labels) : std::nullopt;
    EXPECT_TRUE(v.has_value()) << name;
    return v.value_or(std::nan(""));
  }

  static bool Ready(std::future<CompletionOutcome>& f) {
    return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<RequestTable> table_;
};

TEST_F(RequestTableTest, AFinishedRequestIsAnsweredWithItsOutcomeOnlyAtAnswerEnded) {
  std::future<CompletionOutcome> f = Add(1, 0, Stop(2));
  std::unique_ptr<Sequence> seq = Seq(1, Stop(2));
  EXPECT_FALSE(table_->OnSampled(0, *seq, Sampled('a')));
  EXPECT_TRUE(table_->OnSampled(0, *seq, Sampled('b')));  // max_tokens
  EXPECT_EQ(seq->output_ids(), (std::vector<int32_t>{'a', 'b'}));

  table_->End(1, 0, std::move(seq), Status::Ok());
  EXPECT_FALSE(table_->Contains(1));
  EXPECT_EQ(table_->num_unanswered(), 1u);
  EXPECT_FALSE(Ready(f));  // answered after the health snapshot, not at once
  table_->AnswerEnded();
  EXPECT_EQ(table_->num_unanswered(), 0u);
  ASSERT_TRUE(Ready(f));
  const CompletionOutcome out = f.get();
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.text, "ab");
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.num_prompt_tokens, 3);
  EXPECT_EQ(out.num_output_tokens, 2);

  EXPECT_EQ(Metric("headway:request_success_total", Reason("length")), 1);
  EXPECT_EQ(Metric("headway:prompt_tokens_total", Inst(0)), 3);
  EXPECT_EQ(Metric("headway:generation_tokens_total", Inst(0)), 2);
  EXPECT_EQ(Metric("headway:time_to_first_token_seconds_count", Inst(0)), 1);
  EXPECT_EQ(Metric("headway:inter_token_latency_seconds_count", Inst(0)), 1);
  EXPECT_EQ(Metric("headway:e2e_request_latency_seconds_count", Inst(0)), 1);
}

TEST_F(RequestTableTest, AStreamGetsTheTextAStopStringHeldBackWhenItIsAnswered) {
  auto stream = std::make_shared<OutputStream>();
  const StopConditions stop = Stop(2, {"bq"});
  std::future<CompletionOutcome> f = Add(1, 0, stop, stream);
  std::unique_ptr<Sequence> seq = Seq(1, stop);
  EXPECT_FALSE(table_->OnSampled(0, *seq, Sampled('a')));
  EXPECT_TRUE(table_->OnSampled(0, *seq, Sampled('b')));  // "b" may begin "bq": held back
  table_->End(1, 0, std::move(seq), Status::Ok());

  OutputStream::Update before = stream->Take(std::chrono::milliseconds(0));
  EXPECT_EQ(before.text, "a");
  EXPECT_FALSE(before.final.has_value());
  table_->AnswerEnded();
  OutputStream::Update after = stream->Take(std::chrono::milliseconds(0));
  EXPECT_EQ(after.text, "b");
  ASSERT_TRUE(after.final.has_value());
  EXPECT_EQ(after.final->text, "ab");
  EXPECT_EQ(f.get().text, "ab");
}

TEST_F(RequestTableTest, ACancelledRequestCountsAsAnAbortAndAFailedOneIsNotCounted) {
  std::future<CompletionOutcome> cancelled = Add(1, 0, Stop(4));
  std::future<CompletionOutcome> failed = Add(2, 0, Stop(4));
  std::future<CompletionOutcome> job = Add(3, 0, Stop(4));  // a prefill job: no sequence
  std::unique_ptr<Sequence> seq1 = Seq(1, Stop(4));
  EXPECT_FALSE(table_->OnSampled(0, *seq1, Sampled('a')));
  table_->End(1, 0, std::move(seq1), Status::Cancelled("the client went away"));
  table_->End(2, 0, Seq(2, Stop(4)), Status::Unavailable("instance 0 is down"));
  table_->End(3, 0, nullptr, Status::Cancelled("the client went away"));
  EXPECT_EQ(table_->size(), 0u);
  table_->AnswerEnded();

  EXPECT_EQ(cancelled.get().status.code(), StatusCode::kCancelled);
  const CompletionOutcome out = failed.get();
  EXPECT_EQ(out.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(out.text, "");
  EXPECT_EQ(job.get().status.code(), StatusCode::kCancelled);
  EXPECT_EQ(Metric("headway:request_success_total", Reason("abort")), 1);
  EXPECT_EQ(Metric("headway:request_success_total", Reason("stop")), 0);
  EXPECT_EQ(Metric("headway:generation_tokens_total", Inst(0)), 1);
  EXPECT_EQ(Metric("headway:e2e_request_latency_seconds_count", Inst(0)), 1);
}

TEST_F(RequestTableTest, ARefusedRequestIsAnsweredWithItsStatusAndNeverHeld) {
  auto stream = std::make_shared<OutputStream>();
  std::promise<CompletionOutcome> promise;
  std::future<CompletionOutcome> f = promise.get_future();
  table_->Refuse(std::move(promise), stream, Status::Unavailable("no instance is ready"));
  EXPECT_EQ(table_->size(), 0u);
  EXPECT_FALSE(Ready(f));
  table_->AnswerEnded();
  EXPECT_EQ(f.get().status.code(), StatusCode::kUnavailable);
  OutputStream::Update u = stream->Take(std::chrono::milliseconds(0));
  ASSERT_TRUE(u.final.has_value());
  EXPECT_EQ(u.final->status.code(), StatusCode::kUnavailable);
}

TEST_F(RequestTableTest, EndingARequestNotHeldChangesNothing) {
  table_->End(42, 0, nullptr, Status::Ok());
  EXPECT_EQ(table_->num_unanswered(), 0u);
  EXPECT_EQ(table_->InstanceOf(42), std::nullopt);
}

TEST_F(RequestTableTest, LookupsFollowTheRequestToItsDecodeInstance) {
  const Clock::time_point now = Clock::now();
  Add(1, 0, Stop(4), nullptr, now - std::chrono::seconds(1));
  Add(2, 1, Stop(4));
  Add(3, 0, Stop(4), nullptr, now);
  EXPECT_EQ(table_->InstanceOf(1), 0);
  EXPECT_EQ(Sorted(table_->OnInstance(0)), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(Sorted(table_->Expired(now)), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(Sorted(table_->Ids()), (std::vector<uint64_t>{1, 2, 3}));

  // Request 1 was prefilled elsewhere and joins instance 1 to decode: its
  // first token there times the disaggregated first decode step.
  table_->JoinedDecode(1, 1, Clock::now());
  EXPECT_EQ(table_->InstanceOf(1), 1);
  EXPECT_EQ(Sorted(table_->OnInstance(1)), (std::vector<uint64_t>{1, 2}));
  std::unique_ptr<Sequence> seq1 = Seq(1, Stop(4));
  std::unique_ptr<Sequence> seq2 = Seq(2, Stop(4));
  EXPECT_FALSE(table_->OnSampled(1, *seq1, Sampled('a')));
  EXPECT_FALSE(table_->OnSampled(1, *seq2, Sampled('a')));
  EXPECT_EQ(Metric("headway:pd_first_decode_seconds_count", {{"model_name", kModel}}), 1);
  EXPECT_EQ(Metric("headway:time_to_first_token_seconds_count", Inst(1)), 2);
}

TEST_F(RequestTableTest, QueueTimeIsRecordedOnceAtTheFirstSchedule) {
  auto kv = std::make_unique<KvCacheManager>(testing::FakeLlamaSpec(1), 1, 4,
                                             std::vector<int>{64}, KvCacheOptions{});
  Scheduler scheduler(SchedulerConfig{}, std::move(kv));
  ASSERT_TRUE(scheduler.Add(Seq(1, Stop(4))).ok());
  ASSERT_TRUE(scheduler.Add(Seq(5, Stop(4))).ok());  // not the table's: ignored
  Add(1, 0, Stop(4));
  const ScheduledBatch batch = scheduler.Schedule();
  ASSERT_EQ(batch.seqs.size(), 2u);
  table_->RecordScheduled(0, batch, scheduler, Clock::now());
  table_->RecordScheduled(0, batch, scheduler, Clock::now());
  EXPECT_EQ(Metric("headway:request_queue_time_seconds_count", Inst(0)), 1);
}

// A request moved to another instance after producing a token it never
// sent: its text starts again, and its first token counts once (on the
// instance that produced it), the next one as an inter-token latency.
TEST_F(RequestTableTest, AMovedRequestStartsItsOutputAgainAndCountsOneFirstToken) {
  std::future<CompletionOutcome> f = Add(1, 0, Stop(2));
  EXPECT_FALSE(table_->Streams(1));
  std::unique_ptr<Sequence> first = Seq(1, Stop(2));
  EXPECT_FALSE(table_->OnSampled(0, *first, Sampled('q')));

  table_->MovedTo(1, 1);
  EXPECT_EQ(table_->InstanceOf(1), 1);
  std::unique_ptr<Sequence> again = Seq(1, Stop(2));
  EXPECT_FALSE(table_->OnSampled(1, *again, Sampled('a')));
  EXPECT_TRUE(table_->OnSampled(1, *again, Sampled('b')));
  table_->End(1, 1, std::move(again), Status::Ok());
  table_->AnswerEnded();
  const CompletionOutcome out = f.get();
  EXPECT_EQ(out.text, "ab");  // not "qab"
  EXPECT_EQ(out.num_output_tokens, 2);
  EXPECT_EQ(Metric("headway:time_to_first_token_seconds_count", Inst(0)), 1);
  EXPECT_EQ(Metric("headway:time_to_first_token_seconds_count", Inst(1)), 0);
  EXPECT_EQ(Metric("headway:inter_token_latency_seconds_count", Inst(1)), 2);
}

}  // namespace
}  // namespace headway
