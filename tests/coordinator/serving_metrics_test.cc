#include "coordinator/metrics/serving_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"
#include "tests/support/process.h"

namespace headway {
namespace {

using testing::ParsePrometheusText;
using testing::PromExposition;
using testing::PromLabels;

constexpr const char kModel[] = "smollm2-135m-instruct";

std::unique_ptr<ServingMetrics> MakeMetrics(std::vector<int> tp_sizes = {1, 3}) {
  Result<std::unique_ptr<ServingMetrics>> m = ServingMetrics::Create(kModel, tp_sizes);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

PromExposition Scrape(const ServingMetrics& m) {
  const std::string text = m.RenderPrometheus();
  Result<PromExposition> r = ParsePrometheusText(text);
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n" << text;
  return r.ok() ? std::move(r).value() : PromExposition{};
}

PromLabels Inst(int id) { return {{"model_name", kModel}, {"instance", std::to_string(id)}}; }
PromLabels With(PromLabels labels, const std::string& k, const std::string& v) {
  labels[k] = v;
  return labels;
}
double Get(const PromExposition& e, const std::string& name, const PromLabels& labels) {
  std::optional<double> v = e.Value(name, labels);
  EXPECT_TRUE(v.has_value()) << name << " missing";
  return v.value_or(std::nan(""));
}

TEST(ServingMetricsTest, CreateRejectsBadInstances) {
  EXPECT_EQ(ServingMetrics::Create(kModel, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ServingMetrics::Create(kModel, {1, 0}).ok());
}

TEST(ServingMetricsTest, FullSetVisibleBeforeAnyRequest) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  PromExposition e = Scrape(*m);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"headway:time_to_first_token_seconds", "histogram"},
      {"headway:inter_token_latency_seconds", "histogram"},
      {"headway:e2e_request_latency_seconds", "histogram"},
      {"headway:request_queue_time_seconds", "histogram"},
      {"headway:step_seconds", "histogram"},
      {"headway:step_worker_seconds", "histogram"},
      {"headway:step_gap_seconds", "histogram"},
      {"headway:num_requests_running", "gauge"},
      {"headway:num_requests_waiting", "gauge"},
      {"headway:kv_cache_usage_perc", "gauge"},
      {"headway:kv_cache_rank_usage_perc", "gauge"},
      {"headway:kv_cache_retained_blocks", "gauge"},
      {"headway:kv_arena_chunks", "gauge"},
      {"headway:instance_state", "gauge"},
      {"headway:prefix_cache_queries_total", "counter"},
      {"headway:prefix_cache_hits_total", "counter"},
      {"headway:prompt_tokens_total", "counter"},
      {"headway:generation_tokens_total", "counter"},
      {"headway:num_preemptions_total", "counter"},
      {"headway:kv_blocks_recycled_total", "counter"},
      {"headway:kv_blocks_evicted_total", "counter"},
      {"headway:request_success_total", "counter"},
      {"headway:metrics_rejected_observations_total", "counter"},
      {"headway:kv_transfer_bytes_total", "counter"},
      {"headway:kv_transfer_blocks_total", "counter"},
      {"headway:kv_transfer_tokens_total", "counter"},
      {"headway:kv_transfer_fallbacks_total", "counter"},
      {"headway:pd_remote_prefills_total", "counter"},
      {"headway:pd_local_prefills_total", "counter"},
      {"headway:kv_transfer_seconds", "histogram"},
      {"headway:kv_transfer_send_seconds", "histogram"},
      {"headway:pd_prefill_seconds", "histogram"},
      {"headway:pd_first_decode_seconds", "histogram"},
      {"headway:requests_moved_total", "counter"},
      {"headway:instance_drains_total", "counter"},
      {"headway:routed_requests_total", "counter"},
      {"headway:routed_prefix_hit_tokens_total", "counter"},
  };
  ASSERT_EQ(e.families.size(), expected.size());
  for (const auto& [name, type] : expected) {
    const testing::PromFamily* f = e.FindFamily(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->type, type) << name;
    EXPECT_FALSE(f->samples.empty()) << name;
    for (const testing::PromSample& s : f->samples) {
      EXPECT_EQ(s.labels.at("model_name"), kModel);
      // KV transfer and failover series are deployment-wide: no instance label.
      if (name.rfind("headway:kv_transfer", 0) != 0 && name.rfind("headway:pd_", 0) != 0 &&
          name != "headway:requests_moved_total" && name != "headway:instance_drains_total") {
        const std::string& inst = s.labels.at("instance");
        EXPECT_TRUE(inst == "0" || inst == "1" || inst == "unknown") << inst;
      }
      // Every instance starts down: no worker has registered.
      const bool down = name == "headway:instance_state" && s.labels.at("state") == "down";
      EXPECT_EQ(s.value, down ? 1.0 : 0.0) << s.name;
    }
  }
  for (int id : {0, 1}) {
    for (const char* reason : {"stop", "length", "abort"}) {
      EXPECT_EQ(Get(e, "headway:request_success_total", With(Inst(id), "finished_reason", reason)),
                0.0);
    }
  }
  // One rank gauge per TP rank: instance 1 has tp_size 3.
  EXPECT_EQ(e.FindFamily("headway:kv_cache_rank_usage_perc")->samples.size(), 4u);
  Get(e, "headway:kv_cache_rank_usage_perc", With(Inst(1), "tp_rank", "2"));
}

// vLLM's bucket bounds (vllm/v1/metrics/loggers.py), as the le labels read.
TEST(ServingMetricsTest, BucketBoundsAreVllms) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics({1});
  PromExposition e = Scrape(*m);
  auto les = [&](const std::string& name) {
    std::vector<std::string> out;
    for (const auto* s : e.Samples(name + "_bucket")) out.push_back(s->labels.at("le"));
    return out;
  };
  EXPECT_EQ(les("headway:time_to_first_token_seconds"),
            (std::vector<std::string>{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06",
                                      "0.08",  "0.1",   "0.25", "0.5",  "0.75", "1",
                                      "2.5",   "5",     "7.5",  "10",   "20",   "40",
                                      "80",    "160",   "640",  "2560", "+Inf"}));
  EXPECT_EQ(les("headway:inter_token_latency_seconds"),
            (std::vector<std::string>{"0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2",
                                      "0.3",  "0.4",   "0.5",  "0.75",  "1",   "2.5",  "5",
                                      "7.5",  "10",    "20",   "40",    "80",  "+Inf"}));
  const std::vector<std::string> request_latency = {
      "0.3", "0.5", "0.8", "1",   "1.5", "2",   "2.5", "5",   "10",   "15",   "20",
      "30",  "40",  "50",  "60",  "120", "240", "480", "960", "1920", "7680", "+Inf"};
  EXPECT_EQ(les("headway:e2e_request_latency_seconds"), request_latency);
  EXPECT_EQ(les("headway:request_queue_time_seconds"), request_latency);
}

