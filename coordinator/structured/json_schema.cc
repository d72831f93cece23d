#include "coordinator/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coordinator/structured/regex_parser.h"

namespace headway::structured {
namespace {

using Json = nlohmann::ordered_json;

// The largest count (length, number of items) a schema may ask for: each
// counted item is a copy in the automaton.
constexpr int64_t kMaxCount = 10000;
// Bounds beyond it are refused: not every integer there is a double.
constexpr int64_t kMaxBound = int64_t{1} << 53;

constexpr std::string_view kAnnotations[] = {"title",    "description", "$schema",  "$id",
                                             "$comment", "default",     "examples", "deprecated",
                                             "readOnly", "writeOnly",   "$defs",    "definitions"};

// The keywords that constrain one type of value, which is the type of a
// schema that has them but no "type".
constexpr std::pair<std::string_view, std::string_view> kTypeKeywords[] = {
    {"properties", "object"},
    {"required", "object"},
    {"additionalProperties", "object"},
    {"items", "array"},
    {"minItems", "array"},
    {"maxItems", "array"},
    {"uniqueItems", "array"},
    {"minLength", "string"},
    {"maxLength", "string"},
    {"format", "string"},
    {"pattern", "string"},
    {"minimum", "number"},
    {"maximum", "number"},
    {"exclusiveMinimum", "number"},
    {"exclusiveMaximum", "number"}};

constexpr std::string_view kOtherKeywords[] = {"type", "enum", "const", "anyOf", "oneOf", "$ref"};

constexpr std::string_view kTypes[] = {"object", "array",   "string", "integer",
                                       "number", "boolean", "null"};

bool IsAnnotation(std::string_view keyword) {
  return std::ranges::find(kAnnotations, keyword) != std::end(kAnnotations);
}

// The type `keyword` constrains, or "" for none.
std::string_view TypeOfKeyword(std::string_view keyword) {
  for (const auto& [k, type] : kTypeKeywords) {
    if (k == keyword) return type;
  }
  return "";
}

// ---- Messages ----

std::string Where(const std::string& path) { return path.empty() ? "the root" : path; }

// `path` (a JSON pointer) extended by `token`, escaped per RFC 6901.
std::string Child(const std::string& path, std::string_view token) {
  std::string out = path + "/";
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Unescape(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      out += token[++i] == '0' ? '~' : '/';
    } else {
      out += token[i];
    }
  }
  return out;
}

Status Unsupported(std::string_view keyword, const std::string& path, std::string_view why = "") {
  return Status::InvalidArgument("json_schema keyword '" + std::string(keyword) + "' at " +
                                 Where(path) + " is not supported" + std::string(why));
}

Status Invalid(std::string_view keyword, const std::string& path, const std::string& what) {
  return Status::InvalidArgument("'" + std::string(keyword) + "' at " + Where(path) + " " + what);
}

// ---- Lexical patterns ----

Pattern Char(char c) { return Literal(std::string(1, c)); }
Pattern Range(char lo, char hi) { return Chars(CharSet::Range(lo, hi)); }
Pattern Digits(int n) { return Repeat(Range('0', '9'), n, n); }
Pattern Quoted(Pattern inner) { return Seq({Char('"'), std::move(inner), Char('"')}); }
Pattern Fraction() { return Seq({Char('.'), Repeat(Range('0', '9'), 1, -1)}); }

CharSet HexDigits() {
  CharSet hex = CharSet::Range('0', '9');
  hex.Add(CharSet::Range('a', 'f')).Add(CharSet::Range('A', 'F'));
  return hex;
}

// One character of a JSON string: anything but '"', '\' and controls, or
// an escape. Surrogates are not escaped (\uD800..\uDFFF): a pair would be
// two characters here but one for minLength and maxLength; such characters
// are written as UTF-8.
Pattern JsonChar() {
  CharSet first = HexDigits();
  first.ascii.reset('d');
  first.ascii.reset('D');
  const Pattern hex = Chars(HexDigits());
  const Pattern unicode =
      Alt({Seq({Chars(first), Repeat(hex, 3, 3)}),
           Seq({Chars(CharSet::Of("dD")), Range('0', '7'), Repeat(hex, 2, 2)})});
  return Alt({Chars(CharSet::AllBut("\"\\", true)),
              Seq({Char('\\'), Chars(CharSet::Of("\"\\/bfnrt"))}), Seq({Literal("\\u"), unicode})});
}

// RFC 3339 full-date: each month with its own days; February stops at 28,
// since the 29th is valid only in leap years (a subset, never an invalid date).
Pattern Date() {
  const Pattern to28 = Alt({Seq({Char('0'), Range('1', '9')}), Seq({Char('1'), Range('0', '9')}),
                            Seq({Char('2'), Range('0', '8')})});
  const Pattern to30 = Alt({to28, Literal("29"), Literal("30")});
  const Pattern to31 = Alt({to30, Literal("31")});
  return Seq({Digits(4), Char('-'),
              Alt({Seq({Literal("02-"), to28}),
                   Seq({Alt({Literal("04"), Literal("06"), Literal("09"), Literal("11")}),
                        Char('-'), to30}),
                   Seq({Alt({Literal("01"), Literal("03"), Literal("05"), Literal("07"),
                             Literal("08"), Literal("10"), Literal("12")}),
                        Char('-'), to31})})});
}

Pattern Hour() {
  return Alt({Seq({Range('0', '1'), Range('0', '9')}), Seq({Char('2'), Range('0', '3')})});
}
Pattern Minute() { return Seq({Range('0', '5'), Range('0', '9')}); }

// RFC 3339 full-time: the offset (Z or +hh:mm) is required.
Pattern Time() {
  return Seq(
      {Hour(), Char(':'), Minute(), Char(':'), Minute(), Optional(Fraction()),
       Alt({Char('Z'), Seq({Chars(CharSet::Of("+-")), Hour(), Char(':'), Minute()})})});
}

Pattern Uuid() {
  std::vector<Pattern> parts;
  for (int n : {8, 4, 4, 4, 12}) {
    if (!parts.empty()) parts.push_back(Char('-'));
    parts.push_back(Repeat(Chars(HexDigits()), n, n));
  }
  return Seq(std::move(parts));
}

// ---- Integer ranges ----

int64_t Pow10(size_t n) {
  int64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

// The digit strings from `lo` to `hi`, both of the same length: a common
// first digit, or lo's first digit then anything up to 9..9, the digits
// between with any tail, hi's first digit with a tail up to hi's.
Pattern SameLengthRange(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return Empty();
  const std::string lo_tail = lo.substr(1), hi_tail = hi.substr(1);
  if (lo[0] == hi[0]) return Seq({Char(lo[0]), SameLengthRange(lo_tail, hi_tail)});
  const bool lo_tail_zeros = lo_tail.find_first_not_of('0') == std::string::npos;
  const bool hi_tail_nines = hi_tail.find_first_not_of('9') == std::string::npos;
  std::vector<Pattern> alternatives;
  if (!lo_tail_zeros) {
    alternatives.push_back(
        Seq({Char(lo[0]), SameLengthRange(lo_tail, std::string(lo_tail.size(), '9'))}));
  }
  const char first = lo_tail_zeros ? lo[0] : char(lo[0] + 1);
  const char last = hi_tail_nines ? hi[0] : char(hi[0] - 1);
  if (first <= last) alternatives.push_back(Seq({Range(first, last), Digits(int(lo_tail.size()))}));
  if (!hi_tail_nines) {
    alternatives.push_back(
        Seq({Char(hi[0]), SameLengthRange(std::string(hi_tail.size(), '0'), hi_tail)}));
  }
  return Alt(std::move(alternatives));
}

// The naturals from `lo` to `hi` (absent: unbounded) in decimal without
// leading zeros, one length at a time. REQUIRES: 0 <= lo <= hi.
Pattern NaturalRange(int64_t lo, std::optional<int64_t> hi) {
  const size_t lo_length = std::to_string(lo).size();
  const size_t hi_length = hi ? std::to_string(*hi).size() : lo_length;
  std::vector<Pattern> alternatives;
  for (size_t length = lo_length; length <= hi_length; ++length) {
    const int64_t from = length == lo_length ? lo : Pow10(length - 1);
    const int64_t to = hi && length == hi_length ? *hi : Pow10(length) - 1;
    alternatives.push_back(SameLengthRange(std::to_string(from), std::to_string(to)));
  }
  if (!hi) {
    alternatives.push_back(Seq({Range('1', '9'), Repeat(Range('0', '9'), int(lo_length), -1)}));
  }
  return Alt(std::move(alternatives));
}

// The integers from `lo` to `hi` (an absent side is open), without "-0":
// the naturals in range and '-' before the magnitudes of the negative ones.
// REQUIRES: lo <= hi.
Pattern IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Pattern> alternatives;
  if (!hi || *hi >= 0) {
    alternatives.push_back(NaturalRange(std::max<int64_t>(lo.value_or(0), 0), hi));
  }
  if (!lo || *lo < 0) {
    const int64_t from = hi ? std::max<int64_t>(-*hi, 1) : 1;
    alternatives.push_back(
        Seq({Char('-'), NaturalRange(from, lo ? std::optional(-*lo) : std::nullopt)}));
  }
  return Alt(std::move(alternatives));
}

Pattern AnyNumber() {
  return Seq({Optional(Char('-')), NaturalRange(0, std::nullopt), Optional(Fraction()),
              Optional(Seq({Chars(CharSet::Of("eE")), Optional(Chars(CharSet::Of("+-"))),
                            Repeat(Range('0', '9'), 1, -1)}))});
}

// The numbers from `lo` to `hi` (integers; an absent side is open) without
// an exponent. x.f lies in [x, x + 1), so x may take any fraction from lo
// up to hi - 1 and only zeros at hi; -x.f lies in (-x - 1, -x], the mirror.
// REQUIRES: lo <= hi.
Pattern BoundedNumber(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  // Read through value_or: GCC 12 warns that *hi and *lo may be unset.
  const int64_t l = lo.value_or(0), h = hi.value_or(0);
  const Pattern zeros = Seq({Char('.'), Repeat(Char('0'), 1, -1)});
  std::vector<Pattern> alternatives = {IntegerRange(lo, hi)};
  const int64_t from = std::max<int64_t>(lo.value_or(0), 0);
  if (!hi || h - 1 >= from) {
    alternatives.push_back(
        Seq({NaturalRange(from, hi ? std::optional(h - 1) : std::nullopt), Fraction()}));
  }
  if (hi && h >= from) alternatives.push_back(Seq({NaturalRange(h, h), zeros}));
  if (!lo || l < 0) {
    const int64_t magnitude = hi ? std::max<int64_t>(-h, 0) : 0;
    if (!lo || -l - 1 >= magnitude) {
      alternatives.push_back(
          Seq({Char('-'), NaturalRange(magnitude, lo ? std::optional(-l - 1) : std::nullopt),
               Fraction()}));
    }
    if (lo) alternatives.push_back(Seq({Char('-'), NaturalRange(-l, -l), zeros}));
  }
  return Alt(std::move(alternatives));
}

// ---- Generic values ----

Pattern Separator(const JsonGrammarOptions& options) {
  return Seq({Char(','), options.whitespace});
}

Pattern ObjectOf(Pattern value, const JsonGrammarOptions& options) {
  const Pattern member =
      Seq({Quoted(Repeat(JsonChar(), 0, -1)), Char(':'), options.whitespace, std::move(value)});
  return Seq({Char('{'), SepBy(member, Separator(options), 0, -1), Char('}')});
}

Pattern ArrayOf(Pattern item, int min, int max, const JsonGrammarOptions& options) {
  return Seq({Char('['), SepBy(std::move(item), Separator(options), min, max), Char(']')});
}

// Any value with at most `depth` levels of objects and arrays.
Pattern AnyValue(int depth, const JsonGrammarOptions& options) {
  const Pattern scalar = Alt({Quoted(Repeat(JsonChar(), 0, -1)), AnyNumber(), Literal("true"),
                              Literal("false"), Literal("null")});
  Pattern value = scalar;
  for (int d = 1; d <= depth; ++d) {
    value = Alt({scalar, ObjectOf(value, options), ArrayOf(value, 0, -1, options)});
  }
  return value;
}

// ---- Keyword values ----

const Json* Find(const Json& schema, const std::string& key) {
  const auto it = schema.find(key);
  return it == schema.end() ? nullptr : &*it;
}

// `value` written compactly, non-ASCII characters as UTF-8.
Result<std::string> Dump(const Json& value, std::string_view keyword, const std::string& path) {
  try {
    return value.dump();
  } catch (const Json::exception&) {  // a string that is not UTF-8
    return Invalid(keyword, path, "holds a string that is not valid UTF-8");
  }
}

// A count keyword (minLength, maxItems, ...), absent or 0..kMaxCount.
Result<std::optional<int>> Count(const Json& schema, const std::string& keyword,
                                 const std::string& path) {
  const Json* v = Find(schema, keyword);
  if (v == nullptr) return std::optional<int>();
  if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0)) {
    return Invalid(keyword, path, "must be a non-negative integer");
  }
  if (v->get<uint64_t>() > uint64_t(kMaxCount)) {
    return Invalid(keyword, path, "must be at most " + std::to_string(kMaxCount));
  }
  return std::optional<int>(int(v->get<uint64_t>()));
}

