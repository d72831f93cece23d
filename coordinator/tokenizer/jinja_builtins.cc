#include "coordinator/tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace headway::jinja {
namespace {

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// trim / strip / lstrip / rstrip of string `v`: a substring, so its marks follow.
Value Strip(const Value& v, bool left, bool right, const std::string* chars = nullptr) {
  const std::string& s = v.as_string();
  auto strip = [&](char c) { return chars ? chars->find(c) != std::string::npos : IsWs(c); };
  size_t b = 0, e = s.size();
  if (left) while (b < e && strip(s[b])) ++b;
  if (right) while (e > b && strip(s[e - 1])) --e;
  return Substr(v, b, e - b);
}

// upper / lower of string `v`, byte for byte (ASCII), so its marks stay in place.
Value AsciiCase(const Value& v, bool upper) {
  std::string s = v.as_string();
  for (char& c : s) c = char(upper ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
  return Value(std::move(s), v.marks());
}

// range(stop), range(start, stop[, step]) as a list (at most 100000 items).
Result<Value> Range(std::string_view source, const Array& args, size_t pos) {
  std::vector<int64_t> n;
  for (const Value& a : args) {
    if (!a.is_int()) return SourceError(source, pos, "range() arguments must be integers");
    n.push_back(a.as_int());
  }
  if (n.empty() || n.size() > 3) return SourceError(source, pos, "range() takes 1 to 3 arguments");
  int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0];
  int64_t step = n.size() > 2 ? n[2] : 1;
  if (step == 0) return SourceError(source, pos, "range() step must not be zero");
  Array out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) return SourceError(source, pos, "range() too long");
    out.emplace_back(i);
  }
  return Value(std::move(out));
}

// str.replace(from, to) of string `v` with a non-empty `from`. What
// replaces a match that touches a marked byte is marked: content rewritten
// by the template is still content.
Value Replace(const Value& v, const Value& from, const Value& to) {
  const std::string& s = v.as_string();
  const std::string& f = from.as_string();
  const Value marked_to = Value::Marked(to.as_string());
  TextBuilder out;
  size_t at = 0, hit;
  while ((hit = s.find(f, at)) != std::string::npos) {
    out.Append(Substr(v, at, hit - at));
    const bool touches_marks =
        !v.marks().empty() && v.marks().find_first_not_of('\0', hit) < hit + f.size();
    out.Append(touches_marks ? marked_to : to);
    at = hit + f.size();
  }
  out.Append(Substr(v, at, s.size() - at));
  return out.Take();
}

// str.split(sep) of string `v`; with no (or an empty) separator, on runs of
// whitespace. The pieces keep their marks.
Array Split(const Value& v, const std::string* sep) {
  const std::string& s = v.as_string();
  Array parts;
  if (sep && !sep->empty()) {
    size_t at = 0, hit;
    while ((hit = s.find(*sep, at)) != std::string::npos) {
      parts.push_back(Substr(v, at, hit - at));
      at = hit + sep->size();
    }
    parts.push_back(Substr(v, at, s.size() - at));
  } else {
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsWs(s[i])) ++i;
      size_t j = i;
      while (j < s.size() && !IsWs(s[j])) ++j;
      if (j > i) parts.push_back(Substr(v, i, j - i));
      i = j;
    }
  }
  return parts;
}

// Argument `i` when it is a string, else null.
const std::string* StringArg(const Array& args, size_t i) {
  return i < args.size() && args[i].is_string() ? &args[i].as_string() : nullptr;
}

// A string method with these arguments; nullopt when there is none.
std::optional<Value> StringMethod(const Value& self, const std::string& m, const Array& args) {
  const std::string& s = self.as_string();
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    return Strip(self, m != "rstrip", m != "lstrip", StringArg(args, 0));
  }
  if (m == "upper" || m == "lower") return AsciiCase(self, m == "upper");
  if ((m == "startswith" || m == "endswith") && StringArg(args, 0)) {
    const std::string& x = *StringArg(args, 0);
    bool r = m == "startswith" ? s.rfind(x, 0) == 0
                               : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value(r);
  }
  if (m == "replace" && StringArg(args, 0) && StringArg(args, 1) && !StringArg(args, 0)->empty()) {
    return Replace(self, args[0], args[1]);
  }
  if (m == "split") return Value(Split(self, StringArg(args, 0)));
  return std::nullopt;
}

// A dict method with these arguments; nullopt when there is none.
std::optional<Value> ObjectMethod(const Value& self, const std::string& m, const Array& args) {
  if (m == "items" || m == "keys" || m == "values") {
    Array out;
    for (const auto& [k, v] : self.as_object()) {
      if (m == "items") out.emplace_back(Array{Value(k), v});
      else if (m == "keys") out.emplace_back(k);
      else out.push_back(v);
    }
    return Value(std::move(out));
  }
  if (m == "get" && StringArg(args, 0)) {
    Value v = self.Get(*StringArg(args, 0));
    if (!v.is_undefined()) return v;
    return args.size() > 1 ? args[1] : Value(Value::None{});
  }
  return std::nullopt;
}