// A deterministic workload over two instances; every counter and histogram
// count must equal what the calls put in.
TEST(ServingMetricsTest, CountersAgreeWithCalls) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics();
  struct Req {
    int instance;
    int prompt_tokens;
    int generation_tokens;
    FinishReason reason;
  };
  std::vector<Req> reqs;
  for (int i = 0; i < 37; ++i) {
    FinishReason reason = i % 5 == 0 ? FinishReason::kAbort
                          : i % 3 == 0 ? FinishReason::kStop : FinishReason::kLength;
    reqs.push_back({i % 2, 5 + 7 * i, 1 + (i * 11) % 17, reason});
  }
  struct Want {
    double prompt = 0, gen = 0, itl_n = 0, itl_sum = 0, ttft_sum = 0, queries = 0, hits = 0;
    double n = 0, stop = 0, length = 0, abort = 0;
  } want[2];
  for (const Req& r : reqs) {
    Want& w = want[r.instance];
    m->OnScheduled(r.instance, 0.002 * r.prompt_tokens);
    m->OnPrefixCacheQuery(r.instance, r.prompt_tokens, r.prompt_tokens / 2);
    m->OnFirstToken(r.instance, 0.01 * r.prompt_tokens);
    for (int t = 1; t < r.generation_tokens; ++t) {
      m->OnToken(r.instance, 0.02 + 0.001 * t);
      w.itl_n += 1;
      w.itl_sum += 0.02 + 0.001 * t;
    }
    m->OnFinished(r.instance, r.reason, 1.5 * r.generation_tokens, r.prompt_tokens,
                  r.generation_tokens);
    w.prompt += r.prompt_tokens;
    w.gen += r.generation_tokens;
    w.ttft_sum += 0.01 * r.prompt_tokens;
    w.queries += r.prompt_tokens;
    w.hits += r.prompt_tokens / 2;
    w.n += 1;
    (r.reason == FinishReason::kStop ? w.stop : r.reason == FinishReason::kLength ? w.length : w.abort) += 1;
  }
  m->OnPreemption(1);
  m->OnPreemption(1, 3);
  m->SetQueueState(0, 4, 9);

  PromExposition e = Scrape(*m);
  for (int id : {0, 1}) {
    SCOPED_TRACE("instance " + std::to_string(id));
    const Want& w = want[id];
    const PromLabels l = Inst(id);
    EXPECT_EQ(Get(e, "headway:prompt_tokens_total", l), w.prompt);
    EXPECT_EQ(Get(e, "headway:generation_tokens_total", l), w.gen);
    EXPECT_EQ(Get(e, "headway:prefix_cache_queries_total", l), w.queries);
    EXPECT_EQ(Get(e, "headway:prefix_cache_hits_total", l), w.hits);
    EXPECT_EQ(Get(e, "headway:request_success_total", With(l, "finished_reason", "stop")), w.stop);
    EXPECT_EQ(Get(e, "headway:request_success_total", With(l, "finished_reason", "length")),
              w.length);
    EXPECT_EQ(Get(e, "headway:request_success_total", With(l, "finished_reason", "abort")),
              w.abort);
    for (const char* h : {"headway:time_to_first_token_seconds", "headway:e2e_request_latency_seconds",
                          "headway:request_queue_time_seconds"}) {
      EXPECT_EQ(Get(e, std::string(h) + "_count", l), w.n) << h;
    }
    EXPECT_EQ(Get(e, "headway:inter_token_latency_seconds_count", l), w.itl_n);
    EXPECT_NEAR(Get(e, "headway:inter_token_latency_seconds_sum", l), w.itl_sum, 1e-9);
    EXPECT_NEAR(Get(e, "headway:time_to_first_token_seconds_sum", l), w.ttft_sum, 1e-9);
    EXPECT_NEAR(Get(e, "headway:e2e_request_latency_seconds_sum", l), 1.5 * w.gen, 1e-9);
    EXPECT_EQ(Get(e, "headway:metrics_rejected_observations_total", l), 0.0);
  }
  EXPECT_EQ(Get(e, "headway:num_preemptions_total", Inst(0)), 0.0);
  EXPECT_EQ(Get(e, "headway:num_preemptions_total", Inst(1)), 4.0);
  EXPECT_EQ(Get(e, "headway:num_requests_running", Inst(0)), 4.0);
  EXPECT_EQ(Get(e, "headway:num_requests_waiting", Inst(0)), 9.0);
  EXPECT_EQ(Get(e, "headway:num_requests_running", Inst(1)), 0.0);
}