Status CheckCounts(std::optional<int> min, std::optional<int> max, const std::string& min_keyword,
                   const std::string& max_keyword, const std::string& path) {
  if (min && max && *min > *max) {
    return Invalid(min_keyword, path, "is above '" + max_keyword + "'");
  }
  return Status::Ok();
}

// A bound keyword (minimum, ...), absent or a number within ±2^53.
Result<std::optional<double>> Bound(const Json& schema, const std::string& keyword,
                                    const std::string& path) {
  const Json* v = Find(schema, keyword);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return Invalid(keyword, path, "must be a number");
  const bool beyond = v->is_number_unsigned() ? v->get<uint64_t>() > uint64_t(kMaxBound)
                      : v->is_number_integer()
                          ? v->get<int64_t>() < -kMaxBound || v->get<int64_t>() > kMaxBound
                          : !(std::abs(v->get<double>()) <= double(kMaxBound));
  if (beyond) return Invalid(keyword, path, "is beyond ±2^53");
  return std::optional<double>(v->get<double>());
}

Status CheckRange(std::optional<int64_t> lo, std::optional<int64_t> hi, const std::string& path) {
  if (lo && hi && *lo > *hi) {
    return Status::InvalidArgument("the bounds at " + Where(path) + " admit no value (from " +
                                   std::to_string(*lo) + " to " + std::to_string(*hi) + ")");
  }
  return Status::Ok();
}

