#include "coordinator/http/structured_output_fields.h"

#include <string>
#include <vector>

#include "coordinator/http/request_fields.h"
#include "coordinator/http/request_limits.h"
#include "coordinator/structured/regex_parser.h"

namespace headway {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using request_fields::Field;
using request_fields::Unsupported;
using request_fields::WrongType;
using Spec = structured::StructuredOutputSpec;

Spec Of(Spec::Kind kind, std::string source) {
  Spec spec;
  spec.kind = kind;
  spec.source = std::move(source);
  return spec;
}

// How deeply a schema given as text may nest (the body's default limit).
constexpr int kMaxSchemaDepth = 64;

// The schema at `path` in the body, as JSON text in the client's key order;
// a JSON string value is taken as the schema's text (vLLM's guided_json
// takes both).
std::optional<ApiError> SchemaText(std::string_view body_text, const std::vector<std::string>& path,
                                   const std::string& name, std::string* out) {
  const ordered_json body = ordered_json::parse(body_text, nullptr, false);
  const ordered_json* at = &body;
  for (const std::string& key : path) {
    if (!at->is_object() || !at->contains(key)) return WrongType(name, "a JSON schema");
    at = &(*at)[key];
  }
  if (at->is_string()) {
    // The body's nesting limit did not see inside the string.
    if (CheckJsonDepth(at->get<std::string>(), kMaxSchemaDepth)) {
      return ApiError::BadRequest("'" + name + "': the schema nests JSON more than " +
                                      std::to_string(kMaxSchemaDepth) + " levels deep",
                                  name);
    }
    const ordered_json parsed = ordered_json::parse(at->get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) return WrongType(name, "a JSON schema (an object, or its text)");
    *out = parsed.dump();
    return std::nullopt;
  }
  if (!at->is_object() && !at->is_boolean()) return WrongType(name, "a JSON schema");
  *out = at->dump();
  return std::nullopt;
}

std::optional<ApiError> OnlyKeys(const json& object, const std::string& name,
                                 const std::vector<std::string>& allowed) {
  for (const auto& [key, value] : object.items()) {
    if (value.is_null()) continue;
    bool known = false;
    for (const std::string& a : allowed) known = known || key == a;
    if (!known) return Unsupported(name, "'" + name + "." + key + "'");
  }
  return std::nullopt;
}

std::optional<ApiError> ChoiceText(const json& choices, const std::string& name,
                                   std::string* out) {
  if (!choices.is_array() || choices.empty()) {
    return WrongType(name, "a non-empty array of strings");
  }
  for (const json& c : choices) {
    if (!c.is_string()) return WrongType(name, "a non-empty array of strings");
  }
  *out = choices.dump();
  return std::nullopt;
}

// The one constraint found so far and its field; Set refuses a second.
struct Found {
  std::optional<Spec> spec;
  std::string field;