TEST(ServingMetricsTest, ObservationsLandInInclusiveBuckets) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics({1});
  m->OnFirstToken(0, 0.001);   // le="0.001" (bounds are inclusive)
  m->OnFirstToken(0, 0.0011);  // le="0.005"
  m->OnFirstToken(0, 3000.0);  // only +Inf
  PromExposition e = Scrape(*m);
  auto bucket = [&](const std::string& le) {
    return Get(e, "headway:time_to_first_token_seconds_bucket", With(Inst(0), "le", le));
  };
  EXPECT_EQ(bucket("0.001"), 1.0);
  EXPECT_EQ(bucket("0.005"), 2.0);
  EXPECT_EQ(bucket("2560"), 2.0);
  EXPECT_EQ(bucket("+Inf"), 3.0);
}

TEST(ServingMetricsTest, KvUsageIsTheFullestRank) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics();
  m->SetKvUsage(1, 0, 10, 100);
  m->SetKvUsage(1, 2, 50, 100);
  m->SetKvUsage(0, 0, 0, 0);  // not ready yet: reads as 0
  PromExposition e = Scrape(*m);
  EXPECT_EQ(Get(e, "headway:kv_cache_usage_perc", Inst(1)), 0.5);
  EXPECT_EQ(Get(e, "headway:kv_cache_rank_usage_perc", With(Inst(1), "tp_rank", "0")), 0.1);
  EXPECT_EQ(Get(e, "headway:kv_cache_rank_usage_perc", With(Inst(1), "tp_rank", "2")), 0.5);
  EXPECT_EQ(Get(e, "headway:kv_cache_usage_perc", Inst(0)), 0.0);
  m->SetKvUsage(1, 2, 20, 100);
  e = Scrape(*m);
  EXPECT_EQ(Get(e, "headway:kv_cache_usage_perc", Inst(1)), 0.2);
  m->SetKvUsage(1, 1, 100, 100);
  e = Scrape(*m);
  EXPECT_EQ(Get(e, "headway:kv_cache_usage_perc", Inst(1)), 1.0);
}