// ---- Types ----

bool HasType(const Json& value, std::string_view type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  }
  if (type == "boolean") return value.is_boolean();
  return value.is_null();
}

// The types `schema` allows; none: any value.
Result<std::vector<std::string>> Types(const Json& schema, const std::string& path) {
  std::vector<std::string> types;
  if (const Json* type = Find(schema, "type")) {
    for (const Json& t : type->is_array() ? *type : Json::array({*type})) {
      if (!t.is_string() || std::ranges::find(kTypes, t.get<std::string>()) == std::end(kTypes)) {
        return Invalid("type", path,
                       "must be object, array, string, integer, number, boolean, null or a "
                       "non-empty list of them");
      }
      types.push_back(t.get<std::string>());
    }
    if (types.empty()) return Invalid("type", path, "must not be an empty list");
    return types;
  }
  std::string first_keyword;
  for (const auto& item : schema.items()) {
    const std::string_view type = TypeOfKeyword(item.key());
    if (type.empty()) continue;
    if (types.empty()) {
      types.emplace_back(type);
      first_keyword = item.key();
    } else if (types[0] != type) {
      return Status::InvalidArgument("'" + first_keyword + "' and '" + item.key() + "' at " +
                                     Where(path) + " apply to different types; give a 'type'");
    }
  }
  return types;
}

