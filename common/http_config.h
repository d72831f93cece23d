// The HTTP API's security settings: the `coordinator` keys that name API
// keys, TLS files and the limits every connection lives under (README
// "Security"). Kept apart from config.cc so the deployment config's other
// sections do not grow with them.
//
//   coordinator:
//     api_key: [key-a, key-b]          # or one string
//     api_key_file: keys.txt           # one key per line
//     metrics_require_api_key: false   # /metrics behind the key too
//     ssl_certfile: cert.pem           # PEM; with ssl_keyfile, HTTPS only
//     ssl_keyfile: key.pem
//     http_max_body_bytes: 16777216    # 413 beyond
//     http_max_header_bytes: 16384     # 431 beyond (request line excluded)
//     http_max_json_depth: 64          # 400 beyond
//     http_max_connections: 256        # open connections; 503 beyond
//     http_read_timeout_ms: 30000      # whole request: line, headers, body
//     http_keep_alive_timeout_ms: 5000 # idle between requests
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/status.h"

namespace headway {

struct HttpApiConfig {
  // Bearer tokens any of which admits a request; empty = no authentication.
  // The coordinator adds api_key_file's lines and --api-key to these.
  std::vector<std::string> api_keys;
  std::string api_key_file;             // "" = none; relative: to the config file's directory
  bool metrics_require_api_key = false;
  std::string ssl_certfile;             // PEM chain; "" = plain HTTP
  std::string ssl_keyfile;              // PEM private key; set with ssl_certfile
  int64_t max_body_bytes = int64_t(16) << 20;
  int max_header_bytes = 16384;
  int max_json_depth = 64;
  int max_connections = 256;
  int read_timeout_ms = 30000;
  int keep_alive_timeout_ms = 5000;
};

// Reads the keys above from the `coordinator` mapping `node` into `out`,
// leaving absent ones at their defaults. Errors: InvalidArgument naming
// the dotted key and the value (a key of the wrong shape, an empty key).
Status ParseHttpApiKeys(const YAML::Node& node, HttpApiConfig& out);

// Range checks. Errors: InvalidArgument naming the key, the value and the
// allowed range; ssl_certfile without ssl_keyfile (or the reverse).
Status ValidateHttpApiConfig(const HttpApiConfig& config);

// Makes api_key_file, ssl_certfile and ssl_keyfile absolute against
// `config_dir` (the config file's directory) when they are relative.
void ResolveHttpApiPaths(HttpApiConfig& config, const std::string& config_dir);

// The keys of an API key file: one per line; blank lines and lines starting
// with '#' are skipped, surrounding spaces and a trailing CR are dropped.
// Errors: NotFound when `path` cannot be read; InvalidArgument when it
// holds no key.
Result<std::vector<std::string>> ReadApiKeyFile(const std::string& path);

}  // namespace headway
