// The HTTP API's config keys (common/http_config.h) through ParseConfig and
// LoadConfigFile, and the API key file reader.
#include "common/http_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/config.h"
#include "tests/support/process.h"

namespace headway {
namespace {

// A minimal config whose coordinator section holds `coordinator_keys`
// (lines indented by two spaces).
std::string WithCoordinator(const std::string& coordinator_keys) {
  return "model:\n  path: model.gguf\ncoordinator:\n" + coordinator_keys +
         "pools:\n  - name: main\n    role: mixed\n    instances:\n      - tp_size: 1\n";
}

void ExpectError(const std::string& coordinator_keys, std::initializer_list<std::string> parts) {
  Result<Config> config = ParseConfig(WithCoordinator(coordinator_keys));
  ASSERT_FALSE(config.ok()) << coordinator_keys;
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  for (const std::string& part : parts) {
    EXPECT_NE(config.status().message().find(part), std::string::npos)
        << "missing '" << part << "' in: " << config.status().message();
  }
}

TEST(HttpConfigTest, DefaultsWithoutTheKeys) {
  Result<Config> config = ParseConfig(WithCoordinator("  http_port: 8000\n"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const HttpApiConfig& http = config->http;
  EXPECT_TRUE(http.api_keys.empty());
  EXPECT_TRUE(http.api_key_file.empty());
  EXPECT_FALSE(http.metrics_require_api_key);
  EXPECT_TRUE(http.ssl_certfile.empty());
  EXPECT_EQ(http.max_body_bytes, 16 << 20);
  EXPECT_EQ(http.max_header_bytes, 16384);
  EXPECT_EQ(http.max_json_depth, 64);
  EXPECT_EQ(http.max_connections, 256);
  EXPECT_EQ(http.read_timeout_ms, 30000);
  EXPECT_EQ(http.keep_alive_timeout_ms, 5000);
}

TEST(HttpConfigTest, ReadsEveryKey) {
  Result<Config> config = ParseConfig(WithCoordinator(
      "  api_key: [alpha, beta]\n  api_key_file: /etc/keys\n  metrics_require_api_key: true\n"
      "  ssl_certfile: /c.pem\n  ssl_keyfile: /k.pem\n  http_max_body_bytes: 4096\n"
      "  http_max_header_bytes: 2048\n  http_max_json_depth: 8\n  http_max_connections: 16\n"
      "  http_read_timeout_ms: 1500\n  http_keep_alive_timeout_ms: 0\n"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const HttpApiConfig& http = config->http;
  EXPECT_EQ(http.api_keys, (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_EQ(http.api_key_file, "/etc/keys");
  EXPECT_TRUE(http.metrics_require_api_key);
  EXPECT_EQ(http.ssl_certfile, "/c.pem");
  EXPECT_EQ(http.ssl_keyfile, "/k.pem");
  EXPECT_EQ(http.max_body_bytes, 4096);
  EXPECT_EQ(http.max_header_bytes, 2048);
  EXPECT_EQ(http.max_json_depth, 8);
  EXPECT_EQ(http.max_connections, 16);
  EXPECT_EQ(http.read_timeout_ms, 1500);
  EXPECT_EQ(http.keep_alive_timeout_ms, 0);

  Result<Config> one = ParseConfig(WithCoordinator("  api_key: solo\n"));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->http.api_keys, (std::vector<std::string>{"solo"}));
}

TEST(HttpConfigTest, RefusesBadValuesNamingTheKey) {
  ExpectError("  api_key: \"\"\n", {"coordinator.api_key", "non-empty"});
  ExpectError("  api_key: []\n", {"coordinator.api_key", "non-empty list"});
  ExpectError("  api_key: [ok, \"\"]\n", {"coordinator.api_key[1]"});
  ExpectError("  api_key: {a: 1}\n", {"coordinator.api_key"});
  ExpectError("  api_key_file: \"\"\n", {"coordinator.api_key_file"});
  ExpectError("  ssl_certfile: /c.pem\n", {"coordinator.ssl_certfile", "ssl_keyfile"});
  ExpectError("  ssl_keyfile: /k.pem\n", {"coordinator.ssl_keyfile", "ssl_certfile"});
  ExpectError("  http_max_body_bytes: 10\n", {"coordinator.http_max_body_bytes", "10", "[1024,"});
  ExpectError("  http_max_header_bytes: 100\n", {"coordinator.http_max_header_bytes", "100"});
  ExpectError("  http_max_json_depth: 1\n", {"coordinator.http_max_json_depth", "[2, 10000]"});
  ExpectError("  http_max_connections: 0\n", {"coordinator.http_max_connections", "[1, 4096]"});
  ExpectError("  http_read_timeout_ms: 5\n", {"coordinator.http_read_timeout_ms", "5"});
  ExpectError("  http_keep_alive_timeout_ms: -1\n", {"coordinator.http_keep_alive_timeout_ms"});
  ExpectError("  metrics_require_api_key: maybe\n", {"coordinator.metrics_require_api_key"});
  ExpectError("  api_keys: [a]\n", {"api_keys", "api_key"});  // a typo of the key
}

TEST(HttpConfigTest, RelativeFilesAreTakenAgainstTheConfigFile) {
  testing::ScopedTempDir dir("http-config");
  const std::string path = dir.path + "/deploy.yaml";
  std::ofstream(path) << WithCoordinator(
      "  api_key_file: keys.txt\n  ssl_certfile: tls/cert.pem\n  ssl_keyfile: /abs/key.pem\n");
  Result<Config> config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const std::string base = std::filesystem::path(dir.path).lexically_normal().string();
  EXPECT_EQ(config->http.api_key_file, base + "/keys.txt");
  EXPECT_EQ(config->http.ssl_certfile, base + "/tls/cert.pem");
  EXPECT_EQ(config->http.ssl_keyfile, "/abs/key.pem");
}

TEST(HttpConfigTest, KeyFileHasOneKeyPerLine) {
  testing::ScopedTempDir dir("http-config");
  const std::string path = dir.path + "/keys.txt";
  std::ofstream(path) << "# team A\nkey-one\r\n\n   key-two  \n#key-three\n";
  Result<std::vector<std::string>> keys = ReadApiKeyFile(path);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{"key-one", "key-two"}));

  std::ofstream(dir.path + "/empty.txt") << "# nothing\n\n";
  Result<std::vector<std::string>> empty = ReadApiKeyFile(dir.path + "/empty.txt");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("holds no key"), std::string::npos);

  Result<std::vector<std::string>> missing = ReadApiKeyFile(dir.path + "/none.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none.txt"), std::string::npos);
}

}  // namespace
}  // namespace headway