Result<Pattern> StringPattern(const Json& schema, const std::string& path) {
  HW_ASSIGN_OR_RETURN(const std::optional<int> min, Count(schema, "minLength", path));
  HW_ASSIGN_OR_RETURN(const std::optional<int> max, Count(schema, "maxLength", path));
  if (const Json* pattern = Find(schema, "pattern")) {
    if (min || max || Find(schema, "format")) {
      return Invalid("pattern", path, "cannot be combined with minLength, maxLength or format");
    }
    if (!pattern->is_string()) return Invalid("pattern", path, "must be a string");
    // The whole string matches: a subset of what the keyword's search
    // semantics allow, and exactly them for a pattern anchored with ^...$.
    RegexOptions content;
    content.json_string_content = true;
    Result<Pattern> regex = ParseRegex(pattern->get<std::string>(), content);
    if (!regex.ok()) return regex.status().WithContext("'pattern' at " + Where(path));
    return Quoted(*regex);
  }
  if (const Json* format = Find(schema, "format")) {
    if (min || max) {
      return Invalid(min ? "minLength" : "maxLength", path, "cannot be combined with 'format'");
    }
    const std::string name = format->is_string() ? format->get<std::string>() : "";
    if (name == "date") return Quoted(Date());
    if (name == "time") return Quoted(Time());
    if (name == "date-time") return Quoted(Seq({Date(), Char('T'), Time()}));
    if (name == "uuid") return Quoted(Uuid());
    return Unsupported("format", path,
                       " for \"" + name + "\" (only date, time, date-time and uuid)");
  }
  HW_RETURN_IF_ERROR(CheckCounts(min, max, "minLength", "maxLength", path));
  return Quoted(Repeat(JsonChar(), min.value_or(0), max.value_or(-1)));
}

