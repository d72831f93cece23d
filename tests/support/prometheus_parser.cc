#include "tests/support/prometheus_parser.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

namespace headway::testing {
namespace {

bool IsNameStart(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// Reads the lines of one exposition, one at a time, tracking the position.
class LineCursor {
 public:
  LineCursor(std::string_view line, int line_no) : s_(line), line_no_(line_no) {}

  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  void Advance() { ++pos_; }
  // Skips blanks; returns how many.
  size_t SkipBlanks() {
    size_t n = 0;
    while (!AtEnd() && IsBlank(s_[pos_])) {
      ++pos_;
      ++n;
    }
    return n;
  }
  std::string_view Rest() const { return s_.substr(pos_); }
  // The token up to the next blank or the end.
  std::string_view Token() {
    size_t begin = pos_;
    while (!AtEnd() && !IsBlank(s_[pos_])) ++pos_;
    return s_.substr(begin, pos_ - begin);
  }
  // A metric (colon = true) or label name; empty if none starts here.
  std::string_view Name(bool colon) {
    size_t begin = pos_;
    if (AtEnd() || !IsNameStart(s_[pos_], colon)) return {};
    while (!AtEnd() && (IsNameStart(s_[pos_], colon) || IsDigit(s_[pos_]))) ++pos_;
    return s_.substr(begin, pos_ - begin);
  }

  Status Error(const std::string& what) const {
    return Status::InvalidArgument("line " + std::to_string(line_no_) + ": " + what);
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  int line_no_;
};

// A Go float as the format allows it; nullopt if malformed.
std::optional<double> ParseValue(std::string_view token) {
  std::string t(token);
  std::string lower;
  for (char c : t) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (lower == "+inf" || lower == "inf") return std::numeric_limits<double>::infinity();
  if (lower == "-inf") return -std::numeric_limits<double>::infinity();
  // [+-]? (d+ (. d*)? | . d+) ([eE] [+-]? d+)?
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
  size_t int_digits = 0, frac_digits = 0;
  while (i < t.size() && IsDigit(t[i])) ++i, ++int_digits;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && IsDigit(t[i])) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return std::nullopt;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < t.size() && IsDigit(t[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return std::nullopt;
  }
  if (i != t.size()) return std::nullopt;
  errno = 0;
  double v = std::strtod(t.c_str(), nullptr);
  if (errno == ERANGE && std::isinf(v)) return std::nullopt;
  return v;
}

std::optional<int64_t> ParseTimestamp(std::string_view token) {
  size_t i = 0;
  if (i < token.size() && (token[i] == '+' || token[i] == '-')) ++i;
  if (i == token.size()) return std::nullopt;
  for (size_t j = i; j < token.size(); ++j) {
    if (!IsDigit(token[j])) return std::nullopt;
  }
  errno = 0;
  long long v = std::strtoll(std::string(token).c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(v);
}

// Reads an escaped string up to (not including) `terminator`, or the end of
// the line when terminator is '\0'. Allowed escapes: \\, \n, and \" if
// quote_escape.
Result<std::string> ReadEscaped(LineCursor& c, char terminator, bool quote_escape) {
  std::string out;
  while (true) {
    if (c.AtEnd()) {
      if (terminator == '\0') return out;
      return c.Error("unterminated label value");
    }
    char ch = c.Peek();
    if (ch == terminator) return out;
    c.Advance();
    if (ch != '\\') {
      out += ch;
      continue;
    }
    if (c.AtEnd()) return c.Error("escape at end of line");
    char e = c.Peek();
    c.Advance();
    if (e == '\\') {
      out += '\\';
    } else if (e == 'n') {
      out += '\n';
    } else if (e == '"' && quote_escape) {
      out += '"';
    } else {
      return c.Error(std::string("invalid escape sequence \\") + e);
    }
  }
}

bool ValidLabelName(std::string_view name) { return name.substr(0, 2) != "__"; }

Result<PromLabels> ReadLabels(LineCursor& c) {
  PromLabels labels;
  c.Advance();  // '{'
  c.SkipBlanks();
  while (c.Peek() != '}') {
    std::string_view name = c.Name(false);
    if (name.empty()) return c.Error("expected a label name");
    if (!ValidLabelName(name)) return c.Error("label name " + std::string(name) + " is reserved");
    c.SkipBlanks();
    if (c.Peek() != '=') return c.Error("expected '=' after label " + std::string(name));
    c.Advance();
    c.SkipBlanks();
    if (c.Peek() != '"') return c.Error("expected '\"' to open the value of " + std::string(name));
    c.Advance();
    HW_ASSIGN_OR_RETURN(std::string value, ReadEscaped(c, '"', true));
    c.Advance();  // closing '"'
    if (!labels.emplace(std::string(name), std::move(value)).second) {
      return c.Error("label " + std::string(name) + " repeated");
    }
    c.SkipBlanks();
    if (c.Peek() == ',') {
      c.Advance();
      c.SkipBlanks();
    } else if (c.Peek() != '}') {
      return c.Error("expected ',' or '}' after a label value");
    }
  }
  c.Advance();  // '}'
  return labels;
}

bool IsKnownType(std::string_view type) {
  return type == "counter" || type == "gauge" || type == "histogram" || type == "summary" ||
         type == "untyped";
}

// True if a sample called `sample` belongs to `family` of `type`.
bool SampleFits(const std::string& family, const std::string& type, std::string_view sample) {
  if (type == "histogram") {
    return sample == family + "_bucket" || sample == family + "_sum" || sample == family + "_count";
  }
  if (type == "summary") {
    return sample == family || sample == family + "_sum" || sample == family + "_count";
  }
  return sample == family;
}

std::string Describe(const PromSample& s) {
  std::string out = s.name + "{";
  bool first = true;
  for (const auto& [k, v] : s.labels) {
    if (!first) out += ",";
    first = false;
    out += k + "=\"" + v + "\"";
  }
  return out + "}";
}

Status CheckHistogram(const PromFamily& f) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, count) in file order
    std::optional<double> sum, count;
  };
  std::map<PromLabels, Series> series;
  for (const PromSample& s : f.samples) {
    PromLabels key = s.labels;
    if (s.name == f.name + "_bucket") {
      auto le = key.find("le");
      if (le == key.end()) return Status::InvalidArgument(Describe(s) + ": bucket without le");
      std::optional<double> bound = ParseValue(le->second);
      if (!bound || std::isnan(*bound)) {
        return Status::InvalidArgument(Describe(s) + ": le is not a number");
      }
      key.erase(le);
      if (!(s.value >= 0)) return Status::InvalidArgument(Describe(s) + ": negative or NaN count");
      series[key].buckets.emplace_back(*bound, s.value);
    } else {
      if (key.count("le")) return Status::InvalidArgument(Describe(s) + ": le on _sum/_count");
      (s.name == f.name + "_sum" ? series[key].sum : series[key].count) = s.value;
    }
  }
  for (const auto& [labels, s] : series) {
    const std::string where = "histogram " + f.name;
    if (s.buckets.empty()) return Status::InvalidArgument(where + ": series without buckets");
    for (size_t i = 1; i < s.buckets.size(); ++i) {
      if (!(s.buckets[i - 1].first < s.buckets[i].first)) {
        return Status::InvalidArgument(where + ": le bounds not strictly ascending");
      }
      if (s.buckets[i].second < s.buckets[i - 1].second) {
        return Status::InvalidArgument(where + ": bucket counts decrease");
      }
    }
    if (!std::isinf(s.buckets.back().first)) {
      return Status::InvalidArgument(where + ": no le=\"+Inf\" bucket");
    }
    if (!s.sum) return Status::InvalidArgument(where + ": missing _sum");
    if (!s.count) return Status::InvalidArgument(where + ": missing _count");
    if (*s.count != s.buckets.back().second) {
      return Status::InvalidArgument(where + ": _count differs from the +Inf bucket");
    }
  }
  return Status::Ok();
}

Status CheckFamily(const PromFamily& f) {
  if (f.type == "counter") {
    for (const PromSample& s : f.samples) {
      if (!(s.value >= 0)) return Status::InvalidArgument(Describe(s) + ": counter negative or NaN");
    }
  } else if (f.type == "histogram") {
    return CheckHistogram(f);
  } else if (f.type == "summary") {
    for (const PromSample& s : f.samples) {
      if (s.name == f.name && !s.labels.count("quantile")) {
        return Status::InvalidArgument(Describe(s) + ": summary sample without quantile");
      }
    }
  }
  return Status::Ok();
}

struct ParseState {
  PromExposition out;
  std::set<std::string> seen_families;  // names of families opened so far
  bool has_type = false;                // of the current (last) family
  std::set<std::pair<std::string, PromLabels>> seen_series;  // of the current family