  std::optional<ApiError> Set(Spec s, const std::string& name) {
    if (spec) {
      return ApiError::BadRequest("only one kind of structured output may be given, got '" +
                                      field + "' and '" + name + "'",
                                  name);
    }
    spec = std::move(s);
    spec->field = name;
    field = name;
    return std::nullopt;
  }
};

std::optional<ApiError> ReadResponseFormat(const json& body, std::string_view body_text,
                                           Found* found) {
  const json* format = Field(body, "response_format");
  if (!format) return std::nullopt;
  const json* type = format->is_object() ? Field(*format, "type") : nullptr;
  if (!type || !type->is_string()) {
    return WrongType("response_format", "an object with a string 'type'");
  }
  if (*type == "text") return OnlyKeys(*format, "response_format", {"type"});
  if (*type == "json_object") {
    if (auto e = OnlyKeys(*format, "response_format", {"type"})) return e;
    return found->Set(Of(Spec::Kind::kJsonObject, ""), "response_format");
  }
  if (*type != "json_schema") {
    return ApiError::BadRequest("response_format type '" + type->get<std::string>() +
                                    "' is not one of 'text', 'json_object', 'json_schema'",
                                "response_format");
  }
  if (auto e = OnlyKeys(*format, "response_format", {"type", "json_schema"})) return e;
  const json* schema = Field(*format, "json_schema");
  if (!schema || !schema->is_object()) {
    return WrongType("response_format.json_schema", "an object with a 'schema'");
  }
  if (auto e = OnlyKeys(*schema, "response_format.json_schema",
                        {"name", "description", "schema", "strict"})) {
    return e;
  }
  const json* name = Field(*schema, "name");
  if (!name || !name->is_string()) {
    return WrongType("response_format.json_schema.name", "a string (the schema's name)");
  }
  const json* strict = Field(*schema, "strict");
  if (strict && !strict->is_boolean()) return WrongType("response_format.json_schema.strict", "a boolean");
  if (!Field(*schema, "schema")) {
    return ApiError::BadRequest("'response_format.json_schema.schema' is required",
                                "response_format.json_schema");
  }
  Spec spec = Of(Spec::Kind::kJsonSchema, "");
  if (auto e = SchemaText(body_text, {"response_format", "json_schema", "schema"},
                          "response_format.json_schema.schema", &spec.source)) {
    return e;
  }
  return found->Set(std::move(spec), "response_format");
}

std::optional<ApiError> ReadGuided(const json& body, std::string_view body_text, Found* found) {
  if (Field(body, "guided_json")) {
    Spec spec = Of(Spec::Kind::kJsonSchema, "");
    if (auto e = SchemaText(body_text, {"guided_json"}, "guided_json", &spec.source)) return e;
    if (auto e = found->Set(std::move(spec), "guided_json")) return e;
  }
  if (const json* regex = Field(body, "guided_regex")) {
    if (!regex->is_string()) return WrongType("guided_regex", "a string");
    if (auto e = found->Set(Of(Spec::Kind::kRegex, regex->get<std::string>()),
                            "guided_regex")) {
      return e;
    }
  }
  if (const json* choice = Field(body, "guided_choice")) {
    Spec spec = Of(Spec::Kind::kChoice, "");
    if (auto e = ChoiceText(*choice, "guided_choice", &spec.source)) return e;
    if (auto e = found->Set(std::move(spec), "guided_choice")) return e;
  }
  if (Field(body, "guided_grammar")) {
    return Unsupported("guided_grammar", "a grammar (EBNF or Lark) constraint");
  }
  if (const json* backend = Field(body, "guided_decoding_backend")) {
    if (!backend->is_string()) return WrongType("guided_decoding_backend", "a string");
  }
  return std::nullopt;
}

// A whitespace pattern and the field it came from.
struct Whitespace {
  std::string pattern;
  std::string field;
};

std::optional<ApiError> ReadStructuredOutputs(const json& body, std::string_view body_text,
                                              Found* found, Whitespace* whitespace) {
  const json* so = Field(body, "structured_outputs");
  if (!so) return std::nullopt;
  const std::string name = "structured_outputs";
  if (!so->is_object()) return WrongType(name, "an object");
  if (Field(*so, "grammar")) return Unsupported(name, "a grammar (EBNF or Lark) constraint");
  if (auto e = OnlyKeys(*so, name, {"json", "regex", "choice", "json_object",
                                    "whitespace_pattern"})) {
    return e;
  }
  if (Field(*so, "json")) {
    Spec spec = Of(Spec::Kind::kJsonSchema, "");
    if (auto e = SchemaText(body_text, {name, "json"}, name + ".json", &spec.source)) return e;
    if (auto e = found->Set(std::move(spec), name + ".json")) return e;
  }
  if (const json* regex = Field(*so, "regex")) {
    if (!regex->is_string()) return WrongType(name + ".regex", "a string");
    if (auto e = found->Set(Of(Spec::Kind::kRegex, regex->get<std::string>()),
                            name + ".regex")) {
      return e;
    }
  }
  if (const json* choice = Field(*so, "choice")) {
    Spec spec = Of(Spec::Kind::kChoice, "");
    if (auto e = ChoiceText(*choice, name + ".choice", &spec.source)) return e;
    if (auto e = found->Set(std::move(spec), name + ".choice")) return e;
  }
  if (const json* object = Field(*so, "json_object")) {
    if (!object->is_boolean()) return WrongType(name + ".json_object", "a boolean");
    if (object->get<bool>()) {
      if (auto e = found->Set(Of(Spec::Kind::kJsonObject, ""), name + ".json_object")) {
        return e;
      }
    }
  }
  if (const json* ws = Field(*so, "whitespace_pattern")) {
    if (!ws->is_string()) return WrongType(name + ".whitespace_pattern", "a string");
    *whitespace = {ws->get<std::string>(), name + ".whitespace_pattern"};
  }
  return std::nullopt;
}

}  // namespace

std::shared_ptr<const structured::TokenVocabulary> GrammarVocabulary(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(size_t(tokenizer.vocab_size()));
  std::vector<int32_t> special;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    bytes[size_t(id)] = std::string(tokenizer.TokenBytes(id));
    if (tokenizer.IsSpecial(id)) special.push_back(id);
  }
  return std::make_shared<const structured::TokenVocabulary>(std::move(bytes), special);
}

std::optional<ApiError> ReadStructuredOutput(const json& body, std::string_view body_text,
                                             const GenerationParams& params,
                                             std::optional<Spec>* out) {
  Found found;
  Whitespace whitespace;
  if (auto e = ReadResponseFormat(body, body_text, &found)) return e;
  if (auto e = ReadGuided(body, body_text, &found)) return e;
  if (auto e = ReadStructuredOutputs(body, body_text, &found, &whitespace)) return e;
  if (const json* ws = Field(body, "guided_whitespace_pattern")) {
    if (!ws->is_string()) return WrongType("guided_whitespace_pattern", "a string");
    whitespace = {ws->get<std::string>(), "guided_whitespace_pattern"};
  }
  const bool json_output = found.spec && (found.spec->kind == Spec::Kind::kJsonSchema ||
                                          found.spec->kind == Spec::Kind::kJsonObject);
  if (!whitespace.pattern.empty()) {
    if (!json_output) {
      return ApiError::BadRequest("a whitespace pattern applies to JSON output only",
                                  whitespace.field);
    }
    // Checked here so that its error names its own field.
    structured::RegexOptions options;
    options.json_whitespace = true;
    const Result<structured::Pattern> parsed =
        structured::ParseRegex(whitespace.pattern, options);
    if (!parsed.ok()) {
      return ApiError::BadRequest("'" + whitespace.field + "': " + parsed.status().message(),
                                  whitespace.field);
    }
  }
  if (!found.spec) return std::nullopt;
  found.spec->whitespace_pattern = whitespace.pattern;
  // Their bans could leave a structured output no token to continue with.
  if (params.min_tokens > 0) {
    return ApiError::BadRequest("min_tokens cannot be combined with structured output ('" +
                                    found.field + "')",
                                "min_tokens");
  }
  for (const auto& [field, given] :
       {std::pair{"bad_words", !params.bad_words.empty()},
        std::pair{"allowed_token_ids", !params.sampling.allowed_token_ids.empty()}}) {
    if (given) {
      return ApiError::BadRequest(std::string(field) +
                                      " cannot be combined with structured output ('" +
                                      found.field + "')",
                                  field);
    }
  }
  *out = std::move(found.spec);
  return std::nullopt;
}

}  // namespace headway