TEST(ServingMetricsTest, InvalidCallsChangeOnlyTheRejectedCounter) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics();
  m->OnFinished(0, FinishReason::kStop, 1.0, 10, 5);
  const std::string before = m->RenderPrometheus();
  m->OnFirstToken(2, 0.1);     // unknown instance
  m->OnToken(-1, 0.1);         // unknown instance
  m->OnScheduled(0, -0.5);     // negative duration
  m->OnFirstToken(0, std::nan(""));
  m->OnToken(0, std::numeric_limits<double>::infinity());
  m->OnFinished(0, FinishReason::kNone, 1.0, 1, 1);
  m->OnFinished(0, FinishReason::kStop, 1.0, -1, 1);
  m->OnFinished(0, FinishReason::kStop, 1.0, 1, -1);
  m->OnPreemption(0, -1);
  m->OnPrefixCacheQuery(0, 10, 11);
  m->OnPrefixCacheQuery(0, 10, -1);
  m->SetQueueState(0, -1, 0);
  m->SetKvUsage(0, 1, 1, 10);   // instance 0 has tp_size 1
  m->SetKvUsage(0, -1, 1, 10);
  m->SetKvUsage(0, 0, 11, 10);
  m->OnStep(0, -0.001, 0.0);
  m->OnStep(0, 0.001, std::nan(""));
  m->OnStepGap(0, std::nan(""));
  m->OnStep(5, 0.01, 0.0);  // unknown instance
  PromExposition e = Scrape(*m);
  EXPECT_EQ(Get(e, "headway:metrics_rejected_observations_total",
                {{"model_name", kModel}, {"instance", "unknown"}}),
            3.0);
  EXPECT_EQ(Get(e, "headway:metrics_rejected_observations_total", Inst(0)), 16.0);
  // Everything else is as before the invalid calls.
  Result<PromExposition> b = ParsePrometheusText(before);
  ASSERT_TRUE(b.ok());
  for (const auto& f : e.families) {
    if (f.name == "headway:metrics_rejected_observations_total") continue;
    for (const auto& s : f.samples) {
      EXPECT_EQ(b->Value(s.name, s.labels), s.value) << s.name;
    }
  }
}

// One observation per prefill rank's send, in the KV transfer buckets; an
// invalid duration counts as rejected under instance "unknown" (the series
// has no instance).
TEST(ServingMetricsTest, TransferSendTimesAreObservedAndInvalidOnesRejected) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics();
  m->OnKvTransferSent(0.02);
  m->OnKvTransferSent(0.25);
  m->OnKvTransferSent(-1.0);
  m->OnKvTransferSent(std::nan(""));
  PromExposition e = Scrape(*m);
  const PromLabels model = {{"model_name", kModel}};
  EXPECT_EQ(Get(e, "headway:kv_transfer_send_seconds_count", model), 2.0);
  EXPECT_DOUBLE_EQ(Get(e, "headway:kv_transfer_send_seconds_sum", model), 0.27);
  EXPECT_EQ(Get(e, "headway:kv_transfer_send_seconds_bucket", With(model, "le", "0.025")), 1.0);
  EXPECT_EQ(Get(e, "headway:kv_transfer_send_seconds_bucket", With(model, "le", "0.3")), 2.0);
  EXPECT_EQ(Get(e, "headway:metrics_rejected_observations_total",
                {{"model_name", kModel}, {"instance", "unknown"}}),
            2.0);
}

// The step protocol's two halves land per instance in buckets fine enough
// for a CPU decode step (milliseconds) and the coordinator's gap between
// steps (tens of microseconds).
TEST(ServingMetricsTest, StepAndGapTimesArePerInstance) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics();
  m->OnStep(1, 0.006, 0.0055);
  m->OnStep(1, 0.15, 0.12);
  m->OnStepGap(1, 0.00004);
  m->OnStepGap(1, 0.0003);
  PromExposition e = Scrape(*m);
  EXPECT_EQ(Get(e, "headway:step_seconds_count", Inst(1)), 2.0);
  EXPECT_DOUBLE_EQ(Get(e, "headway:step_seconds_sum", Inst(1)), 0.156);
  EXPECT_EQ(Get(e, "headway:step_seconds_bucket", With(Inst(1), "le", "0.01")), 1.0);
  EXPECT_EQ(Get(e, "headway:step_seconds_bucket", With(Inst(1), "le", "0.25")), 2.0);
  EXPECT_DOUBLE_EQ(Get(e, "headway:step_worker_seconds_sum", Inst(1)), 0.1255);
  EXPECT_EQ(Get(e, "headway:step_worker_seconds_bucket", With(Inst(1), "le", "0.1")), 1.0);
  EXPECT_EQ(Get(e, "headway:step_gap_seconds_bucket", With(Inst(1), "le", "5e-05")), 1.0);
  EXPECT_EQ(Get(e, "headway:step_gap_seconds_bucket", With(Inst(1), "le", "5e-04")), 2.0);
  EXPECT_EQ(Get(e, "headway:step_seconds_count", Inst(0)), 0.0);
  EXPECT_EQ(Get(e, "headway:step_gap_seconds_count", Inst(0)), 0.0);
}

