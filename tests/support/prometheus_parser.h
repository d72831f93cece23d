// A strict parser for the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/), for tests
// that must read /metrics as a scraper would rather than grep it.
//
// Grammar checked, line by line (every line ends with '\n'):
//   # HELP <metric_name> <docstring>     escapes \\ and \n only
//   # TYPE <metric_name> <counter|gauge|histogram|summary|untyped>
//   # <anything else>                    a comment, ignored
//   <metric_name>[{<label>="<value>",...}] <value> [<timestamp_ms>]
//   (empty lines are ignored)
// metric_name [a-zA-Z_:][a-zA-Z0-9_:]*; label names [a-zA-Z_][a-zA-Z0-9_]*
// and not __-prefixed, each at most once per sample; label values escape
// \\, \" and \n only; values are Go floats (NaN, +Inf, -Inf, decimals,
// exponents); timestamps are int64.
//
// Families: the lines of one metric form one contiguous group; at most one
// HELP and one TYPE each, both before its first sample (with
// require_help_and_type, both are mandatory). Sample names must fit the
// family type: counter and gauge `x`; histogram `x_bucket`, `x_sum`,
// `x_count`; summary `x`, `x_sum`, `x_count`. The same series (name and
// label set) may not appear twice.
//
// Semantics: counter values are >= 0 and not NaN. For each histogram
// series (labels other than le): buckets carry an le label that parses as a
// float, come in strictly ascending le order, end with le="+Inf", have
// non-decreasing counts, and _sum and _count are present with _count equal
// to the +Inf bucket.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace headway::testing {

using PromLabels = std::map<std::string, std::string>;

struct PromSample {
  std::string name;  // as written, e.g. "x_bucket"
  PromLabels labels;  // unescaped values
  double value = 0.0;
  std::optional<int64_t> timestamp_ms;
};

struct PromFamily {
  std::string name;  // as in # TYPE / # HELP, or the sample name if untyped
  std::string type;  // "counter", "gauge", "histogram", "summary", "untyped"
  std::optional<std::string> help;  // unescaped
  std::vector<PromSample> samples;  // in file order
};

struct PromExposition {
  std::vector<PromFamily> families;  // in file order

  // The family named `name`, or nullptr.
  const PromFamily* FindFamily(std::string_view name) const;

  // The value of the sample called `name` whose labels are exactly
  // `labels`, or nullopt if there is none.
  std::optional<double> Value(std::string_view name, const PromLabels& labels) const;

  // Every sample called `name`, across families, in file order.
  std::vector<const PromSample*> Samples(std::string_view name) const;
};

// The sum of every sample called `name` in the Prometheus text `page` (a
// deployment-wide counter, summed over labels such as `reason`); -1 if the
// page does not parse or has no such sample.
double SumOfSamples(std::string_view page, std::string_view name);

struct PromParseOptions {
  // Every family must have # HELP and # TYPE before its samples.
  bool require_help_and_type = true;
};

// Parses and validates `text`. Errors: InvalidArgument "line N: <what>"
// for a grammar or semantic violation (see above).
Result<PromExposition> ParsePrometheusText(std::string_view text, PromParseOptions options = {});

}  // namespace headway::testing