Result<Pattern> IntegerPattern(const Json& schema, const std::string& path) {
  HW_ASSIGN_OR_RETURN(const std::optional<double> minimum, Bound(schema, "minimum", path));
  HW_ASSIGN_OR_RETURN(const std::optional<double> maximum, Bound(schema, "maximum", path));
  HW_ASSIGN_OR_RETURN(const std::optional<double> above, Bound(schema, "exclusiveMinimum", path));
  HW_ASSIGN_OR_RETURN(const std::optional<double> below, Bound(schema, "exclusiveMaximum", path));
  std::optional<int64_t> lo, hi;
  const auto at_least = [&lo](double v) { lo = std::max(lo.value_or(INT64_MIN), int64_t(v)); };
  const auto at_most = [&hi](double v) { hi = std::min(hi.value_or(INT64_MAX), int64_t(v)); };
  if (minimum) at_least(std::ceil(*minimum));
  if (above) at_least(std::floor(*above) + 1);
  if (maximum) at_most(std::floor(*maximum));
  if (below) at_most(std::ceil(*below) - 1);
  HW_RETURN_IF_ERROR(CheckRange(lo, hi, path));
  return IntegerRange(lo, hi);
}

Result<Pattern> NumberPattern(const Json& schema, const std::string& path) {
  constexpr const char* kOnlyIntegers =
      "is not supported: only integer bounds are supported for 'number'";
  for (const char* keyword : {"exclusiveMinimum", "exclusiveMaximum"}) {
    if (schema.contains(keyword)) return Invalid(keyword, path, kOnlyIntegers);
  }
  HW_ASSIGN_OR_RETURN(const std::optional<double> minimum, Bound(schema, "minimum", path));
  HW_ASSIGN_OR_RETURN(const std::optional<double> maximum, Bound(schema, "maximum", path));
  if (!minimum && !maximum) return AnyNumber();
  if (minimum && std::floor(*minimum) != *minimum) return Invalid("minimum", path, kOnlyIntegers);
  if (maximum && std::floor(*maximum) != *maximum) return Invalid("maximum", path, kOnlyIntegers);
  std::optional<int64_t> lo, hi;
  if (minimum) lo = int64_t(*minimum);
  if (maximum) hi = int64_t(*maximum);
  HW_RETURN_IF_ERROR(CheckRange(lo, hi, path));
  return BoundedNumber(lo, hi);
}