TEST(ServingMetricsTest, ConcurrentCallersAreCountedExactly) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics({1, 1});
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        m->OnToken(t % 2, 0.01);
        m->OnFinished(t % 2, FinishReason::kLength, 0.5, 3, 1);
        m->SetKvUsage(t % 2, 0, i % 10, 10);
      }
    });
  }
  for (int i = 0; i < 20; ++i) Scrape(*m);  // concurrent scrapes parse
  for (auto& th : threads) th.join();
  PromExposition e = Scrape(*m);
  for (int id : {0, 1}) {
    EXPECT_EQ(Get(e, "headway:prompt_tokens_total", Inst(id)), 2 * kPerThread * 3.0);
    EXPECT_EQ(Get(e, "headway:inter_token_latency_seconds_count", Inst(id)), 2 * kPerThread);
    EXPECT_EQ(Get(e, "headway:request_success_total", With(Inst(id), "finished_reason", "length")),
              2 * kPerThread);
  }
}

// The exposition for a fixed workload equals the stored file, and
// prometheus_client parsed that file (when the test data was made) into
// the same samples as Headway's parser does.
TEST(ServingMetricsTest, GoldenRenderAgreesWithPrometheusClient) {
  std::unique_ptr<ServingMetrics> m = MakeMetrics({1, 3});
  m->OnRouted(1, 192);
  m->OnLocalPrefill(LocalPrefillReason::kPrefillQueueFull);
  m->OnKvTransferFallback(TransferFallbackReason::kPrefillInstanceDown);
  m->OnScheduled(0, 0.25);
  m->OnPrefixCacheQuery(0, 256, 192);
  m->OnFirstToken(0, 0.375);
  m->OnToken(0, 0.05);
  m->OnToken(0, 0.0625);
  m->OnFinished(0, FinishReason::kLength, 0.5, 256, 3);
  m->OnScheduled(1, 0.0);
  m->OnFirstToken(1, 0.125);
  m->OnFinished(1, FinishReason::kAbort, 2.0, 17, 1);
  m->OnPreemption(1);
  m->OnKvBlocksRecycled(0, 12);
  m->SetQueueState(0, 1, 2);
  m->SetKvUsage(1, 1, 3, 8);
  m->SetKvArenaChunks(0, 0, "float32", 5);
  m->SetKvArenaChunks(0, 0, "q8_0", 2);
  m->SetKvArenaChunks(0, 0, "free", 1);
  m->SetInstanceState(0, InstanceState::kReady);
  m->SetInstanceState(1, InstanceState::kDraining);
  m->OnInstanceDrained();
  const std::string text = m->RenderPrometheus();

  std::string golden = testing::ReadText(testing::TestDataPath("prometheus/headway_rendered.txt"));
  // Drop the leading "# made by" comment: it is not part of the render.
  if (golden.rfind("# made by", 0) == 0) golden = golden.substr(golden.find('\n') + 1);
  if (text != golden) {
    const std::string actual = ::testing::TempDir() + "headway_rendered.actual.txt";
    std::ofstream(actual) << text;
    ADD_FAILURE() << "render differs from tests/data/prometheus/headway_rendered.txt; actual in "
                  << actual;
  }
  PromExposition e = Scrape(*m);
  nlohmann::json reference =
      nlohmann::json::parse(
          testing::ReadText(testing::TestDataPath("prometheus/headway_rendered.json")));
  std::vector<const testing::PromSample*> mine;
  for (const auto& f : e.families) {
    for (const auto& s : f.samples) mine.push_back(&s);
  }
  const nlohmann::json& samples = reference.at("samples");
  ASSERT_EQ(mine.size(), samples.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i]->name, samples[i].at("name").get<std::string>()) << i;
    EXPECT_EQ(mine[i]->labels, samples[i].at("labels").get<PromLabels>()) << i;
    EXPECT_EQ(mine[i]->value, std::strtod(samples[i].at("value").get<std::string>().c_str(), nullptr))
        << i;
  }
}

}  // namespace
}  // namespace headway
