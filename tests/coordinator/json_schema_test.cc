#include "coordinator/structured/json_schema.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "coordinator/structured/nfa.h"

namespace headway::structured {
namespace {

Nfa SchemaNfa(const std::string& schema) {
  Result<Pattern> pattern =
      JsonSchemaPattern(nlohmann::ordered_json::parse(schema), DefaultJsonGrammarOptions());
  EXPECT_TRUE(pattern.ok()) << schema << ": " << pattern.status().ToString();
  Result<Nfa> nfa = CompileNfa(*pattern);
  EXPECT_TRUE(nfa.ok()) << nfa.status().ToString();
  return std::move(nfa).value();
}

Status SchemaError(const std::string& schema) {
  Result<Pattern> pattern =
      JsonSchemaPattern(nlohmann::ordered_json::parse(schema), DefaultJsonGrammarOptions());
  return pattern.ok() ? Status::Ok() : pattern.status();
}

void ExpectLanguage(const Nfa& nfa, const std::vector<std::string>& in,
                    const std::vector<std::string>& out) {
  for (const std::string& text : in) EXPECT_TRUE(FullMatch(nfa, text)) << text;
  for (const std::string& text : out) EXPECT_FALSE(FullMatch(nfa, text)) << text;
}

TEST(JsonSchema, RequiredAndOptionalProperties) {
  const Nfa nfa = SchemaNfa(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "required": ["a"], "additionalProperties": false})");
  ExpectLanguage(
      nfa,
      {R"({"a": 1})", R"({"a": 1, "b": "x"})", R"({"a": 1, "c": true})",
       R"({"a": 1, "b": "x", "c": false})", R"({"a":1,"b":"x"})"},
      {R"({})", R"({"b": "x"})", R"({"a": 1, "c": true, "b": "x"})", R"({"a": 1, "d": 2})",
       R"({"a": "1"})", R"({ "a": 1})", R"({"a": 1 })", R"({"a": 1,})", R"({"a":  1})"});
}

TEST(JsonSchema, AllPropertiesOptional) {
  const Nfa nfa = SchemaNfa(R"({"properties": {"x": {"type": "null"}, "y": {"type": "null"}}})");
  ExpectLanguage(nfa, {"{}", R"({"x": null})", R"({"y": null})", R"({"x": null, "y": null})"},
                 {R"({, "y": null})", R"({"y": null, "x": null})", R"({"x": null,})"});
}

TEST(JsonSchema, PropertiesInSchemaOrder) {
  const Nfa nfa = SchemaNfa(R"({"properties": {"z": {"type": "integer"}, "a": {"type": "integer"}},
      "required": ["a", "z"]})");
  ExpectLanguage(nfa, {R"({"z": 1, "a": 2})"}, {R"({"a": 2, "z": 1})", R"({"z": 1})"});
}

TEST(JsonSchema, KeysAreEscaped) {
  const Nfa nfa = SchemaNfa(R"({"properties": {"q\"é/": {"const": 1}}, "required": ["q\"é/"]})");
  ExpectLanguage(nfa, {"{\"q\\\"é/\": 1}"}, {"{\"q\"é/\": 1}"});
}

TEST(JsonSchema, Enum) {
  const Nfa nfa = SchemaNfa(R"({"enum": ["red", "é", 1, 2.5, null, [1, {"k": true}]]})");
  ExpectLanguage(nfa, {R"("red")", "\"é\"", "1", "2.5", "null", R"([1,{"k":true}])"},
                 {R"("blue")", R"("\u00e9")", "2", "2.50", R"("null")", "red"});
  // "type" beside "enum" keeps the values of that type.
  ExpectLanguage(SchemaNfa(R"({"type": "string", "enum": ["a", 1]})"), {R"("a")"}, {"1"});
  ExpectLanguage(SchemaNfa(R"({"type": "integer", "enum": [1.0, 1.5]})"), {"1.0"}, {"1.5"});
  EXPECT_EQ(SchemaError(R"({"type": "string", "enum": [1]})").code(), StatusCode::kInvalidArgument);
}

TEST(JsonSchema, Const) {
  ExpectLanguage(SchemaNfa(R"({"const": {"x": [1, "y"]}})"), {R"({"x":[1,"y"]})"},
                 {R"({"x": [1, "y"]})", R"({"x":[1]})"});
}

