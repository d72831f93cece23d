#include "coordinator/metrics/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "tests/support/prometheus_parser.h"

namespace headway {
namespace {

using testing::ParsePrometheusText;
using testing::PromExposition;

PromExposition MustParse(const std::string& text) {
  Result<PromExposition> r = ParsePrometheusText(text);
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n" << text;
  return r.ok() ? std::move(r).value() : PromExposition{};
}

TEST(MetricsTest, NameValidation) {
  EXPECT_TRUE(IsValidMetricName("headway:prompt_tokens_total"));
  EXPECT_TRUE(IsValidMetricName("_x9"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_TRUE(IsValidLabelName("model_name"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName(""));
}

TEST(MetricsTest, FormatsValuesAsTheFormatReadsThem) {
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(2560.0), "2560");
  EXPECT_EQ(FormatMetricValue(0.0), "0");
  EXPECT_EQ(FormatMetricValue(-2.5), "-2.5");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(std::stod(FormatMetricValue(1.0 / 3.0)), 1.0 / 3.0);
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(MetricsTest, RegistrationErrors) {
  MetricRegistry r;
  ASSERT_TRUE(r.AddCounter("x_total", "X.", {"a"}).ok());
  ASSERT_TRUE(r.AddHistogram("h", "H.", {}, {1.0}).ok());
  EXPECT_EQ(r.AddCounter("x_total", "Again.", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(r.AddGauge("h_count", "Collides with h.", {}).ok());
  // A histogram x writes x_bucket, x_sum and x_count: no clash with x_total.
  EXPECT_TRUE(r.AddHistogram("x", "X.", {}, {}).ok());
  EXPECT_FALSE(r.AddGauge("bad name", "B.", {}).ok());
  EXPECT_FALSE(r.AddGauge("g", "", {}).ok());
  EXPECT_FALSE(r.AddGauge("g", "G.", {"a", "a"}).ok());
  EXPECT_FALSE(r.AddGauge("g", "G.", {"1a"}).ok());
  EXPECT_FALSE(r.AddHistogram("h2", "H.", {"le"}, {1.0}).ok());
  EXPECT_FALSE(r.AddHistogram("h2", "H.", {}, {1.0, 1.0}).ok());
  EXPECT_FALSE(r.AddHistogram("h2", "H.", {}, {2.0, 1.0}).ok());
  EXPECT_FALSE(r.AddHistogram("h2", "H.", {}, {std::nan("")}).ok());
  EXPECT_TRUE(r.AddHistogram("h2", "H.", {}, {1.0, std::numeric_limits<double>::infinity()}).ok());
  // Nothing half-registered by the failures above.
  PromExposition e = MustParse(r.RenderPrometheus());
  std::vector<std::string> names;
  for (const auto& f : e.families) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"x_total", "h", "x", "h2"}));
}

TEST(MetricsTest, CounterNeverGoesDown) {
  MetricRegistry r;
  Result<CounterFamily*> f = r.AddCounter("c_total", "C.", {"k"});
  ASSERT_TRUE(f.ok());
  Result<Counter*> c = (*f)->WithLabels({"v"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->Increment().ok());
  EXPECT_TRUE((*c)->Increment(2.5).ok());
  EXPECT_EQ((*c)->Increment(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE((*c)->Increment(std::nan("")).ok());
  EXPECT_FALSE((*c)->Increment(std::numeric_limits<double>::infinity()).ok());
  EXPECT_EQ((*c)->value(), 3.5);
  EXPECT_FALSE((*f)->WithLabels({}).ok());
  EXPECT_FALSE((*f)->WithLabels({"a", "b"}).ok());
  // The same label values give the same series.
  EXPECT_EQ(*(*f)->WithLabels({"v"}), *c);
}

TEST(MetricsTest, RendersParseableTextWithEscapedLabels) {
  MetricRegistry r;
  CounterFamily* c = *r.AddCounter("headway:c_total", "Counts.\nWith \\ and newline.",
                                    {"model_name", "path"});
  GaugeFamily* g = *r.AddGauge("headway:g", "A gauge.", {});
  HistogramFamily* h = *r.AddHistogram("headway:h_seconds", "Latency.", {"model_name"},
                                       {0.001, 0.1, 1.0, 2560.0});
  const std::string weird = "we\"ird\\va\nlue";
  ASSERT_TRUE((*c->WithLabels({"m", "/v1/completions"}))->Increment(3).ok());
  ASSERT_TRUE((*c->WithLabels({weird, "/metrics"}))->Increment(0.5).ok());
  (*g->WithLabels({}))->Set(-2.5);
  Histogram* hm = *h->WithLabels({"m"});
  for (double v : {0.0005, 0.001, 0.05, 0.5, 3.0, 10000.0}) ASSERT_TRUE(hm->Observe(v).ok());
  EXPECT_FALSE(hm->Observe(std::nan("")).ok());

  const std::string text = r.RenderPrometheus();
  PromExposition e = MustParse(text);
  ASSERT_EQ(e.families.size(), 3u);
  EXPECT_EQ(e.families[0].type, "counter");
  EXPECT_EQ(*e.families[0].help, "Counts.\nWith \\ and newline.");
  EXPECT_EQ(e.Value("headway:c_total", {{"model_name", weird}, {"path", "/metrics"}}), 0.5);
  EXPECT_EQ(e.Value("headway:c_total", {{"model_name", "m"}, {"path", "/v1/completions"}}), 3.0);
  EXPECT_EQ(e.Value("headway:g", {}), -2.5);
  EXPECT_EQ(e.families[2].type, "histogram");
  // Bounds are inclusive: 0.001 lands in le="0.001".
  const std::vector<std::pair<std::string, double>> buckets = {
      {"0.001", 2}, {"0.1", 3}, {"1", 4}, {"2560", 5}, {"+Inf", 6}};
  for (const auto& [le, n] : buckets) {
    EXPECT_EQ(e.Value("headway:h_seconds_bucket", {{"model_name", "m"}, {"le", le}}), n) << le;
  }
  EXPECT_EQ(e.Value("headway:h_seconds_count", {{"model_name", "m"}}), 6.0);
  EXPECT_DOUBLE_EQ(*e.Value("headway:h_seconds_sum", {{"model_name", "m"}}), 10003.5515);
  // Exact text of one histogram line and the escaping, as a scraper sees it.
  EXPECT_NE(text.find("headway:h_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 6\n"),
            std::string::npos);
  EXPECT_NE(text.find("model_name=\"we\\\"ird\\\\va\\nlue\""), std::string::npos);
}

TEST(MetricsTest, FamilyWithoutSeriesRendersOnlyHeader) {
  MetricRegistry r;
  ASSERT_TRUE(r.AddHistogram("h", "H.", {"a"}, {1.0}).ok());
  EXPECT_EQ(r.RenderPrometheus(), "# HELP h H.\n# TYPE h histogram\n");
  EXPECT_TRUE(ParsePrometheusText(r.RenderPrometheus()).ok());
}

// Renders while other threads update: every snapshot parses (so each
// histogram's +Inf bucket equals its count) and counters only grow.
TEST(MetricsTest, ConcurrentUpdatesAndRenders) {
  MetricRegistry r;
  CounterFamily* c = *r.AddCounter("c_total", "C.", {"t"});
  HistogramFamily* h = *r.AddHistogram("h", "H.", {"t"}, {0.5, 1.0});
  constexpr int kThreads = 4;
  constexpr int kIters = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* ct = *c->WithLabels({std::to_string(t % 2)});
      Histogram* ht = *h->WithLabels({std::to_string(t % 2)});
      for (int i = 0; i < kIters; ++i) {
        (void)ct->Increment();
        (void)ht->Observe((i % 3) * 0.5);
      }
    });
  }
  double last_total = 0;
  for (int i = 0; i < 50; ++i) {
    PromExposition e = MustParse(r.RenderPrometheus());
    double total = 0;
    for (const auto* s : e.Samples("c_total")) total += s->value;
    EXPECT_GE(total, last_total);
    last_total = total;
  }
  for (auto& th : threads) th.join();
  PromExposition e = MustParse(r.RenderPrometheus());
  EXPECT_EQ(e.Value("c_total", {{"t", "0"}}), 2.0 * kIters);
  EXPECT_EQ(e.Value("c_total", {{"t", "1"}}), 2.0 * kIters);
  EXPECT_EQ(e.Value("h_count", {{"t", "1"}}), 2.0 * kIters);
}

}  // namespace
}  // namespace headway
