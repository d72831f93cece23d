// Tests of the strict Prometheus text parser that the metrics tests rely on:
// it must accept what real exporters write and reject each kind of mistake.
#include "tests/support/prometheus_parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/test_env.h"
#include "tests/support/process.h"

namespace headway::testing {
namespace {

// Samples of `expo` flattened as the reference JSON holds them.
void ExpectMatchesReference(const PromExposition& expo, const nlohmann::json& reference) {
  std::vector<std::pair<const PromSample*, std::string>> mine;
  for (const PromFamily& f : expo.families) {
    for (const PromSample& s : f.samples) mine.emplace_back(&s, f.type);
  }
  const nlohmann::json& samples = reference.at("samples");
  ASSERT_EQ(mine.size(), samples.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const PromSample& s = *mine[i].first;
    const nlohmann::json& r = samples[i];
    SCOPED_TRACE("sample " + std::to_string(i) + " " + s.name);
    EXPECT_EQ(s.name, r.at("name").get<std::string>());
    EXPECT_EQ(s.labels, r.at("labels").get<PromLabels>());
    EXPECT_EQ(mine[i].second, r.at("type").get<std::string>());
    double want = std::strtod(r.at("value").get<std::string>().c_str(), nullptr);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(s.value));
    } else {
      EXPECT_DOUBLE_EQ(s.value, want);
    }
  }
}

constexpr const char kGood[] =
    "# A comment the parser ignores.\n"
    "# HELP x_total Things.\\nMore \\\\ things.\n"
    "# TYPE x_total counter\n"
    "x_total{a=\"1\",b=\"q\\\"\\\\\\n\"} 3\n"
    "x_total{a=\"2\"} 4.5e1 1700000000000\n"
    "\n"
    "# TYPE g gauge\n"
    "# HELP g\n"
    "g -Inf\n"
    "# HELP h Latency.\n"
    "# TYPE h histogram\n"
    "h_bucket{m=\"a\",le=\"0.1\"} 1\n"
    "h_bucket{m=\"a\",le=\"1\"} 2\n"
    "h_bucket{m=\"a\",le=\"+Inf\"} 2\n"
    "h_sum{m=\"a\"} 0.6\n"
    "h_count{m=\"a\"} 2\n"
    "h_bucket{m=\"b\",le=\"+Inf\",} 0\n"
    "h_sum{m=\"b\"} 0\n"
    "h_count{m=\"b\"} 0\n";

TEST(PrometheusParserTest, ParsesValidExposition) {
  Result<PromExposition> r = ParsePrometheusText(kGood);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->families.size(), 3u);
  const PromFamily& x = r->families[0];
  EXPECT_EQ(x.name, "x_total");
  EXPECT_EQ(x.type, "counter");
  EXPECT_EQ(*x.help, "Things.\nMore \\ things.");
  ASSERT_EQ(x.samples.size(), 2u);
  EXPECT_EQ(x.samples[0].labels.at("b"), "q\"\\\n");
  EXPECT_EQ(x.samples[1].value, 45.0);
  EXPECT_EQ(x.samples[1].timestamp_ms, 1700000000000);
  EXPECT_EQ(*r->FindFamily("g")->help, "");
  EXPECT_EQ(r->Value("g", {}), -INFINITY);
  EXPECT_EQ(r->Value("h_count", {{"m", "a"}}), 2.0);
  EXPECT_EQ(r->Value("h_bucket", {{"m", "b"}, {"le", "+Inf"}}), 0.0);
  EXPECT_EQ(r->Samples("h_bucket").size(), 4u);
  EXPECT_FALSE(r->Value("x_total", {{"a", "3"}}).has_value());
}

TEST(PrometheusParserTest, EmptyTextIsValid) {
  Result<PromExposition> r = ParsePrometheusText("");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->families.empty());
}

