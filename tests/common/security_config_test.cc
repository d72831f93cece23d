#include "common/security_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/config.h"
#include "tests/support/process.h"

namespace headway {
namespace {

constexpr const char* kModelAndPool = R"(
model:
  path: model.gguf
pools:
  - {name: main, role: mixed, instances: [{tp_size: 1}]}
)";

std::string WithSections(const std::string& extra) { return std::string(kModelAndPool) + extra; }

constexpr const char* kAllKeys = R"(
security:
  coordinator_key: /k/coordinator.key_secret
  coordinator_public_key: /k/coordinator.key
  client_key: /k/worker.key_secret
  authorized_keys: /k/authorized
)";

TEST(SecurityConfigTest, ReadsTheKeys) {
  auto config = ParseConfig(WithSections(kAllKeys));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->security.HasKeys());
  EXPECT_EQ(config->security.coordinator_key, "/k/coordinator.key_secret");
  EXPECT_EQ(config->security.coordinator_public_key, "/k/coordinator.key");
  EXPECT_EQ(config->security.client_key, "/k/worker.key_secret");
  EXPECT_EQ(config->security.authorized_keys, "/k/authorized");
  EXPECT_FALSE(config->security.insecure);
  auto none = ParseConfig(kModelAndPool);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->security.HasKeys());
}

TEST(SecurityConfigTest, RefusesPartialKeysInsecureWithKeysAndUnknownKeys) {
  auto partial = ParseConfig(WithSections("security:\n  coordinator_key: /k/c_secret\n"));
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("security.coordinator_public_key"), std::string::npos)
      << partial.status().ToString();
  auto both = ParseConfig(WithSections(std::string(kAllKeys) + "  insecure: true\n"));
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("security.insecure"), std::string::npos)
      << both.status().ToString();
  auto unknown = ParseConfig(WithSections("security:\n  server_key: /k/x\n"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("security.server_key"), std::string::npos)
      << unknown.status().ToString();
  auto not_bool = ParseConfig(WithSections("security:\n  insecure: maybe\n"));
  ASSERT_FALSE(not_bool.ok());
  EXPECT_NE(not_bool.status().message().find("security.insecure"), std::string::npos);
}

TEST(SecurityConfigTest, LocalEndpoints) {
  EXPECT_TRUE(IsLocalControlEndpoint("tcp://127.0.0.1:5557"));
  EXPECT_TRUE(IsLocalControlEndpoint("tcp://127.4.5.6:5557"));
  EXPECT_TRUE(IsLocalControlEndpoint("tcp://localhost:5557"));
  EXPECT_TRUE(IsLocalControlEndpoint("tcp://[::1]:5557"));
  EXPECT_TRUE(IsLocalControlEndpoint("ipc:///tmp/headway.sock"));
  EXPECT_FALSE(IsLocalControlEndpoint("tcp://0.0.0.0:5557"));
  EXPECT_FALSE(IsLocalControlEndpoint("tcp://*:5557"));
  EXPECT_FALSE(IsLocalControlEndpoint("tcp://10.0.0.1:5557"));
  EXPECT_FALSE(IsLocalControlEndpoint("tcp://head:5557"));
  EXPECT_FALSE(IsLocalControlEndpoint("tcp://eth0:5557"));
}

TEST(SecurityConfigTest, ReachableControlPortNeedsKeysOrInsecure) {
  auto local = ParseConfig(kModelAndPool);
  ASSERT_TRUE(local.ok());
  EXPECT_TRUE(CheckControlPlaneSecurity(*local).ok());

  const std::string reachable = "coordinator:\n  control_address: tcp://head:5557\n"
                                "  control_bind: tcp://0.0.0.0:5557\n";
  auto open = ParseConfig(WithSections(reachable));
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  Status refused = CheckControlPlaneSecurity(*open);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("coordinator.control_bind"), std::string::npos) << refused.ToString();
  EXPECT_NE(refused.message().find("headway-keygen"), std::string::npos) << refused.ToString();
  EXPECT_NE(refused.message().find("security.insecure: true"), std::string::npos);

  // Binding loopback while workers dial a name is refused too: the name
  // is not resolved, so it counts as reachable.
  auto dial = ParseConfig(WithSections("coordinator:\n  control_address: tcp://head:5557\n"
                                       "  control_bind: tcp://127.0.0.1:5557\n"));
  ASSERT_TRUE(dial.ok());
  Status dial_refused = CheckControlPlaneSecurity(*dial);
  EXPECT_NE(dial_refused.message().find("coordinator.control_address"), std::string::npos)
      << dial_refused.ToString();

  auto insecure = ParseConfig(WithSections(reachable + "security:\n  insecure: true\n"));
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(CheckControlPlaneSecurity(*insecure).ok());
  auto keyed = ParseConfig(WithSections(reachable + kAllKeys));
  ASSERT_TRUE(keyed.ok());
  EXPECT_TRUE(CheckControlPlaneSecurity(*keyed).ok());
}

TEST(SecurityConfigTest, RelativeKeyFilesAreTakenAgainstTheConfigDirectory) {
  testing::ScopedTempDir dir("security-config");
  const std::string path = dir.path + "/deploy.yaml";
  std::ofstream(path) << kModelAndPool
                      << "security:\n  coordinator_key: keys/c.key_secret\n"
                         "  coordinator_public_key: keys/c.key\n  client_key: /abs/w.key_secret\n"
                         "  authorized_keys: keys/clients\n";
  auto config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->security.coordinator_key, dir.path + "/keys/c.key_secret");
  EXPECT_EQ(config->security.coordinator_public_key, dir.path + "/keys/c.key");
  EXPECT_EQ(config->security.client_key, "/abs/w.key_secret");
  EXPECT_EQ(config->security.authorized_keys, dir.path + "/keys/clients");
}

}  // namespace
}  // namespace headway