TEST(JsonSchema, NestedObject) {
  const Nfa nfa = SchemaNfa(R"({"type": "object", "properties": {
      "name": {"type": "string"},
      "address": {"type": "object", "properties": {"city": {"type": "string"},
                  "zip": {"type": "string"}}, "required": ["city"]}},
      "required": ["name", "address"]})");
  ExpectLanguage(nfa,
                 {R"({"name": "a", "address": {"city": "b"}})",
                  R"({"name": "a", "address": {"city": "b", "zip": "1"}})"},
                 {R"({"name": "a", "address": {}})", R"({"name": "a", "address": "b"})"});
}

TEST(JsonSchema, AdditionalProperties) {
  ExpectLanguage(SchemaNfa(R"({"type": "object", "additionalProperties": {"type": "integer"}})"),
                 {"{}", R"({"a": 1})", R"({"a": 1, "b": 2})"}, {R"({"a": "x"})", R"({"a"})"});
  ExpectLanguage(SchemaNfa(R"({"type": "object", "additionalProperties": false})"), {"{}"},
                 {R"({"a": 1})"});
  ExpectLanguage(SchemaNfa(R"({"type": "object"})"), {"{}", R"({"a": [1, {"b": null}]})"}, {"[]"});
}

TEST(JsonSchema, ArrayItems) {
  const Nfa nfa =
      SchemaNfa(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  ExpectLanguage(nfa, {"[1]", "[1, 2]", "[1,2,3]", "[-4, 0, 7]"},
                 {"[]", "[1, 2, 3, 4]", "[1 ,2]", "[ 1]", "[1,]", R"(["a"])"});
  ExpectLanguage(SchemaNfa(R"({"items": {"type": "boolean"}})"), {"[]", "[true, false]"}, {"[1]"});
  ExpectLanguage(SchemaNfa(R"({"type": "array", "uniqueItems": false})"),
                 {"[]", R"([1, "a", [2]])"}, {"{}"});
}

TEST(JsonSchema, StringLength) {
  const Nfa nfa = SchemaNfa(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  ExpectLanguage(
      nfa,
      {R"("ab")", R"("abc")", R"("a\"b")", R"("\u00e9x")", "\"éé\"", "\"日本語\"", R"("\\\n")",
       R"("a\/")"},
      {R"("a")", R"("abcd")", "\"éééé\"", "\"a\nb\"", R"("a\x")", R"("\u00e")", "ab", R"("a"")"});
  // Surrogate escapes are not written: a pair is one character for JSON Schema.
  ExpectLanguage(SchemaNfa(R"({"type": "string", "maxLength": 1})"),
                 {R"("\uD7FF")", R"("\uE000")", R"("\u00e9")", "\"😀\""},
                 {R"("\ud83d\ude00")", R"("\ud83d")"});
  ExpectLanguage(SchemaNfa(R"({"type": "string", "minLength": 1})"), {R"("x")", R"("xxxxxxxxxx")"},
                 {R"("")"});
}

TEST(JsonSchema, IntegerRanges) {
  struct Case {
    std::string bounds;
    std::optional<int> lo, hi;
  };
  const std::vector<Case> cases = {
      {R"("minimum": 0, "maximum": 0)", 0, 0},
      {R"("minimum": 0, "maximum": 9)", 0, 9},
      {R"("minimum": 1, "maximum": 10)", 1, 10},
      {R"("minimum": 5, "maximum": 12)", 5, 12},
      {R"("minimum": -5, "maximum": 12)", -5, 12},
      {R"("minimum": -1, "maximum": 1)", -1, 1},
      {R"("minimum": 17, "maximum": 123)", 17, 123},
      {R"("minimum": -123, "maximum": -17)", -123, -17},
      {R"("minimum": -99, "maximum": -10)", -99, -10},
      {R"("minimum": 99, "maximum": 101)", 99, 101},
      {R"("minimum": -130, "maximum": 130)", -130, 130},
      {R"("minimum": 0)", 0, std::nullopt},
      {R"("minimum": -15)", -15, std::nullopt},
      {R"("minimum": 42)", 42, std::nullopt},
      {R"("maximum": 7)", std::nullopt, 7},
      {R"("maximum": -20)", std::nullopt, -20},
      {R"("exclusiveMinimum": 3, "exclusiveMaximum": 9)", 4, 8},
      {R"("exclusiveMinimum": -10, "maximum": 100)", -9, 100},
      {R"("minimum": 2.5, "maximum": 9.5)", 3, 9},
      {R"("minimum": -2.5, "exclusiveMaximum": 2.5)", -2, 2},
      {R"("minimum": 0, "exclusiveMinimum": 5)", 6, std::nullopt},
      {"", std::nullopt, std::nullopt},
  };
  for (const Case& c : cases) {
    const Nfa nfa =
        SchemaNfa(R"({"type": "integer")" + (c.bounds.empty() ? "" : ", " + c.bounds) + "}");
    for (int n = -130; n <= 130; ++n) {
      const bool in = (!c.lo || n >= *c.lo) && (!c.hi || n <= *c.hi);
      EXPECT_EQ(FullMatch(nfa, std::to_string(n)), in) << c.bounds << ": " << n;
    }
    for (const char* never : {"-0", "007", "1.0", "+1", "", "-"}) {
      EXPECT_FALSE(FullMatch(nfa, never)) << c.bounds << ": " << never;
    }
  }
  ExpectLanguage(SchemaNfa(R"({"type": "integer", "minimum": 0})"), {"1000000", "123456789012"},
                 {"-1000000"});
  ExpectLanguage(SchemaNfa(R"({"type": "integer", "maximum": -20})"), {"-1000000"}, {"1000000"});
  ExpectLanguage(SchemaNfa(R"({"type": "integer", "minimum": -9007199254740992,
                               "maximum": 9007199254740992})"),
                 {"9007199254740992", "-9007199254740992", "0"}, {"9007199254740993"});
}

TEST(JsonSchema, Numbers) {
  ExpectLanguage(SchemaNfa(R"({"type": "number"})"),
                 {"0", "-0", "1.5", "-0.25", "1e10", "-1.5E+10", "2e-3"},
                 {"01", "1.", ".5", "1e", "+1", "--1"});
  ExpectLanguage(SchemaNfa(R"({"type": "number", "minimum": 0, "maximum": 2})"),
                 {"0", "1", "2", "1.5", "0.25", "0.0", "2.0", "2.00", "1.999"},
                 {"2.1", "2.01", "3", "-1", "-0.5", "1e0", "-0"});
  ExpectLanguage(SchemaNfa(R"({"type": "number", "minimum": -2, "maximum": 5})"),
                 {"-2", "-2.0", "-1.5", "-0.5", "4.75", "5.000"},
                 {"-2.5", "-2.01", "-3", "5.5", "6"});
  ExpectLanguage(SchemaNfa(R"({"type": "number", "minimum": 0})"), {"1234.5", "0.001"},
                 {"-0.1", "-1"});
  ExpectLanguage(SchemaNfa(R"({"type": "number", "maximum": -3})"),
                 {"-3", "-3.0", "-3.5", "-100.25"}, {"-2.5", "-2.99", "0"});
  ExpectLanguage(SchemaNfa(R"({"type": "number", "minimum": -5, "maximum": -2})"),
                 {"-2", "-2.0", "-2.5", "-4.99", "-5.00"}, {"-1.5", "-5.01", "2"});
}

// Every number written as an integer part (-25..25) and a fraction is in
// the language exactly when it lies in the bounds; "-0..." is let be.
TEST(JsonSchema, NumberRangesExhaustively) {
  const std::vector<std::pair<std::optional<int>, std::optional<int>>> bounds = {{0, 2},
                                                                                 {-2, 5},
                                                                                 {-5, -2},
                                                                                 {3, 3},
                                                                                 {-1, 0},
                                                                                 {0, std::nullopt},
                                                                                 {-7, std::nullopt},
                                                                                 {std::nullopt, 2},
                                                                                 {std::nullopt, -3},
                                                                                 {-20, 19}};
  for (const auto& [lo, hi] : bounds) {
    std::string schema = R"({"type": "number")";
    if (lo) schema += R"(, "minimum": )" + std::to_string(*lo);
    if (hi) schema += R"(, "maximum": )" + std::to_string(*hi);
    const Nfa nfa = SchemaNfa(schema + "}");
    for (int i = 0; i <= 25; ++i) {
      for (const char* fraction : {"", ".0", ".00", ".5", ".25", ".05", ".999"}) {
        for (const std::string sign : {"", "-"}) {
          const std::string text = sign + std::to_string(i) + fraction;
          const double v = std::stod(text);
          if (v == 0 && !sign.empty()) continue;
          EXPECT_EQ(FullMatch(nfa, text), (!lo || v >= *lo) && (!hi || v <= *hi))
              << schema << ": " << text;
        }
      }
    }
  }
}

TEST(JsonSchema, Formats) {
  ExpectLanguage(
      SchemaNfa(R"({"type": "string", "format": "date"})"),
      {R"("2024-02-28")", R"("1999-12-31")", R"("2000-01-01")", R"("2023-04-30")"},
      {R"("2024-13-01")", R"("2024-00-10")", R"("2024-01-32")", R"("2024-1-01")", "2024-01-01",
       R"("2023-02-31")", R"("2023-04-31")", R"("2023-02-29")"});
  ExpectLanguage(
      SchemaNfa(R"({"type": "string", "format": "time"})"),
      {R"("12:34:56Z")", R"("12:34:56.789Z")", R"("23:59:59+05:30")", R"("00:00:00-08:00")"},
      {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:34Z")", R"("12:34:56+5:30")",
       R"("12:34:56")"});
  ExpectLanguage(SchemaNfa(R"({"type": "string", "format": "date-time"})"),
                 {R"("2024-01-01T00:00:00Z")", R"("2024-06-30T12:00:00.5+02:00")"},
                 {R"("2024-01-01 00:00:00")", R"("2024-01-01")"});
  ExpectLanguage(
      SchemaNfa(R"({"format": "uuid"})"), {R"("123e4567-e89b-12d3-a456-426614174000")"},
      {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
}

TEST(JsonSchema, TypeListAndAnyOf) {
  ExpectLanguage(SchemaNfa(R"({"type": ["integer", "null"]})"), {"1", "null"}, {"1.5", "true"});
  ExpectLanguage(SchemaNfa(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null,
                               "title": "Maybe"})"),
                 {R"("x")", "null"}, {"1"});
  ExpectLanguage(SchemaNfa(R"({"type": "boolean"})"), {"true", "false"}, {"null", "1"});
}

TEST(JsonSchema, RefsToDefinitions) {
  const Nfa nfa = SchemaNfa(R"({
      "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}},
                          "required": ["x"]}},
      "definitions": {"a/b~c": {"type": "boolean"}},
      "type": "object",
      "properties": {"p": {"$ref": "#/$defs/point", "description": "where"},
                     "q": {"type": "array", "items": {"$ref": "#/$defs/point"}},
                     "f": {"$ref": "#/definitions/a~1b~0c"}},
      "required": ["p", "q", "f"]})");
  ExpectLanguage(nfa, {R"({"p": {"x": 1}, "q": [{"x": 2}, {"x": 3}], "f": true})"},
                 {R"({"p": {"x": 1}, "q": [{"y": 2}], "f": true})"});
  ExpectLanguage(SchemaNfa(R"({"$defs": {"n": {"type": "null"}}, "$ref": "#/$defs/n"})"), {"null"},
                 {"1"});
}

