// JSON Schema to a regular language (pattern.h), for structured output:
// the JSON texts a model may write for response_format json_schema or
// json_object.
//
// The language is a subset of the valid documents, written one way: members
// in the order of "properties", no whitespace but `whitespace` after ','
// and ':', numbers without leading zeros and without "-0". Every text of the
// language is valid against the schema; a keyword that the language cannot
// honour exactly is refused rather than ignored, so a model is never led to
// an answer that the schema rejects.
//
// Supported:
//   true, {}                 any JSON value (nesting limited by max_depth)
//   type                     object, array, string, integer, number,
//                            boolean, null, or a list of them; absent, the
//                            keywords decide it ("properties": object,
//                            "items": array, "minLength": string,
//                            "minimum": number), or any value if none does
//   enum, const              the values, written compactly (only "type" may
//                            stand beside them; it keeps the values of that
//                            type)
//   properties, required     required members always, optional ones may be
//                            left out; members of "required" must be listed
//                            in "properties"
//   additionalProperties     false or true: only the listed members; a
//                            schema (without "properties"): any number of
//                            members with values of that schema
//   items, minItems, maxItems, uniqueItems (false)
//   minLength, maxLength     in characters (an escape is one character;
//                            surrogates are written as UTF-8, not escaped)
//   format                   date, time, date-time, uuid
//   pattern                  regex_parser.h's syntax; the whole string
//                            matches it (a subset of the keyword's search
//                            semantics; all of them when anchored ^...$).
//                            Not with minLength, maxLength or format
//   minimum, maximum, exclusiveMinimum, exclusiveMaximum
//                            any number for "integer"; for "number" only
//                            integer minimum and maximum (the fraction is
//                            then free, below an upper bound)
//   anyOf                    alone (beside annotations)
//   oneOf                    alone (beside annotations and OpenAPI's
//                            "discriminator"), when no value can match two
//                            branches: one branch, or a discriminated union
//                            (every branch requires one property with const
//                            or enum values no other branch has)
//   $ref                     "#/$defs/NAME" or "#/definitions/NAME" of the
//                            root schema, alone (beside annotations); not
//                            recursive
//   title, description, $schema, $id, $comment, default, examples,
//   deprecated, readOnly, writeOnly, $defs, definitions: ignored.
// Anything else (other oneOfs, allOf, not, minProperties, prefixItems,
// nullable, ...) is refused.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/structured/pattern.h"

namespace headway::structured {

struct JsonGrammarOptions {
  // What may follow ',' and ':' (and nothing else may stand between
  // tokens): {"a": 1, "b": [1, 2]}. REQUIRES: not null.
  Pattern whitespace = Optional(Literal(" "));
  // Nesting levels of objects and arrays in a value that no schema
  // describes (json_object, `true`, "items" left out): {"a": [1]} has two.
  // Each level doubles the automaton of such a value, so keep it small.
  int max_depth = 5;
};

// One optional space after ',' and ':' and 5 levels of nesting.
JsonGrammarOptions DefaultJsonGrammarOptions();

// Any JSON object, with at most options.max_depth levels of nesting
// counting its own (at least one): OpenAI's {"type": "json_object"}.
Pattern JsonObjectPattern(const JsonGrammarOptions& options);

// The JSON texts valid against `schema` (see the top of this file).
// Errors: InvalidArgument naming the keyword and where it is (a JSON
// pointer into the schema), for a keyword outside the subset ("json_schema
// keyword 'oneOf' at /properties/x is not supported"), a value that is not
// what the keyword takes ("'maxLength' at /properties/name must be a
// non-negative integer"), a count above 10000 (minLength, maxItems, ...), a
// bound beyond ±2^53, an unknown or recursive $ref, or a schema that no
// value satisfies (minimum above maximum, `false`).
Result<Pattern> JsonSchemaPattern(const nlohmann::ordered_json& schema,
                                  const JsonGrammarOptions& options);

}  // namespace headway::structured