  PromFamily* Current() { return out.families.empty() ? nullptr : &out.families.back(); }

  // Opens a family called `name` unless it is the current one.
  Status Open(LineCursor& c, const std::string& name) {
    PromFamily* cur = Current();
    if (cur != nullptr && cur->name == name) return Status::Ok();
    if (!seen_families.insert(name).second) {
      return c.Error("lines of metric " + name + " are not one contiguous group");
    }
    out.families.push_back(PromFamily{name, "untyped", std::nullopt, {}});
    has_type = false;
    seen_series.clear();
    return Status::Ok();
  }
};

Status ParseDirective(LineCursor& c, ParseState& st) {
  c.Advance();  // '#'
  c.SkipBlanks();
  std::string_view keyword = c.Token();
  if (keyword != "HELP" && keyword != "TYPE") return Status::Ok();  // a comment
  if (c.SkipBlanks() == 0) return c.Error("expected a metric name after " + std::string(keyword));
  std::string name(c.Name(true));
  if (name.empty()) return c.Error("invalid metric name in # " + std::string(keyword));
  HW_RETURN_IF_ERROR(st.Open(c, name));
  PromFamily& f = *st.Current();
  if (!f.samples.empty()) {
    return c.Error("# " + std::string(keyword) + " for " + name + " after its samples");
  }
  if (keyword == "HELP") {
    if (f.help) return c.Error("second # HELP for " + name);
    std::string help;
    if (!c.AtEnd()) {
      if (!IsBlank(c.Peek())) return c.Error("invalid metric name in # HELP");
      c.Advance();  // one blank separates the name from the docstring
      HW_ASSIGN_OR_RETURN(help, ReadEscaped(c, '\0', false));
    }
    f.help = std::move(help);
    return Status::Ok();
  }
  if (st.has_type) return c.Error("second # TYPE for " + name);
  if (c.SkipBlanks() == 0) return c.Error("expected a type after # TYPE " + name);
  std::string_view type = c.Token();
  if (!IsKnownType(type)) return c.Error("unknown metric type '" + std::string(type) + "'");
  c.SkipBlanks();
  if (!c.AtEnd()) return c.Error("text after the type in # TYPE " + name);
  f.type = std::string(type);
  st.has_type = true;
  return Status::Ok();
}

Status ParseSample(LineCursor& c, ParseState& st, const PromParseOptions& options) {
  PromSample sample;
  sample.name = std::string(c.Name(true));
  if (sample.name.empty()) return c.Error("invalid metric name");
  if (c.Peek() == '{') {
    HW_ASSIGN_OR_RETURN(sample.labels, ReadLabels(c));
  }
  if (c.SkipBlanks() == 0) return c.Error("expected a blank before the value of " + sample.name);
  std::string_view value_token = c.Token();
  std::optional<double> value = ParseValue(value_token);
  if (!value) return c.Error("invalid value '" + std::string(value_token) + "'");
  sample.value = *value;
  if (c.SkipBlanks() > 0 && !c.AtEnd()) {
    std::string_view ts_token = c.Token();
    std::optional<int64_t> ts = ParseTimestamp(ts_token);
    if (!ts) return c.Error("invalid timestamp '" + std::string(ts_token) + "'");
    sample.timestamp_ms = ts;
    c.SkipBlanks();
  }
  if (!c.AtEnd()) return c.Error("unexpected text after the sample: '" + std::string(c.Rest()) + "'");

  PromFamily* cur = st.Current();
  if (cur == nullptr || !SampleFits(cur->name, cur->type, sample.name)) {
    if (options.require_help_and_type) {
      return c.Error("sample " + sample.name + " has no # TYPE of its family before it");
    }
    HW_RETURN_IF_ERROR(st.Open(c, sample.name));
    cur = st.Current();
  }
  if (options.require_help_and_type && (!cur->help || !st.has_type)) {
    return c.Error("family " + cur->name + " lacks # HELP or # TYPE before its samples");
  }
  if (!st.seen_series.emplace(sample.name, sample.labels).second) {
    return c.Error("series " + Describe(sample) + " appears twice");
  }
  cur->samples.push_back(std::move(sample));
  return Status::Ok();
}

}  // namespace

const PromFamily* PromExposition::FindFamily(std::string_view name) const {
  for (const PromFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::optional<double> PromExposition::Value(std::string_view name, const PromLabels& labels) const {
  for (const PromFamily& f : families) {
    for (const PromSample& s : f.samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
  }
  return std::nullopt;
}

std::vector<const PromSample*> PromExposition::Samples(std::string_view name) const {
  std::vector<const PromSample*> out;
  for (const PromFamily& f : families) {
    for (const PromSample& s : f.samples) {
      if (s.name == name) out.push_back(&s);
    }
  }
  return out;
}

double SumOfSamples(std::string_view page, std::string_view name) {
  Result<PromExposition> metrics = ParsePrometheusText(page);
  if (!metrics.ok()) return -1;
  std::vector<const PromSample*> samples = metrics->Samples(name);
  double sum = 0;
  for (const PromSample* s : samples) sum += s->value;
  return samples.empty() ? -1 : sum;
}

Result<PromExposition> ParsePrometheusText(std::string_view text, PromParseOptions options) {
  ParseState st;
  if (!text.empty() && text.back() != '\n') {
    return Status::InvalidArgument("the last line does not end with a line feed");
  }
  int line_no = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    LineCursor c(line, line_no);
    if (line.empty()) continue;
    if (line[0] == '#') {
      HW_RETURN_IF_ERROR(ParseDirective(c, st));
    } else {
      HW_RETURN_IF_ERROR(ParseSample(c, st, options));
    }
  }
  for (const PromFamily& f : st.out.families) {
    HW_RETURN_IF_ERROR(CheckFamily(f).WithContext("metric " + f.name));
  }
  return std::move(st.out);
}

}  // namespace headway::testing