Status TypeError(std::string_view source, size_t pos, const std::string& op, const Value& a,
                 const Value& b) {
  return SourceError(source, pos, "unsupported operand types for " + op + ": '" + a.TypeName() +
                                      "' and '" + b.TypeName() + "'");
}

// a in b (op "in") or a not in b (op "not in").
Result<Value> Membership(std::string_view source, const std::string& op, const Value& a,
                         const Value& b, size_t pos) {
  bool found;
  if (b.is_string()) {
    if (!a.is_string()) return TypeError(source, pos, op, a, b);
    found = b.as_string().find(a.as_string()) != std::string::npos;
  } else if (b.is_array()) {
    found = std::any_of(b.as_array().begin(), b.as_array().end(), [&](const Value& x) { return x.Equals(a); });
  } else if (b.is_object()) {
    found = a.is_string() && !b.Get(a.as_string()).is_undefined();
  } else if (b.is_undefined()) {
    found = false;
  } else {
    return TypeError(source, pos, op, a, b);
  }
  return Value(found == (op == "in"));
}

// a < b, a <= b, a > b, a >= b between numbers or between strings.
Result<Value> Compare(std::string_view source, const std::string& op, const Value& a,
                      const Value& b, size_t pos) {
  int cmp;
  if (a.is_number() && b.is_number()) {
    cmp = a.as_number() < b.as_number() ? -1 : (a.as_number() > b.as_number() ? 1 : 0);
  } else if (a.is_string() && b.is_string()) {
    cmp = a.as_string().compare(b.as_string());
  } else {
    return TypeError(source, pos, op, a, b);
  }
  bool r = op == "<" ? cmp < 0 : op == "<=" ? cmp <= 0 : op == ">" ? cmp > 0 : cmp >= 0;
  return Value(r);
}

// + - * / // % between numbers: integers stay integers (but for /), and
// // and % floor as Python's do.
Result<Value> Arithmetic(std::string_view source, const std::string& op, const Value& a,
                         const Value& b, size_t pos) {
  if (!a.is_number() || !b.is_number()) return TypeError(source, pos, op, a, b);
  if (a.is_int() && b.is_int() && op != "/") {
    int64_t x = a.as_int(), y = b.as_int();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (y == 0) return SourceError(source, pos, "division by zero");
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
      --q;
      r += y;
    }
    return Value(op == "//" ? q : r);
  }
  double x = a.as_number(), y = b.as_number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (y == 0) return SourceError(source, pos, "division by zero");
  if (op == "/") return Value(x / y);
  if (op == "//") return Value(std::floor(x / y));
  return Value(x - y * std::floor(x / y));
}

}  // namespace

std::vector<size_t> CodePointStarts(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    unsigned char c = s[i];
    if (c >= 0xF0) n = 4; else if (c >= 0xE0) n = 3; else if (c >= 0xC0) n = 2;
    n = std::min(n, s.size() - i);
    out.push_back(i);
    i += n;
  }
  out.push_back(s.size());
  return out;
}

Value Substr(const Value& s, size_t begin, size_t n) {
  std::string text = s.as_string().substr(begin, n);
  if (s.marks().empty()) return Value(std::move(text));
  return Value(std::move(text), s.marks().substr(begin, n));
}

void TextBuilder::Append(const Value& v) {
  const Value printed = v.Printed();
  const std::string& text = printed.as_string();
  if (!printed.marks().empty() && !has_marks_) {
    marks_.assign(text_.size(), '\0');
    has_marks_ = true;
  }
  text_ += text;
  if (!has_marks_) return;
  if (printed.marks().empty()) marks_.append(text.size(), '\0'); else marks_ += printed.marks();
}

void TextBuilder::AppendPlain(std::string_view text) {
  text_ += text;
  if (has_marks_) marks_.append(text.size(), '\0');
}

Value TextBuilder::Take() {
  Value v(std::move(text_), std::move(marks_));
  text_.clear();
  marks_.clear();
  has_marks_ = false;
  return v;
}

MarkedText TextBuilder::TakeMarked() {
  MarkedText out;
  for (size_t i = 0; i < marks_.size();) {
    if (marks_[i] == '\0') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < marks_.size() && marks_[j] != '\0') ++j;
    out.marked_ranges.emplace_back(i, j);
    i = j;
  }
  out.text = std::move(text_);
  text_.clear();
  marks_.clear();
  has_marks_ = false;
  return out;
}

Result<Value> CallFunction(std::string_view source, const std::string& name, const Array& args,
                           const Object& kwargs, size_t call_pos, size_t name_pos) {
  if (name == "raise_exception") {
    return Status::InvalidArgument(args.empty() ? "the chat template raised an error" : args[0].ToString());
  }
  if (name == "namespace") {
    Object ns = kwargs;
    return Value(std::move(ns));
  }
  if (name == "range") return Range(source, args, call_pos);
  return SourceUnsupported(source, name_pos, "the function '" + name + "'");
}

