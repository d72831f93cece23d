// Readers for YAML configuration fields (yaml-cpp) that turn a value of the
// wrong shape into an error naming the dotted key, the value and what is
// allowed. Shared by the deployment config (config.h) and the head-pattern
// file (head_pattern.h).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace headway::yaml {

// The text of the YAML file at `path`. Errors: NotFound "cannot read
// `what` `path`" when it cannot be opened or read.
Result<std::string> ReadDocumentText(const std::string& path, const std::string& what);

// InvalidArgument "YAML syntax error at line L, column C: ..." (1-based,
// when yaml-cpp knows the place) for a parse exception.
Status SyntaxError(const YAML::Exception& e);

// Parses `text` as one YAML document and refuses a mapping that names a key
// twice (yaml-cpp keeps both and `node[key]` silently returns the first).
// Errors: InvalidArgument "YAML syntax error at line L, ..." for a parse
// error; InvalidArgument "duplicate key `path.key` at line L (first at line
// M)" (1-based lines) for a repeated key at any depth.
Result<YAML::Node> LoadDocument(const std::string& text);

// What a node holds, for messages: "\"text\"" for a scalar, "(a list)",
// "(a mapping)", "(empty)".
std::string Describe(const YAML::Node& node);

// InvalidArgument "`key` = value is not allowed: must be allowed".
Status BadValue(const std::string& key, const std::string& value, const std::string& allowed);

// InvalidArgument naming the first key of `map` outside `allowed` (as
// `path.key`) and the allowed set. `path` "" = the top level.
Status CheckKeys(const YAML::Node& map, const std::string& path,
                 const std::vector<std::string>& allowed);

// InvalidArgument unless `node` is a mapping (`path` "" = the document).
Status RequireMap(const YAML::Node& node, const std::string& path);

// InvalidArgument "`key` = value is not allowed: must be an integer in
// [min, max]" (+ " " + unit when given) unless min <= value <= max. Checked
// before the value enters any arithmetic (byte counts, deadlines).
Status CheckRange(const std::string& key, int64_t value, int64_t min, int64_t max,
                  const std::string& unit = "");
// The same for a real number: "... must be a number in [min, max]", the
// bounds written as `bounds` (e.g. "[1, 1e6]"); NaN is outside every range.
Status CheckRealRange(const std::string& key, double value, double min, double max,
                      const std::string& bounds);

// Scalar readers; `key` is the dotted key for messages. Errors:
// InvalidArgument for a non-scalar or a value that does not parse (integers:
// decimal, the whole text, within int64_t; int: must fit in 32 bits; bool:
// true or false). Ranges particular to a key are checked by the caller
// (CheckRange).
Status ReadString(const YAML::Node& node, const std::string& key, std::string& out);
Status ReadInt64(const YAML::Node& node, const std::string& key, int64_t& out);
Status ReadInt(const YAML::Node& node, const std::string& key, int& out);
Status ReadBool(const YAML::Node& node, const std::string& key, bool& out);
// A decimal number (e.g. 0.9, 1, 5e-1), the whole text; finite.
Status ReadDouble(const YAML::Node& node, const std::string& key, double& out);

}  // namespace headway::yaml