TEST(JsonSchema, RecursionIsRefused) {
  const Status s = SchemaError(R"({"$defs": {"node": {"type": "object", "properties": {
      "next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"})");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("recursive"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("/$defs/node/properties/next"), std::string::npos) << s.message();
}

TEST(JsonSchema, PatternMatchesTheWholeStringAndNeverWhatJsonEscapes) {
  const Nfa nfa = SchemaNfa(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})");
  ExpectLanguage(nfa, {R"("AB-123")"}, {R"("AB-12")", R"("ab-123")", R"("AB-123x")"});
  const Nfa any = SchemaNfa(R"({"type": "string", "pattern": "[^x]+"})");
  ExpectLanguage(any, {R"("ab c")", "\"\xC3\xA9\""}, {R"("a"b")", R"("a\b")", "\"a\nb\""});
}

// Pydantic's discriminated union: oneOf of $refs told apart by a const.
TEST(JsonSchema, OneOfOfADiscriminatedUnionIsItsBranches) {
  const Nfa nfa = SchemaNfa(R"({"$defs": {
      "Cat": {"type": "object", "properties": {"kind": {"const": "cat", "type": "string"},
              "meows": {"type": "boolean"}}, "required": ["kind", "meows"], "title": "Cat"},
      "Dog": {"type": "object", "properties": {"kind": {"enum": ["dog", "puppy"]},
              "barks": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["kind", "barks"]}},
    "type": "object", "properties": {"pet": {
      "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
      "discriminator": {"propertyName": "kind",
                        "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}},
    "required": ["pet"]})");
  ExpectLanguage(nfa,
                 {R"({"pet": {"kind": "cat", "meows": true}})",
                  R"({"pet": {"kind": "puppy", "barks": 3}})"},
                 {R"({"pet": {"kind": "cat", "barks": 3}})", R"({"pet": {"meows": true}})"});
  // One branch cannot match twice.
  ExpectLanguage(SchemaNfa(R"({"oneOf": [{"type": "integer"}]})"), {"7"}, {"\"7\""});
  // Branches that share a value of every common property may overlap.
  EXPECT_EQ(SchemaError(R"({"oneOf": [
      {"properties": {"k": {"const": "a"}}, "required": ["k"]},
      {"properties": {"k": {"enum": ["b", "a"]}}, "required": ["k"]}]})").code(),
            StatusCode::kInvalidArgument);
}

