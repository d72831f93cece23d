#include "common/yaml_fields.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace headway::yaml {

Result<std::string> ReadDocumentText(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + what + " `" + path + "`");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::NotFound("cannot read " + what + " `" + path + "`");
  return text.str();
}

Status SyntaxError(const YAML::Exception& e) {
  // yaml-cpp's marks are 0-based.
  std::ostringstream msg;
  msg << "YAML syntax error";
  if (!e.mark.is_null()) msg << " at line " << e.mark.line + 1 << ", column " << e.mark.column + 1;
  msg << ": " << e.msg;
  return Status::InvalidArgument(msg.str());
}

namespace {

// Walks `node` for a mapping that repeats a key; `path` is the dotted key of
// `node` ("" = the document).
Status CheckNoDuplicateKeys(const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      HW_RETURN_IF_ERROR(CheckNoDuplicateKeys(node[i], path + "[" + std::to_string(i) + "]"));
    }
  }
  if (!node.IsMap()) return Status::Ok();
  std::map<std::string, int> first_line;  // key -> its first line, 1-based
  for (const auto& item : node) {
    const std::string key = item.first.IsScalar() ? item.first.Scalar() : Describe(item.first);
    const std::string dotted = path.empty() ? key : path + "." + key;
    const int line = item.first.Mark().line + 1;
    auto [it, inserted] = first_line.emplace(key, line);
    if (!inserted) {
      return Status::InvalidArgument("duplicate key `" + dotted + "` at line " +
                                     std::to_string(line) + " (first at line " +
                                     std::to_string(it->second) +
                                     "): each key may appear once in a mapping");
    }
    HW_RETURN_IF_ERROR(CheckNoDuplicateKeys(item.second, dotted));
  }
  return Status::Ok();
}

}  // namespace

Result<YAML::Node> LoadDocument(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return SyntaxError(e);
  }
  HW_RETURN_IF_ERROR(CheckNoDuplicateKeys(root, ""));
  return root;
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "(empty)";
    case YAML::NodeType::Scalar: return "\"" + node.Scalar() + "\"";
    case YAML::NodeType::Sequence: return "(a list)";
    case YAML::NodeType::Map: return "(a mapping)";
    default: return "(undefined)";
  }
}

Status BadValue(const std::string& key, const std::string& value, const std::string& allowed) {
  return Status::InvalidArgument("`" + key + "` = " + value + " is not allowed: must be " +
                                 allowed);
}

Status CheckKeys(const YAML::Node& map, const std::string& path,
                 const std::vector<std::string>& allowed) {
  for (const auto& item : map) {
    const std::string key = item.first.Scalar();
    bool known = false;
    for (const std::string& a : allowed) known = known || a == key;
    if (known) continue;
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    return Status::InvalidArgument("unknown key `" + (path.empty() ? key : path + "." + key) +
                                   "`; allowed keys " +
                                   (path.empty() ? std::string("at the top level")
                                                 : "in `" + path + "`") +
                                   ": " + list);
  }
  return Status::Ok();
}

Status CheckRange(const std::string& key, int64_t value, int64_t min, int64_t max,
                  const std::string& unit) {
  if (value >= min && value <= max) return Status::Ok();
  return BadValue(key, std::to_string(value),
                  "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]" +
                      (unit.empty() ? "" : " " + unit));
}

Status CheckRealRange(const std::string& key, double value, double min, double max,
                      const std::string& bounds) {
  if (value >= min && value <= max) return Status::Ok();  // false for NaN
  return BadValue(key, std::to_string(value), "a number in " + bounds);
}

Status RequireMap(const YAML::Node& node, const std::string& path) {
  if (node.IsMap()) return Status::Ok();
  return BadValue(path.empty() ? "(document)" : path, Describe(node), "a mapping of keys");
}

Status ReadString(const YAML::Node& node, const std::string& key, std::string& out) {
  if (!node.IsScalar()) return BadValue(key, Describe(node), "a string");
  out = node.Scalar();
  return Status::Ok();
}

Status ReadInt64(const YAML::Node& node, const std::string& key, int64_t& out) {
  if (!node.IsScalar()) return BadValue(key, Describe(node), "an integer");
  const std::string& text = node.Scalar();
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size()) {
    return BadValue(key, Describe(node),
                    "an integer in [" + std::to_string(std::numeric_limits<int64_t>::min()) +
                        ", " + std::to_string(std::numeric_limits<int64_t>::max()) + "]");
  }
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return BadValue(key, Describe(node), "an integer");
  }
  out = value;
  return Status::Ok();
}

Status ReadInt(const YAML::Node& node, const std::string& key, int& out) {
  int64_t value = 0;
  HW_RETURN_IF_ERROR(ReadInt64(node, key, value));
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return BadValue(key, std::to_string(value), "an integer that fits in 32 bits");
  }
  out = static_cast<int>(value);
  return Status::Ok();
}

Status ReadDouble(const YAML::Node& node, const std::string& key, double& out) {
  if (!node.IsScalar()) return BadValue(key, Describe(node), "a number");
  const std::string& text = node.Scalar();
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
      !std::isfinite(value)) {
    return BadValue(key, Describe(node), "a number");
  }
  out = value;
  return Status::Ok();
}

Status ReadBool(const YAML::Node& node, const std::string& key, bool& out) {
  if (!node.IsScalar() || (node.Scalar() != "true" && node.Scalar() != "false")) {
    return BadValue(key, Describe(node), "true or false");
  }
  out = node.Scalar() == "true";
  return Status::Ok();
}

}  // namespace headway::yaml
