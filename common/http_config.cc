#include "common/http_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/yaml_fields.h"

namespace headway {
namespace {

using yaml::BadValue;

constexpr const char* kPrefix = "coordinator.";

Status ReadIntKey(const YAML::Node& node, const char* name, int& out) {
  if (!node[name]) return Status::Ok();
  return yaml::ReadInt(node[name], std::string(kPrefix) + name, out);
}

Status ReadStringKey(const YAML::Node& node, const char* name, std::string& out) {
  if (!node[name]) return Status::Ok();
  HW_RETURN_IF_ERROR(yaml::ReadString(node[name], std::string(kPrefix) + name, out));
  // Present but empty would silently mean "off": the writer meant a value.
  if (out.empty()) {
    return BadValue(std::string(kPrefix) + name, "\"\"",
                    "a non-empty value; leave the key out for none");
  }
  return Status::Ok();
}

Status CheckRange(const char* name, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return Status::Ok();
  return BadValue(std::string(kPrefix) + name, std::to_string(value),
                  "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

std::string Trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

}  // namespace

Status ParseHttpApiKeys(const YAML::Node& node, HttpApiConfig& out) {
  if (const YAML::Node keys = node["api_key"]) {
    const std::string key = std::string(kPrefix) + "api_key";
    std::vector<YAML::Node> items;
    if (keys.IsSequence()) {
      for (const YAML::Node& item : keys) items.push_back(item);
      if (items.empty()) return BadValue(key, "[]", "a key or a non-empty list of keys");
    } else {
      items.push_back(keys);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string item_key = keys.IsSequence() ? key + "[" + std::to_string(i) + "]" : key;
      std::string value;
      HW_RETURN_IF_ERROR(yaml::ReadString(items[i], item_key, value));
      if (value.empty()) return BadValue(item_key, "\"\"", "a non-empty key");
      out.api_keys.push_back(std::move(value));
    }
  }
  HW_RETURN_IF_ERROR(ReadStringKey(node, "api_key_file", out.api_key_file));
  if (node["metrics_require_api_key"]) {
    HW_RETURN_IF_ERROR(yaml::ReadBool(node["metrics_require_api_key"],
                                      "coordinator.metrics_require_api_key",
                                      out.metrics_require_api_key));
  }
  HW_RETURN_IF_ERROR(ReadStringKey(node, "ssl_certfile", out.ssl_certfile));
  HW_RETURN_IF_ERROR(ReadStringKey(node, "ssl_keyfile", out.ssl_keyfile));
  if (node["http_max_body_bytes"]) {
    HW_RETURN_IF_ERROR(yaml::ReadInt64(node["http_max_body_bytes"],
                                       "coordinator.http_max_body_bytes", out.max_body_bytes));
  }
  HW_RETURN_IF_ERROR(ReadIntKey(node, "http_max_header_bytes", out.max_header_bytes));
  HW_RETURN_IF_ERROR(ReadIntKey(node, "http_max_json_depth", out.max_json_depth));
  HW_RETURN_IF_ERROR(ReadIntKey(node, "http_max_connections", out.max_connections));
  HW_RETURN_IF_ERROR(ReadIntKey(node, "http_read_timeout_ms", out.read_timeout_ms));
  HW_RETURN_IF_ERROR(ReadIntKey(node, "http_keep_alive_timeout_ms", out.keep_alive_timeout_ms));
  return Status::Ok();
}

Status ValidateHttpApiConfig(const HttpApiConfig& config) {
  if (config.ssl_certfile.empty() != config.ssl_keyfile.empty()) {
    const bool cert = !config.ssl_certfile.empty();
    return BadValue(std::string(kPrefix) + (cert ? "ssl_certfile" : "ssl_keyfile"),
                    "\"" + (cert ? config.ssl_certfile : config.ssl_keyfile) + "\"",
                    std::string("a pair: set coordinator.") + (cert ? "ssl_keyfile" : "ssl_certfile") +
                        " too (or --ssl-certfile and --ssl-keyfile)");
  }
  // A body must hold at least a small JSON request; 1 GiB is already more
  // than any prompt of a supported max_model_len.
  HW_RETURN_IF_ERROR(CheckRange("http_max_body_bytes", config.max_body_bytes, 1024, int64_t(1) << 30));
  // httplib itself refuses a header line over 8 KiB (400).
  HW_RETURN_IF_ERROR(CheckRange("http_max_header_bytes", config.max_header_bytes, 1024, 1 << 20));
  HW_RETURN_IF_ERROR(CheckRange("http_max_json_depth", config.max_json_depth, 2, 10000));
  // Every connection has a thread (cpp-httplib blocks on its socket).
  HW_RETURN_IF_ERROR(CheckRange("http_max_connections", config.max_connections, 1, 4096));
  HW_RETURN_IF_ERROR(CheckRange("http_read_timeout_ms", config.read_timeout_ms, 100, 3600000));
  HW_RETURN_IF_ERROR(
      CheckRange("http_keep_alive_timeout_ms", config.keep_alive_timeout_ms, 0, 3600000));
  return Status::Ok();
}

void ResolveHttpApiPaths(HttpApiConfig& config, const std::string& config_dir) {
  namespace fs = std::filesystem;
  for (std::string* path : {&config.api_key_file, &config.ssl_certfile, &config.ssl_keyfile}) {
    if (path->empty() || fs::path(*path).is_absolute()) continue;
    *path = (fs::path(config_dir) / *path).lexically_normal().string();
  }
}

Result<std::vector<std::string>> ReadApiKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot read the API key file " + path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#') continue;
    keys.push_back(line);
  }
  if (in.bad()) return Status::NotFound("cannot read the API key file " + path);
  if (keys.empty()) {
    return Status::InvalidArgument("the API key file " + path +
                                   " holds no key (one per line; '#' starts a comment)");
  }
  return keys;
}

}  // namespace headway