TEST(JsonSchema, RefusedKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]})", "oneOf"},
      {R"({"type": "object", "discriminator": {"propertyName": "a"}})", "discriminator"},
      {R"({"allOf": [{"type": "string"}]})", "allOf"},
      {R"({"not": {"type": "string"}})", "not"},
      {R"({"if": {"type": "string"}, "then": {}})", "if"},
      {R"({"type": "object", "patternProperties": {"a": {}}})", "patternProperties"},
      {R"({"type": "object", "dependentRequired": {}})", "dependentRequired"},
      {R"({"type": "string", "nullable": true})", "nullable"},
      {R"({"type": "object", "minProperties": 1})", "minProperties"},
      {R"({"type": "object", "maxProperties": 1})", "maxProperties"},
      {R"({"type": "array", "prefixItems": [{}]})", "prefixItems"},
      {R"({"type": "array", "contains": {}})", "contains"},
      {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
      {R"({"type": "string", "pattern": "a+", "maxLength": 3})", "pattern"},
      {R"({"type": "string", "pattern": "(a"})", "pattern"},
      {R"({"type": "string", "format": "email"})", "format"},
      {R"({"type": "integer", "multipleOf": 2})", "multipleOf"},
      {R"({"$ref": "https://example.com/s.json"})", "$ref"},
      {R"({"$ref": "#/$defs/missing"})", "$ref"},
      {R"({"$defs": {"a": {}}, "$ref": "#/$defs/a", "type": "object"})", "$ref"},
      {R"({"anyOf": [{}], "type": "string"})", "anyOf"},
      {R"({"properties": {"a": {}}, "additionalProperties": {"type": "string"}})",
       "additionalProperties"},
      {R"({"type": "number", "exclusiveMinimum": 0})", "exclusiveMinimum"},
      {R"({"type": "number", "maximum": 2.5})", "maximum"},
      {R"({"type": "integer", "minimum": 1e300})", "minimum"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "bounds"},
      {R"({"type": "string", "maxLength": 10001})", "maxLength"},
      {R"({"type": "string", "maxLength": -1})", "maxLength"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "minLength"},
      {R"({"type": "array", "minItems": 1.5})", "minItems"},
      {R"({"properties": {"a": {}}, "required": ["b"]})", "required"},
      {R"({"type": "strings"})", "type"},
      {R"({"enum": []})", "enum"},
      {R"({"minLength": 1, "minimum": 1})", "type"},
      {R"({"properties": {"x": {"oneOf": []}}})", "/properties/x"},
      {"false", "false"},
  };
  for (const auto& [schema, keyword] : cases) {
    const Status s = SchemaError(schema);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << schema;
    EXPECT_NE(s.message().find(keyword), std::string::npos) << schema << ": " << s.message();
  }
}

TEST(JsonSchema, AnyValue) {
  const Nfa nfa = SchemaNfa("{}");
  ExpectLanguage(nfa, {"1", R"("x")", "null", "[]", R"({"a": [1, {"b": null}]})"}, {"", "[1,]"});
  ExpectLanguage(SchemaNfa(R"({"title": "anything", "description": "at all"})"), {"true"}, {});
  ExpectLanguage(SchemaNfa("true"), {"[[[[[1]]]]]"}, {"[[[[[[1]]]]]]"});
}

TEST(JsonSchema, JsonObject) {
  const Result<Nfa> nfa = CompileNfa(JsonObjectPattern(DefaultJsonGrammarOptions()));
  ASSERT_TRUE(nfa.ok()) << nfa.status().ToString();
  ExpectLanguage(*nfa,
                 {R"({"a":[1,{"b":null}],"c":"x"})", R"({"a": [1, {"b": null}], "c": "x"})", "{}",
                  R"({"a": {"b": {"c": {"d": {"e": 1}}}}})", R"({"a": [[[[1]]]]})"},
                 {"[1]", R"("x")", R"({"a": {"b": {"c": {"d": {"e": {}}}}}})",
                  R"({"a": [[[[[1]]]]]})", R"({"a" : 1})", R"({"a": 1,})"});
  JsonGrammarOptions options;
  options.max_depth = 1;
  options.whitespace = Empty();
  const Result<Nfa> flat = CompileNfa(JsonObjectPattern(options));
  ASSERT_TRUE(flat.ok());
  ExpectLanguage(*flat, {R"({"a":1,"b":"x"})"}, {R"({"a":[]})", R"({"a": 1})"});
}

}  // namespace
}  // namespace headway::structured