Result<Value> CallMethod(std::string_view source, const Value& self, const std::string& method,
                         const Array& args, size_t pos) {
  std::optional<Value> r;
  if (self.is_string()) r = StringMethod(self, method, args);
  if (self.is_object()) r = ObjectMethod(self, method, args);
  if (r) return *std::move(r);
  return SourceUnsupported(source, pos,
                           std::string("the method '") + method + "' of a " + self.TypeName());
}

Result<Value> ApplyFilter(std::string_view source, const std::string& filter, const Value& value,
                          const Array& args, const Object& kwargs, size_t pos) {
  const std::string& f = filter;
  const Value& v = value;
  auto need = [&](bool ok, const char* what) -> Status {
    return ok ? Status::Ok()
              : SourceError(source, pos, "filter '" + f + "' needs " + what + ", got a " + v.TypeName());
  };
  if (f == "trim") {
    HW_RETURN_IF_ERROR(need(v.is_string(), "a string"));
    return Strip(v, true, true);
  }
  if (f == "upper" || f == "lower") {
    HW_RETURN_IF_ERROR(need(v.is_string(), "a string"));
    return AsciiCase(v, f == "upper");
  }
  if (f == "capitalize") {
    HW_RETURN_IF_ERROR(need(v.is_string(), "a string"));
    std::string s = AsciiCase(v, false).as_string();
    if (!s.empty()) s[0] = char(std::toupper((unsigned char)s[0]));
    return Value(std::move(s), v.marks());
  }
  if (f == "length" || f == "count") {
    if (v.is_string()) return Value(int64_t(CodePointStarts(v.as_string()).size() - 1));
    if (v.is_array()) return Value(int64_t(v.as_array().size()));
    if (v.is_object()) return Value(int64_t(v.as_object().size()));
    if (v.is_undefined()) return Value(int64_t(0));
    return need(false, "a string, list or dict");
  }
  if (f == "default" || f == "d") {
    bool boolean = (args.size() > 1 && args[1].Truthy()) || kwargs.size() == 1;
    bool use_default = v.is_undefined() || (boolean && !v.Truthy());
    return use_default ? (args.empty() ? Value(std::string()) : args[0]) : v;
  }
  if (f == "string") return v.Printed();
  if (f == "first" || f == "last") {
    if (v.is_array()) {
      if (v.as_array().empty()) return Value();
      return f == "first" ? v.as_array().front() : v.as_array().back();
    }
    if (v.is_string()) {
      const std::vector<size_t> starts = CodePointStarts(v.as_string());
      if (starts.size() < 2) return Value();
      const size_t i = f == "first" ? 0 : starts.size() - 2;
      return Substr(v, starts[i], starts[i + 1] - starts[i]);
    }
    return need(false, "a list or string");
  }
  if (f == "join") {
    const Value sep = !args.empty() ? args[0].Printed() : Value(std::string());
    TextBuilder out;
    if (v.is_array()) {
      for (size_t i = 0; i < v.as_array().size(); ++i) {
        if (i > 0) out.Append(sep);
        out.Append(v.as_array()[i]);
      }
      return out.Take();
    }
    return need(false, "a list");
  }
  return SourceUnsupported(source, pos, "the filter '" + f + "'");
}

Result<bool> ApplyTest(std::string_view source, const std::string& test, const Value& value,
                       size_t pos) {
  const std::string& t = test;
  const Value& v = value;
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_int();
  if (t == "float") return v.is_float();
  if (t == "boolean") return v.is_bool();
  if (t == "true") return v.is_bool() && v.as_bool();
  if (t == "false") return v.is_bool() && !v.as_bool();
  if (t == "mapping") return v.is_object();
  if (t == "sequence" || t == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (t == "odd" || t == "even") {
    if (!v.is_int()) {
      return SourceError(source, pos,
                         std::string("test '") + t + "' needs an integer, got a " + v.TypeName());
    }
    return (v.as_int() % 2 != 0) == (t == "odd");
  }
  return SourceUnsupported(source, pos, "the test '" + t + "'");
}

Result<Value> ApplyBinary(std::string_view source, const std::string& op, const Value& a,
                          const Value& b, size_t pos) {
  if (op == "~") {
    TextBuilder out;
    out.Append(a);
    out.Append(b);
    return out.Take();
  }
  if (op == "==") return Value(a.Equals(b));
  if (op == "!=") return Value(!a.Equals(b));
  if (op == "in" || op == "not in") return Membership(source, op, a, b, pos);
  if (op == "<" || op == "<=" || op == ">" || op == ">=") return Compare(source, op, a, b, pos);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      TextBuilder out;
      out.Append(a);
      out.Append(b);
      return out.Take();
    }
    if (a.is_array() && b.is_array()) {
      Array out = a.as_array();
      out.insert(out.end(), b.as_array().begin(), b.as_array().end());
      return Value(std::move(out));
    }
  }
  if (op == "*" && a.is_string() && b.is_int()) {
    TextBuilder out;
    for (int64_t i = 0; i < b.as_int() && out.text().size() < (1u << 24); ++i) out.Append(a);
    return out.Take();
  }
  if (op == "%" && a.is_string()) return SourceUnsupported(source, pos, "'%' string formatting");
  return Arithmetic(source, op, a, b, pos);
}

}  // namespace headway::jinja