// Refuses a keyword beside `keyword` other than annotations and `allowed`.
Status CheckAlone(const Json& schema, const std::string& path, const std::string& keyword,
                  std::string_view allowed = "") {
  for (const auto& item : schema.items()) {
    const std::string& k = item.key();
    if (k != keyword && k != allowed && !IsAnnotation(k)) {
      return Invalid(k, path, "cannot be combined with '" + keyword + "'");
    }
  }
  return Status::Ok();
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonGrammarOptions& options)
      : root_(root), options_(options) {}

  // The language of `schema`, found at `path` of the root.
  Result<Pattern> Compile(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return AnyValue(options_.max_depth, options_);
      return Status::InvalidArgument("the schema false at " + Where(path) + " admits no value");
    }
    if (!schema.is_object()) {
      return Status::InvalidArgument("the schema at " + Where(path) +
                                     " must be an object or a boolean");
    }
    for (const auto& item : schema.items()) {
      const std::string& keyword = item.key();
      if (keyword == "discriminator" && schema.contains("oneOf")) continue;  // CompileOneOf
      if (keyword == "uniqueItems" && item.value() != false) {
        return Unsupported(keyword, path, " except as false");
      }
      if (!IsAnnotation(keyword) && TypeOfKeyword(keyword).empty() &&
          std::ranges::find(kOtherKeywords, keyword) == std::end(kOtherKeywords)) {
        return Unsupported(keyword, path);
      }
    }
    if (schema.contains("$ref")) return CompileRef(schema, path);
    if (schema.contains("anyOf")) return CompileAnyOf(schema, path);
    if (schema.contains("oneOf")) return CompileOneOf(schema, path);
    if (schema.contains("enum") || schema.contains("const")) return CompileEnum(schema, path);
    HW_ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(schema, path));
    if (types.empty()) return AnyValue(options_.max_depth, options_);
    std::vector<Pattern> alternatives;
    for (const std::string& type : types) {
      HW_ASSIGN_OR_RETURN(Pattern p, CompileType(type, schema, path));
      alternatives.push_back(std::move(p));
    }
    return Alt(std::move(alternatives));
  }

 private:
  Result<Pattern> CompileType(const std::string& type, const Json& schema,
                              const std::string& path) {
    if (type == "object") return CompileObject(schema, path);
    if (type == "array") return CompileArray(schema, path);
    if (type == "string") return StringPattern(schema, path);
    if (type == "integer") return IntegerPattern(schema, path);
    if (type == "number") return NumberPattern(schema, path);
    if (type == "boolean") return Alt({Literal("true"), Literal("false")});
    return Literal("null");
  }

  // The definition that the local $ref `target` names, or nullptr;
  // *well_formed says whether `target` has the form "#/$defs/NAME" or
  // "#/definitions/NAME" (NAME with ~0 and ~1 escapes, no '/').
  const Json* Definition(const std::string& target, bool* well_formed) const {
    *well_formed = false;
    for (const char* container : {"$defs", "definitions"}) {
      const std::string prefix = "#/" + std::string(container) + "/";
      if (!target.starts_with(prefix)) continue;
      const std::string name = target.substr(prefix.size());
      if (name.find('/') != std::string::npos) return nullptr;
      *well_formed = true;
      const Json* definitions = root_.is_object() ? Find(root_, container) : nullptr;
      if (definitions == nullptr || !definitions->is_object()) return nullptr;
      return Find(*definitions, Unescape(name));
    }
    return nullptr;
  }

  // Inlines the definition; each one is compiled once however often it is
  // used.
  Result<Pattern> CompileRef(const Json& schema, const std::string& path) {
    HW_RETURN_IF_ERROR(CheckAlone(schema, path, "$ref"));
    const Json& ref = *Find(schema, "$ref");
    if (!ref.is_string()) return Invalid("$ref", path, "must be a string");
    const std::string& target = ref.get_ref<const std::string&>();
    bool well_formed = false;
    const Json* definition = Definition(target, &well_formed);
    if (!well_formed) {
      return Unsupported(
          "$ref", path,
          " except as \"#/$defs/NAME\" or \"#/definitions/NAME\" (not \"" + target + "\")");
    }
    if (definition == nullptr) {
      return Invalid("$ref", path, "names \"" + target + "\", which is not defined");
    }
    if (const auto it = compiled_refs_.find(target); it != compiled_refs_.end()) return it->second;
    if (std::ranges::find(open_refs_, target) != open_refs_.end()) {
      return Status::InvalidArgument("recursive $ref \"" + target + "\" at " + Where(path) +
                                     " is not supported");
    }
    open_refs_.push_back(target);
    Result<Pattern> pattern = Compile(*definition, target.substr(1));
    open_refs_.pop_back();
    if (pattern.ok()) compiled_refs_.emplace(target, *pattern);
    return pattern;
  }

  Result<Pattern> CompileAnyOf(const Json& schema, const std::string& path) {
    HW_RETURN_IF_ERROR(CheckAlone(schema, path, "anyOf"));
    const Json& branches = *Find(schema, "anyOf");
    if (!branches.is_array() || branches.empty()) {
      return Invalid("anyOf", path, "must be a non-empty array of schemas");
    }
    return CompileBranches(branches, path, "anyOf");
  }

  // oneOf whose branches no value can match twice: a discriminated union,
  // where every branch requires one property with its own const or enum
  // values (Pydantic's Field(discriminator=...); OpenAPI's "discriminator"
  // beside it is an annotation). Then it is anyOf. Other oneOfs could lead
  // to a value two branches match, which the schema rejects.
  Result<Pattern> CompileOneOf(const Json& schema, const std::string& path) {
    HW_RETURN_IF_ERROR(CheckAlone(schema, path, "oneOf", "discriminator"));
    const Json& branches = *Find(schema, "oneOf");
    if (!branches.is_array() || branches.empty()) {
      return Invalid("oneOf", path, "must be a non-empty array of schemas");
    }
    if (branches.size() > 1 && !Discriminated(branches)) {
      return Unsupported("oneOf", path,
                         " unless every branch requires one property with const or enum values "
                         "of its own (a discriminated union); use anyOf where branches may "
                         "overlap");
    }
    return CompileBranches(branches, path, "oneOf");
  }

  // Any one of the schemas of the array `branches`, the value of `keyword`
  // (anyOf, or a oneOf whose branches cannot overlap).
  Result<Pattern> CompileBranches(const Json& branches, const std::string& path,
                                  const char* keyword) {
    std::vector<Pattern> alternatives;
    for (size_t i = 0; i < branches.size(); ++i) {
      HW_ASSIGN_OR_RETURN(Pattern p,
                          Compile(branches[i], Child(Child(path, keyword), std::to_string(i))));
      alternatives.push_back(std::move(p));
    }
    return Alt(std::move(alternatives));
  }

  // `s`, or the definition it names when it is a local $ref.
  const Json& Resolved(const Json& s) const {
    const Json* ref = s.is_object() ? Find(s, "$ref") : nullptr;
    if (ref == nullptr || !ref->is_string()) return s;
    bool well_formed = false;
    const Json* definition = Definition(ref->get_ref<const std::string&>(), &well_formed);
    return definition != nullptr ? *definition : s;
  }

  // True when some property is required by every branch with const or enum
  // values, and no two branches share a value of it.
  bool Discriminated(const Json& branches) const {
    const Json& first = Resolved(branches[0]);
    const Json* required = first.is_object() ? Find(first, "required") : nullptr;
    if (required == nullptr || !required->is_array()) return false;
    for (const Json& name : *required) {
      if (!name.is_string()) continue;
      std::set<std::string> seen;  // the values' JSON text
      bool disjoint = true;
      for (const Json& branch : branches) {
        const Json& b = Resolved(branch);
        const Json* req = b.is_object() ? Find(b, "required") : nullptr;
        const Json* props = b.is_object() ? Find(b, "properties") : nullptr;
        const Json* prop = props != nullptr && props->is_object()
                               ? Find(*props, name.get<std::string>())
                               : nullptr;
        if (req == nullptr || !req->is_array() || prop == nullptr || !prop->is_object() ||
            std::ranges::find(*req, name) == req->end()) {
          disjoint = false;
          break;
        }
        std::vector<Json> values;
        if (const Json* c = Find(*prop, "const")) values.push_back(*c);
        if (const Json* e = Find(*prop, "enum"); e != nullptr && e->is_array()) {
          values.insert(values.end(), e->begin(), e->end());
        }
        if (values.empty()) disjoint = false;
        for (const Json& v : values) disjoint = disjoint && seen.insert(v.dump()).second;
        if (!disjoint) break;
      }
      if (disjoint) return true;
    }
    return false;
  }

  // The listed values; a "type" beside them keeps those of that type.
  Result<Pattern> CompileEnum(const Json& schema, const std::string& path) {
    const std::string keyword = schema.contains("enum") ? "enum" : "const";
    HW_RETURN_IF_ERROR(CheckAlone(schema, path, keyword, "type"));
    HW_ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(schema, path));
    const Json& listed = *Find(schema, keyword);
    if (keyword == "enum" && (!listed.is_array() || listed.empty())) {
      return Invalid(keyword, path, "must be a non-empty array");
    }
    std::vector<Pattern> alternatives;
    for (const Json& value : keyword == "enum" ? listed : Json::array({listed})) {
      if (!types.empty() &&
          std::ranges::none_of(types, [&](const std::string& t) { return HasType(value, t); })) {
        continue;
      }
      HW_ASSIGN_OR_RETURN(const std::string text, Dump(value, keyword, path));
      alternatives.push_back(Literal(text));
    }
    if (alternatives.empty()) return Invalid(keyword, path, "has no value of the given 'type'");
    return Alt(std::move(alternatives));
  }

  // Listed properties in order, without exponential blowup: `first` is
  // what may follow '{' from property i on (i is the first written or is
  // skipped), `rest` what may follow once one is written (each remaining
  // one after a separator, or skipped). O(n^2) in the number of properties.
  Result<Pattern> CompileObject(const Json& schema, const std::string& path) {
    const Json* properties = Find(schema, "properties");
    const Json* additional = Find(schema, "additionalProperties");
    const Json* required = Find(schema, "required");
    if (properties != nullptr && !properties->is_object()) {
      return Invalid("properties", path, "must be an object of schemas");
    }
    if (additional != nullptr && !additional->is_boolean() && !additional->is_object()) {
      return Invalid("additionalProperties", path, "must be a boolean or a schema");
    }
    std::set<std::string> required_names;
    if (required != nullptr) {
      if (!required->is_array() || !std::all_of(required->begin(), required->end(),
                                                [](const Json& n) { return n.is_string(); })) {
        return Invalid("required", path, "must be an array of property names");
      }
      for (const Json& name : *required) {
        if (properties == nullptr || !properties->contains(name.get<std::string>())) {
          return Invalid("required", path,
                         "names \"" + name.get<std::string>() + "\", which is not in 'properties'");
        }
        required_names.insert(name.get<std::string>());
      }
    }
    if (properties == nullptr || properties->empty()) {
      if (additional != nullptr && additional->is_object()) {
        HW_ASSIGN_OR_RETURN(Pattern value,
                            Compile(*additional, Child(path, "additionalProperties")));
        return ObjectOf(std::move(value), options_);
      }
      if (additional != nullptr && *additional == false) return Literal("{}");
      return ObjectOf(AnyValue(options_.max_depth - 1, options_), options_);
    }
    if (additional != nullptr && additional->is_object() && !additional->empty()) {
      return Unsupported("additionalProperties", path, " as a schema beside 'properties'");
    }
    std::vector<std::pair<Pattern, bool>> members;  // and whether required
    for (const auto& item : properties->items()) {
      HW_ASSIGN_OR_RETURN(Pattern value,
                          Compile(item.value(), Child(Child(path, "properties"), item.key())));
      HW_ASSIGN_OR_RETURN(const std::string key, Dump(Json(item.key()), "properties", path));
      members.emplace_back(Seq({Literal(key + ":"), options_.whitespace, std::move(value)}),
                           required_names.contains(item.key()));
    }
    Pattern first = Empty(), rest = Empty();
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      const auto& [member, is_required] = *it;
      const Pattern written = Seq({member, rest});
      first = is_required ? written : Alt({written, first});
      const Pattern later = Seq({Separator(options_), member});
      rest = Seq({is_required ? later : Optional(later), rest});
    }
    return Seq({Char('{'), first, Char('}')});
  }

  Result<Pattern> CompileArray(const Json& schema, const std::string& path) {
    HW_ASSIGN_OR_RETURN(const std::optional<int> min, Count(schema, "minItems", path));
    HW_ASSIGN_OR_RETURN(const std::optional<int> max, Count(schema, "maxItems", path));
    HW_RETURN_IF_ERROR(CheckCounts(min, max, "minItems", "maxItems", path));
    Pattern item = AnyValue(options_.max_depth - 1, options_);
    if (const Json* items = Find(schema, "items")) {
      HW_ASSIGN_OR_RETURN(item, Compile(*items, Child(path, "items")));
    }
    return ArrayOf(std::move(item), min.value_or(0), max.value_or(-1), options_);
  }

  const Json& root_;
  const JsonGrammarOptions& options_;
  std::vector<std::string> open_refs_;  // being compiled: a cycle
  std::map<std::string, Pattern> compiled_refs_;
};

}  // namespace

JsonGrammarOptions DefaultJsonGrammarOptions() { return JsonGrammarOptions(); }

Pattern JsonObjectPattern(const JsonGrammarOptions& options) {
  return ObjectOf(AnyValue(options.max_depth - 1, options), options);
}

Result<Pattern> JsonSchemaPattern(const nlohmann::ordered_json& schema,
                                  const JsonGrammarOptions& options) {
  return SchemaCompiler(schema, options).Compile(schema, "");
}

}  // namespace headway::structured