TEST(PrometheusParserTest, UntypedSamplesNeedRelaxedOptions) {
  EXPECT_FALSE(ParsePrometheusText("up 1\n").ok());
  Result<PromExposition> r = ParsePrometheusText("up 1\nup{job=\"x\"} NaN\n", {false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->families[0].type, "untyped");
  EXPECT_TRUE(std::isnan(r->families[0].samples[1].value));
}

struct BadCase {
  const char* what;
  const char* text;
};

TEST(PrometheusParserTest, RejectsEachKindOfMistake) {
  const std::string head = "# HELP c Help.\n# TYPE c counter\n";
  const std::string hist = "# HELP h Help.\n# TYPE h histogram\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"no final newline", head + "c 1"},
      {"bad metric name", "# HELP 1c Help.\n# TYPE 1c counter\n1c 1\n"},
      {"bad char in name", head + "c-x 1\n"},
      {"bad label name", head + "c{1a=\"x\"} 1\n"},
      {"reserved label name", head + "c{__name__=\"x\"} 1\n"},
      {"repeated label", head + "c{a=\"x\",a=\"y\"} 1\n"},
      {"unquoted label value", head + "c{a=x} 1\n"},
      {"unterminated label value", head + "c{a=\"x} 1\n"},
      {"bad escape in label", head + "c{a=\"\\t\"} 1\n"},
      {"missing brace", head + "c{a=\"x\" 1\n"},
      {"missing comma", head + "c{a=\"x\" b=\"y\"} 1\n"},
      {"bad value", head + "c 1.2.3\n"},
      {"hex value", head + "c 0x10\n"},
      {"no value", head + "c\n"},
      {"bad timestamp", head + "c 1 12.5\n"},
      {"trailing text", head + "c 1 2 3\n"},
      {"bad escape in help", "# HELP c a\\tb\n# TYPE c counter\nc 1\n"},
      {"unknown type", "# HELP c Help.\n# TYPE c countr\nc 1\n"},
      {"text after type", "# HELP c Help.\n# TYPE c counter extra\nc 1\n"},
      {"second TYPE", head + "# TYPE c counter\nc 1\n"},
      {"second HELP", "# HELP c a\n# HELP c b\n# TYPE c counter\nc 1\n"},
      {"TYPE after samples", "# HELP c Help.\nc 1\n# TYPE c counter\n"},
      {"no HELP", "# TYPE c counter\nc 1\n"},
      {"no TYPE", "# HELP c Help.\nc 1\n"},
      {"sample of another family", head + "d 1\n"},
      {"not contiguous", head + "c{a=\"1\"} 1\n# HELP d H.\n# TYPE d gauge\nd 1\n"
                                "# HELP c Help.\n# TYPE c counter\nc{a=\"2\"} 1\n"},
      {"duplicate series", head + "c{a=\"1\"} 1\nc{a=\"1\"} 2\n"},
      {"negative counter", head + "c -1\n"},
      {"NaN counter", head + "c NaN\n"},
      {"histogram bare sample", hist + "h 1\n"},
      {"bucket without le",
       hist + "h_bucket 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"bad le", hist + "h_bucket{le=\"x\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"no +Inf bucket", hist + "h_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"},
      {"decreasing buckets",
       hist + "h_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"unsorted le",
       hist + "h_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\n"
              "h_sum 1\nh_count 1\n"},
      {"count differs from +Inf",
       hist + "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n"},
      {"missing sum", hist + "h_bucket{le=\"+Inf\"} 1\nh_count 1\n"},
      {"missing count", hist + "h_bucket{le=\"+Inf\"} 1\nh_sum 1\n"},
      {"sum without buckets", hist + "h_sum{a=\"1\"} 1\nh_count{a=\"1\"} 0\n"},
      {"le on count",
       hist + "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count{le=\"+Inf\"} 1\n"},
  };
  for (const auto& [what, text] : cases) {
    Result<PromExposition> r = ParsePrometheusText(text);
    EXPECT_FALSE(r.ok()) << what << " was accepted:\n" << text;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    }
  }
}

// prometheus_client's own output, parsed by prometheus_client when the test
// data was made: both parsers must see the same samples.
TEST(PrometheusParserTest, AgreesWithPrometheusClientOnItsOutput) {
  std::string text = ReadText(TestDataPath("prometheus/client_python.txt"));
  ASSERT_FALSE(text.empty());
  Result<PromExposition> r = ParsePrometheusText(text);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  nlohmann::json reference =
      nlohmann::json::parse(ReadText(TestDataPath("prometheus/client_python.json")));
  ExpectMatchesReference(*r, reference);
  EXPECT_EQ(*r->FindFamily("demo:requests_total")->help,
            "Requests served.\nSecond line with \\ backslash.");
}

}  // namespace
}  // namespace headway::testing
