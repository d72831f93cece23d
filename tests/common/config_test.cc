#include "common/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/test_env.h"

namespace headway {
namespace {

constexpr const char* kMinimal = R"(
model:
  path: model.gguf
pools:
  - name: main
    role: mixed
    instances:
      - tp_size: 1
)";

// The example documented at the top of common/config.h.
constexpr const char* kFull = R"(
model:
  path: SmolLM2-135M-Instruct.Q4_1.gguf
  served_name: smollm2-135m-instruct
coordinator:
  http_host: 127.0.0.1
  http_port: 8000
  control_address: tcp://127.0.0.1:5557
cache:
  block_size: 16
  kv_memory_mb: 256
scheduler:
  max_num_seqs: 32
  max_num_batched_tokens: 512
  max_model_len: 2048
pools:
  - name: main
    role: mixed
    instances:
      - tp_size: 1
        device: cpu
        hosts: [127.0.0.1]
        num_threads: 2
)";

// Replaces the first occurrence of `from` in `text` with `to`.
std::string Edit(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Asserts that `yaml` fails with InvalidArgument mentioning every part.
void ExpectError(const std::string& yaml, std::initializer_list<std::string> parts) {
  Result<Config> config = ParseConfig(yaml);
  ASSERT_FALSE(config.ok()) << yaml;
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << config.status().ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(config.status().message().find(part), std::string::npos)
        << "message `" << config.status().message() << "` lacks `" << part << "`";
  }
}

TEST(ConfigTest, ParsesDocumentedExample) {
  Result<Config> config = ParseConfig(kFull);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->model_path, "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(config->served_model_name, "smollm2-135m-instruct");
  EXPECT_EQ(config->http_host, "127.0.0.1");
  EXPECT_EQ(config->http_port, 8000);
  EXPECT_EQ(config->control_address, "tcp://127.0.0.1:5557");
  EXPECT_EQ(config->block_size, 16);
  EXPECT_EQ(config->kv_memory_mb, 256);
  EXPECT_EQ(config->max_num_seqs, 32);
  EXPECT_EQ(config->max_num_batched_tokens, 512);
  EXPECT_EQ(config->max_model_len, 2048);
  ASSERT_EQ(config->pools.size(), 1u);
  EXPECT_EQ(config->pools[0].name, "main");
  EXPECT_EQ(config->pools[0].role, PoolRole::kMixed);
  ASSERT_EQ(config->pools[0].instances.size(), 1u);
  const InstanceConfig& instance = config->pools[0].instances[0];
  EXPECT_EQ(instance.tp_size, 1);
  EXPECT_EQ(instance.device, "cpu");
  EXPECT_EQ(instance.hosts, std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(instance.num_threads, 2);
}

TEST(ConfigTest, MinimalUsesDefaults) {
  Result<Config> config = ParseConfig(kMinimal);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Config defaults;
  EXPECT_EQ(config->http_port, defaults.http_port);
  EXPECT_EQ(config->block_size, defaults.block_size);
  EXPECT_EQ(config->pools[0].instances[0].hosts, std::vector<std::string>{"127.0.0.1"});
}

TEST(ConfigTest, ShippedLocalConfigIsValid) {
  Result<Config> config =
      LoadConfigFile(testing::SourceDir() + "/deploy/configs/local.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->pools[0].role, PoolRole::kMixed);
  EXPECT_EQ(config->Instances().size(), 1u);
}

TEST(ConfigTest, ShippedTp3ConfigIsValid) {
  Result<Config> config = LoadConfigFile(testing::SourceDir() + "/deploy/configs/tp3.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->Instances().size(), 1u);
  EXPECT_EQ(config->Instances()[0]->tp_size, 3);
  EXPECT_EQ(config->Instances()[0]->CollectiveBackend(), "shm");
}

// Blocks of SmolLM2 (head_dim 64) a CPU worker of `config` holds.
int64_t SmolLm2BlocksPerWorker(const Config& config) {
  const KvCacheLayout layout{config.block_size, 64, config.kv_cache_dtype};
  return config.kv_memory_mb * int64_t(1024) * 1024 / int64_t(layout.BlockBytes());
}

// The routing benchmark's deployments (bench/conversation_bench.py): each
// instance one worker with one thread, 16,384 SmolLM2 blocks (2,912
// positions) of KV per worker in the default dtype (the arithmetic is in
// two-mixed.yaml).
TEST(ConfigTest, ShippedTwoMixedConfigIsValid) {
  Result<Config> config =
      LoadConfigFile(testing::SourceDir() + "/deploy/configs/two-mixed.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->Instances().size(), 2u);
  for (const InstanceConfig* instance : config->Instances()) {
    EXPECT_EQ(instance->tp_size, 1);
    EXPECT_EQ(instance->num_threads, 1);
  }
  EXPECT_EQ(config->pools[0].role, PoolRole::kMixed);
  EXPECT_EQ(SmolLm2BlocksPerWorker(*config), 16384);
  EXPECT_FALSE(config->kv_transfer_enabled);
}

TEST(ConfigTest, ShippedPd2p2dConfigIsValid) {
  Result<Config> config = LoadConfigFile(testing::SourceDir() + "/deploy/configs/pd-2p2d.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->pools.size(), 2u);
  EXPECT_EQ(config->pools[0].role, PoolRole::kPrefill);
  EXPECT_EQ(config->pools[1].role, PoolRole::kDecode);
  ASSERT_EQ(config->Instances().size(), 4u);
  for (const InstanceConfig* instance : config->Instances()) {
    EXPECT_EQ(instance->tp_size, 1);
    EXPECT_EQ(instance->num_threads, 1);
  }
  EXPECT_EQ(SmolLm2BlocksPerWorker(*config), 16384);
  EXPECT_TRUE(config->kv_transfer_enabled);
  EXPECT_EQ(config->kv_transfer_transports, "tcp");
}

TEST(ConfigTest, CollectiveBackendAndItsDefaults) {
  const std::string base = Edit(kFull, "num_threads: 2", "num_threads: 2\n        collective: gloo\n        collective_timeout_ms: 5000");
  Result<Config> config = ParseConfig(base);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->Instances()[0]->CollectiveBackend(), "gloo");
  EXPECT_EQ(config->Instances()[0]->collective_timeout_ms, 5000);

  InstanceConfig instance;
  EXPECT_EQ(instance.CollectiveBackend(), "shm");  // cpu, one host
  instance.tp_size = 2;
  instance.hosts = {"10.0.0.1", "10.0.0.2"};
  EXPECT_EQ(instance.CollectiveBackend(), "gloo");
  instance.device = "cuda:0";
  EXPECT_EQ(instance.CollectiveBackend(), "nccl");

  ExpectError(Edit(base, "collective: gloo", "collective: mpi"),
              {"pools[0].instances[0].collective", "mpi", "gloo", "shm", "nccl"});
  ExpectError(Edit(base, "collective: gloo", "collective: nccl"),
              {"pools[0].instances[0].collective", "nccl", "CUDA"});
  ExpectError(Edit(Edit(base, "collective: gloo", "collective: shm"), "tp_size: 1\n        device: cpu\n        hosts: [127.0.0.1]",
                   "tp_size: 2\n        device: cpu\n        hosts: [10.0.0.1, 10.0.0.2]"),
              {"pools[0].instances[0].collective", "shm", "one host"});
  ExpectError(Edit(base, "collective_timeout_ms: 5000", "collective_timeout_ms: 0"),
              {"pools[0].instances[0].collective_timeout_ms", "0"});
}

TEST(ConfigTest, KvTransferSection) {
  Result<Config> plain = ParseConfig(kFull);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->KvTransferEnabled());
  const std::string yaml =
      std::string(kMinimal) + "kv_transfer:\n  transports: tcp\n  timeout_ms: 2000\n";
  Result<Config> config = ParseConfig(yaml);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->KvTransferEnabled());
  EXPECT_EQ(config->kv_transfer_transports, "tcp");
  EXPECT_EQ(config->kv_transfer_timeout_ms, 2000);
  ExpectError(Edit(yaml, "timeout_ms: 2000", "timeout_ms: 0"), {"kv_transfer.timeout_ms", "0"});
  ExpectError(Edit(yaml, "transports:", "tls:"), {"kv_transfer", "tls", "transports"});
}

TEST(ConfigTest, InstancesAreInPoolThenInstanceOrder) {
  Result<Config> config = ParseConfig(R"(
model: {path: m.gguf}
pools:
  - name: p
    role: prefill
    instances: [{tp_size: 1}, {tp_size: 3, hosts: [a, b, c]}]
  - name: d
    role: decode
    instances: [{tp_size: 2}]
)");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  std::vector<const InstanceConfig*> instances = config->Instances();
  ASSERT_EQ(instances.size(), 3u);
  EXPECT_EQ(instances[0]->tp_size, 1);
  EXPECT_EQ(instances[1]->tp_size, 3);
  EXPECT_EQ(instances[2]->tp_size, 2);
  EXPECT_STREQ(PoolRoleName(config->pools[1].role), "decode");
}

TEST(ConfigTest, PoolsDeclaredByCountOrRange) {
  Result<Config> config = ParseConfig(R"(
model: {path: m.gguf}
pools:
  - name: p
    role: prefill
    instances: {count: 2, template: {tp_size: 1, num_threads: 1}}
  - name: d
    role: decode
    instances: {min: 1, max: 3, template: {tp_size: 2}}
)");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->Instances().size(), 5u);
  EXPECT_EQ(config->pools[0].NumInitial(), 2);
  EXPECT_EQ(config->pools[0].instances[1].num_threads, 1);
  EXPECT_EQ(config->pools[1].NumInitial(), 1);
  EXPECT_EQ(config->pools[1].instances[2].tp_size, 2);
  // Ids 0-1 prefill, 2 the decode instance that starts, 3-4 its standby slots.
  EXPECT_FALSE(config->IsStandby(1));
  EXPECT_FALSE(config->IsStandby(2));
  EXPECT_TRUE(config->IsStandby(3));
  EXPECT_TRUE(config->IsStandby(4));
  // A list starts every instance.
  Result<Config> listed = ParseConfig(kMinimal);
  ASSERT_TRUE(listed.ok());
  EXPECT_FALSE(listed->IsStandby(0));
}

TEST(ConfigTest, PoolRangeErrorsNameTheKey) {
  const std::string head = "model: {path: m.gguf}\npools:\n  - name: d\n    instances: ";
  ExpectError(head + "{count: 0, template: {tp_size: 1}}", {"pools[0].instances.count", "0", ">= 1"});
  ExpectError(head + "{min: 2, max: 1, template: {tp_size: 1}}",
              {"pools[0].instances.max", "1", ">= 2"});
  ExpectError(head + "{min: 1, template: {tp_size: 1}}", {"pools[0].instances", "`min` and `max`"});
  ExpectError(head + "{count: 1, max: 2, template: {tp_size: 1}}",
              {"pools[0].instances", "either `count` or `min` and `max`"});
  ExpectError(head + "{count: 2}", {"pools[0].instances.template"});
  ExpectError(head + "{count: 2, template: {tp_size: 1}, size: 3}",
              {"pools[0].instances.size", "count", "template"});
  ExpectError(head + "{count: 2, template: {tp_sise: 1}}", {"pools[0].instances.template.tp_sise"});
  ExpectError(head + "{count: 100000, template: {tp_size: 1}}",
              {"pools[0].instances.count", "100000", "at most 256"});
  ExpectError(head + "7", {"pools[0].instances", "{count: N, template: {...}}"});
}

TEST(ConfigTest, UnknownKeyNamesKeyAndAllowedKeys) {
  ExpectError(Edit(kFull, "block_size:", "blocksize:"),
              {"cache.blocksize", "block_size", "kv_memory_mb"});
  ExpectError(Edit(kFull, "num_threads:", "threads:"),
              {"pools[0].instances[0].threads", "tp_size", "device", "hosts", "num_threads"});
  ExpectError(std::string(kMinimal) + "extra: 1\n", {"extra", "model", "pools"});
}

TEST(ConfigTest, BlockSizeMustBePowerOfTwoUpTo256) {
  ExpectError(Edit(kFull, "block_size: 16", "block_size: 48"),
              {"cache.block_size", "48", "power of two in [1, 256]"});
  ExpectError(Edit(kFull, "block_size: 16", "block_size: 512"),
              {"cache.block_size", "512", "power of two"});
  ExpectError(Edit(kFull, "block_size: 16", "block_size: 0"), {"cache.block_size", "0"});
  for (int ok : {1, 2, 64, 256}) {
    EXPECT_TRUE(ParseConfig(Edit(kFull, "block_size: 16", "block_size: " + std::to_string(ok))).ok());
  }
}

TEST(ConfigTest, LimitsMustBePositive) {
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 0"),
              {"cache.kv_memory_mb", "0", "[1, "});
  ExpectError(Edit(kFull, "max_num_seqs: 32", "max_num_seqs: -1"),
              {"scheduler.max_num_seqs", "-1", "[1, "});
  ExpectError(Edit(kFull, "max_num_batched_tokens: 512", "max_num_batched_tokens: 0"),
              {"scheduler.max_num_batched_tokens", "0", "[1, "});
  ExpectError(Edit(kFull, "max_model_len: 2048", "max_model_len: 0"),
              {"scheduler.max_model_len", "0", "[1, "});
  ExpectError(Edit(kFull, "control_address: tcp://127.0.0.1:5557",
                   "control_address: tcp://127.0.0.1:5557\n  drain_timeout_ms: 0"),
              {"coordinator.drain_timeout_ms", "0", "[1, "});
}

// Every number is bounded before it enters arithmetic: 99999999999999 MiB
// once overflowed into a negative pool size that only the worker reported.
TEST(ConfigTest, NumbersAreRangeCheckedBeforeArithmetic) {
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 99999999999999"),
              {"cache.kv_memory_mb", "99999999999999", "[1, 16777216] (MiB)"});
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 99999999999999999999"),
              {"cache.kv_memory_mb", "99999999999999999999", "9223372036854775807"});
  ExpectError(Edit(kFull, "max_model_len: 2048", "max_model_len: 2147483647"),
              {"scheduler.max_model_len", "2147483647", "[1, 16777216]"});
  ExpectError(Edit(kFull, "max_num_seqs: 32", "max_num_seqs: 100000"),
              {"scheduler.max_num_seqs", "100000", "[1, 65536]"});
  ExpectError(Edit(kFull, "max_num_batched_tokens: 512", "max_num_batched_tokens: 2000000000"),
              {"scheduler.max_num_batched_tokens", "2000000000", "[1, 16777216]"});
  ExpectError(Edit(kFull, "tp_size: 1", "tp_size: 5000"),
              {"pools[0].instances[0].tp_size", "5000", "[1, 1024]"});
  ExpectError(Edit(kFull, "num_threads: 2", "num_threads: 100000"),
              {"pools[0].instances[0].num_threads", "100000", "[0, 4096]"});
  ExpectError(Edit(kFull, "num_threads: 2", "num_threads: 2\n        collective_timeout_ms: 2147483647"),
              {"pools[0].instances[0].collective_timeout_ms", "2147483647", "[1, 86400000] (ms)"});
  const std::string coordinator = "control_address: tcp://127.0.0.1:5557";
  // The node agent adds drain_timeout_ms and heartbeat_timeout_ms in an int.
  ExpectError(Edit(kFull, coordinator, coordinator + "\n  drain_timeout_ms: 2147483647"),
              {"coordinator.drain_timeout_ms", "2147483647", "[1, 86400000] (ms)"});
  ExpectError(Edit(kFull, coordinator,
                   coordinator + "\n  heartbeat_interval_ms: 1000\n  heartbeat_timeout_ms: "
                                 "2147483647"),
              {"coordinator.heartbeat_timeout_ms", "2147483647", "[1, 86400000] (ms)"});
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\nkv_transfer:\n  timeout_ms: "
                                               "2147483647"),
              {"kv_transfer.timeout_ms", "2147483647", "[1, 86400000] (ms)"});
  ExpectError(std::string(kFull) + "launch:\n  connect_timeout_s: 2147483647\n",
              {"launch.connect_timeout_s", "2147483647", "[1, 3600]"});
  ExpectError(Edit(kFull, coordinator, coordinator + "\n  control_max_message_mb: 5000"),
              {"coordinator.control_max_message_mb", "5000", "[1, 4096] (MiB)"});
  ExpectError(Edit(kFull, coordinator, coordinator + "\n  control_max_message_mb: 0"),
              {"coordinator.control_max_message_mb", "0", "[1, 4096] (MiB)"});
  // The bounds themselves are allowed.
  EXPECT_TRUE(ParseConfig(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 16777216")).ok());
  EXPECT_TRUE(ParseConfig(Edit(kFull, "max_model_len: 2048", "max_model_len: 16777216")).ok());
}

// yaml-cpp keeps both entries of a repeated key and `node[key]` returns the
// first, so the second would be silently ignored.
TEST(ConfigTest, DuplicateKeysAreRefusedWithKeyAndLine) {
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  kv_memory_mb: 512"),
              {"duplicate key `cache.kv_memory_mb`", "at line 12", "first at line 11"});
  ExpectError(std::string(kFull) + "model:\n  path: other.gguf\n",
              {"duplicate key `model`", "first at line 2"});
  ExpectError(Edit(kFull, "num_threads: 2", "num_threads: 2\n        tp_size: 3"),
              {"duplicate key `pools[0].instances[0].tp_size`"});
}

TEST(ConfigTest, ControlMessageLimitAndChatSpecialTokens) {
  Result<Config> defaults = ParseConfig(kFull);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->control_max_message_mb, 64);
  EXPECT_FALSE(defaults->chat_parse_special_in_content);
  Result<Config> set = ParseConfig(
      Edit(kFull, "control_address: tcp://127.0.0.1:5557",
           "control_address: tcp://127.0.0.1:5557\n  control_max_message_mb: 8") +
      "chat:\n  parse_special_in_content: true\n");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->control_max_message_mb, 8);
  EXPECT_TRUE(set->chat_parse_special_in_content);
  ExpectError(std::string(kFull) + "chat:\n  parse_special_in_content: yes\n",
              {"chat.parse_special_in_content", "yes", "true or false"});
  ExpectError(std::string(kFull) + "chat:\n  split_special_tokens: true\n",
              {"unknown key `chat.split_special_tokens`", "parse_special_in_content"});
}

TEST(ConfigTest, HttpPortRange) {
  ExpectError(Edit(kFull, "http_port: 8000", "http_port: 70000"),
              {"coordinator.http_port", "70000", "[0, 65535]"});
  EXPECT_TRUE(ParseConfig(Edit(kFull, "http_port: 8000", "http_port: 0")).ok());
}

TEST(ConfigTest, WrongTypeNamesKeyValueAndType) {
  ExpectError(Edit(kFull, "max_num_seqs: 32", "max_num_seqs: lots"),
              {"scheduler.max_num_seqs", "lots", "an integer"});
  ExpectError(Edit(kFull, "max_num_seqs: 32", "max_num_seqs: 1.5"),
              {"scheduler.max_num_seqs", "1.5", "an integer"});
  ExpectError(Edit(kFull, "hosts: [127.0.0.1]", "hosts: 127.0.0.1"),
              {"pools[0].instances[0].hosts", "127.0.0.1", "a list"});
  ExpectError(Edit(kFull, "http_host: 127.0.0.1", "http_host: [a, b]"),
              {"coordinator.http_host", "a list", "a string"});
  ExpectError(Edit(kFull, "tp_size: 1", "tp_size: 99999999999"),
              {"pools[0].instances[0].tp_size", "99999999999", "32 bits"});
}

TEST(ConfigTest, RoleMustBeKnown) {
  ExpectError(Edit(kFull, "role: mixed", "role: both"),
              {"pools[0].role", "both", "mixed, prefill, decode"});
}

TEST(ConfigTest, PrefillNeedsDecode) {
  ExpectError(Edit(kFull, "role: mixed", "role: prefill"), {"prefill", "decode"});
}

TEST(ConfigTest, TpSizeAndDevice) {
  ExpectError(Edit(kFull, "tp_size: 1", "tp_size: 0"),
              {"pools[0].instances[0].tp_size", "0", "[1, "});
  ExpectError(Edit(kFull, "device: cpu", "device: tpu"),
              {"pools[0].instances[0].device", "tpu", "cpu", "cuda:N"});
  ExpectError(Edit(kFull, "device: cpu", "device: \"cuda:x\""), {"pools[0].instances[0].device", "cuda:x"});
  EXPECT_TRUE(ParseConfig(Edit(kFull, "device: cpu", "device: cuda:1")).ok());
}

TEST(ConfigTest, HostsMustMatchTpSize) {
  std::string tp3 = Edit(kFull, "tp_size: 1", "tp_size: 3");
  EXPECT_TRUE(ParseConfig(tp3).ok());  // one host for all ranks
  EXPECT_TRUE(ParseConfig(Edit(tp3, "hosts: [127.0.0.1]", "hosts: [a, b, c]")).ok());
  ExpectError(Edit(tp3, "hosts: [127.0.0.1]", "hosts: [a, b]"),
              {"pools[0].instances[0].hosts", "2 hosts", "tp_size = 3"});
  ExpectError(Edit(tp3, "hosts: [127.0.0.1]", "hosts: []"), {"pools[0].instances[0].hosts", "0"});
}

TEST(ConfigTest, NeedsPoolsWithInstances) {
  ExpectError("model: {path: m.gguf}\n", {"pools", "at least one"});
  ExpectError("model: {path: m.gguf}\npools: []\n", {"pools", "at least one"});
  ExpectError("model: {path: m.gguf}\npools: [{name: a, instances: []}]\n",
              {"pools[0].instances", "empty", "at least one"});
  ExpectError("model: {path: m.gguf}\npools: [{name: a, role: mixed}]\n",
              {"pools[0].instances", "at least one"});
  ExpectError(
      "model: {path: m.gguf}\npools: [{name: a, instances: [{}]}, {name: a, instances: [{}]}]\n",
      {"pools[1].name", "\"a\""});
}

TEST(ConfigTest, ModelPathRequired) {
  ExpectError("pools: [{instances: [{}]}]\n", {"model.path"});
  ExpectError("model: {served_name: x}\npools: [{instances: [{}]}]\n", {"model.path"});
}

TEST(ConfigTest, SyntaxErrorIsInvalidArgumentWithLine) {
  ExpectError("model:\n  path: [unclosed\n", {"YAML", "line"});
  ExpectError("", {"mapping"});
}

TEST(ConfigTest, ValidateConfigChecksOverrides) {
  Result<Config> config = ParseConfig(kFull);
  ASSERT_TRUE(config.ok());
  config->http_port = -5;
  Status status = ValidateConfig(*config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("coordinator.http_port"), std::string::npos);
  EXPECT_NE(status.message().find("-5"), std::string::npos);
}

TEST(ConfigTest, LoadConfigFileErrors) {
  Result<Config> missing = LoadConfigFile("/nonexistent/headway.yaml");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/headway.yaml"), std::string::npos);

  std::string path = ::testing::TempDir() + "/headway_config_test.yaml";
  {
    std::ofstream out(path);
    out << Edit(kFull, "block_size: 16", "block_size: 3");
  }
  Result<Config> bad = LoadConfigFile(path);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
  EXPECT_NE(bad.status().message().find("cache.block_size"), std::string::npos);
  std::remove(path.c_str());
}

TEST(ConfigTest, ResolveModelPath) {
  Config config;
  config.model_path = "m.gguf";
  ResolveModelPath(config, "/models/dir/");
  EXPECT_EQ(config.model_path, "/models/dir/m.gguf");
  config.model_path = "/abs/m.gguf";
  ResolveModelPath(config, "/models");
  EXPECT_EQ(config.model_path, "/abs/m.gguf");
  config.model_path = "m.gguf";
  ResolveModelPath(config, "");
  EXPECT_TRUE(std::filesystem::path(config.model_path).is_absolute());
}

TEST(ConfigTest, PrefixCachingIsOnByDefaultAndCanBeTurnedOff) {
  Result<Config> on = ParseConfig(kFull);
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->enable_prefix_caching);
  Result<Config> off = ParseConfig(
      Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  enable_prefix_caching: false"));
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_FALSE(off->enable_prefix_caching);
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  enable_prefix_caching: 3"),
              {"cache.enable_prefix_caching", "3", "true or false"});
}

TEST(ConfigTest, RecyclingGranularity) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->recycling_granularity, "kv_head");
  Result<Config> layer = ParseConfig(
      Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  recycling_granularity: layer"));
  ASSERT_TRUE(layer.ok()) << layer.status().ToString();
  EXPECT_EQ(layer->recycling_granularity, "layer");
  ExpectError(
      Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  recycling_granularity: head"),
      {"cache.recycling_granularity", "head", "kv_head, layer"});
}

TEST(ConfigTest, KvCacheDtype) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->kv_cache_dtype, KvCacheDtype::kFloat16);
  for (const char* name : {"float32", "float16", "q8_0", "q4_0", "q4_0_hadamard"}) {
    Result<Config> c = ParseConfig(
        Edit(kFull, "kv_memory_mb: 256", std::string("kv_memory_mb: 256\n  kv_cache_dtype: ") + name));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_STREQ(KvCacheDtypeName(c->kv_cache_dtype), name);
  }
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  kv_cache_dtype: fp8"),
              {"cache.kv_cache_dtype", "fp8", "float32, float16, q8_0, q4_0, q4_0_hadamard"});
  // CUDA instances take every dtype too.
  for (const char* name : {"float32", "q8_0", "q4_0_hadamard"}) {
    EXPECT_TRUE(ParseConfig(Edit(Edit(kFull, "kv_memory_mb: 256",
                                      std::string("kv_memory_mb: 256\n  kv_cache_dtype: ") + name),
                                 "device: cpu", "device: \"cuda:0\""))
                    .ok())
        << name;
  }
}

TEST(ConfigTest, KvCacheDtypeSliding) {
  Result<Config> by_default = ParseConfig(
      Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  kv_cache_dtype: q4_0"));
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_FALSE(by_default->kv_cache_dtype_sliding.has_value());
  // Unset: sliding slots take cache.kv_cache_dtype.
  EXPECT_EQ(by_default->kv_cache_dtypes(),
            (KvCacheDtypes{KvCacheDtype::kQ4_0, KvCacheDtype::kQ4_0}));
  for (const char* name : {"float32", "float16", "q8_0", "q4_0", "q4_0_hadamard"}) {
    Result<Config> c = ParseConfig(Edit(
        kFull, "kv_memory_mb: 256", std::string("kv_memory_mb: 256\n  kv_cache_dtype_sliding: ") + name));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE(c->kv_cache_dtype_sliding.has_value());
    EXPECT_STREQ(KvCacheDtypeName(*c->kv_cache_dtype_sliding), name);
    EXPECT_EQ(c->kv_cache_dtypes().full, KvCacheDtype::kFloat16);
    EXPECT_STREQ(KvCacheDtypeName(c->kv_cache_dtypes().sliding), name);
  }
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  kv_cache_dtype_sliding: fp8"),
              {"cache.kv_cache_dtype_sliding", "fp8", "float32, float16, q8_0, q4_0, q4_0_hadamard"});
  ExpectError(Edit(kFull, "kv_memory_mb: 256", "kv_memory_mb: 256\n  kv_cache_dtype_sliding: [q8_0]"),
              {"cache.kv_cache_dtype_sliding"});
  const std::string cuda = Edit(kFull, "device: cpu", "device: \"cuda:0\"");
  EXPECT_TRUE(ParseConfig(Edit(cuda, "kv_memory_mb: 256",
                               "kv_memory_mb: 256\n  kv_cache_dtype_sliding: q8_0"))
                  .ok());
}

TEST(ConfigTest, AdmissionPolicy) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->admission_policy, "guaranteed_no_evict");
  Result<Config> max_utilization = ParseConfig(
      Edit(kFull, "max_num_seqs: 32", "max_num_seqs: 32\n  admission_policy: max_utilization"));
  ASSERT_TRUE(max_utilization.ok()) << max_utilization.status().ToString();
  EXPECT_EQ(max_utilization->admission_policy, "max_utilization");
  ExpectError(Edit(kFull, "max_num_seqs: 32", "max_num_seqs: 32\n  admission_policy: greedy"),
              {"scheduler.admission_policy", "greedy", "guaranteed_no_evict", "max_utilization"});
  ExpectError(Edit(kFull, "max_num_seqs: 32", "max_num_seqs: 32\n  admission_policy: [1]"),
              {"scheduler.admission_policy"});
}

TEST(ConfigTest, Routing) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->routing_policy, "prefix_aware");
  EXPECT_EQ(by_default->routing_prefix_weight, 8.0);
  const std::string pools = "pools:\n";
  Result<Config> set = ParseConfig(
      Edit(kFull, pools, "routing:\n  policy: round_robin\n  prefix_weight: 0.5\n" + pools));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->routing_policy, "round_robin");
  EXPECT_EQ(set->routing_prefix_weight, 0.5);
  ExpectError(Edit(kFull, pools, "routing:\n  policy: cache_aware\n" + pools),
              {"routing.policy", "cache_aware", "prefix_aware, least_loaded, round_robin"});
  ExpectError(Edit(kFull, pools, "routing:\n  prefix_weight: -1\n" + pools),
              {"routing.prefix_weight", "-1", "[0, 1e6]"});
  ExpectError(Edit(kFull, pools, "routing:\n  prefix_weight: .nan\n" + pools),
              {"routing.prefix_weight", "nan"});
  ExpectError(Edit(kFull, pools, "routing:\n  temperature: 0.5\n" + pools),
              {"routing", "temperature"});
}

TEST(ConfigTest, RoutingBalanceGuard) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->routing_balance_abs_threshold, -1);  // no guard
  EXPECT_EQ(by_default->routing_balance_rel_threshold, 1.5);
  const std::string pools = "pools:\n";
  Result<Config> set = ParseConfig(Edit(
      kFull, pools,
      "routing:\n  balance_abs_threshold: 2\n  balance_rel_threshold: 1.25\n" + pools));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->routing_balance_abs_threshold, 2);
  EXPECT_EQ(set->routing_balance_rel_threshold, 1.25);
  ExpectError(Edit(kFull, pools, "routing:\n  balance_abs_threshold: -2\n" + pools),
              {"routing.balance_abs_threshold", "-2", "-1 = no guard"});
  ExpectError(Edit(kFull, pools, "routing:\n  balance_rel_threshold: 0.5\n" + pools),
              {"routing.balance_rel_threshold", "0.5", "[1, 1e6]"});
  ExpectError(Edit(kFull, pools, "routing:\n  balance_rel_threshold: .nan\n" + pools),
              {"routing.balance_rel_threshold", "nan"});
}

TEST(ConfigTest, ConditionalDisaggregationThresholds) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->routing_max_local_prefill_tokens, 0);
  EXPECT_EQ(by_default->routing_max_prefill_queue_tokens, 0);
  const std::string pools = "pools:\n";
  Result<Config> set = ParseConfig(Edit(
      kFull, pools,
      "routing:\n  max_local_prefill_tokens: 256\n  max_prefill_queue_tokens: 4096\n" + pools));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->routing_max_local_prefill_tokens, 256);
  EXPECT_EQ(set->routing_max_prefill_queue_tokens, 4096);
  ExpectError(Edit(kFull, pools, "routing:\n  max_local_prefill_tokens: -1\n" + pools),
              {"routing.max_local_prefill_tokens", "-1"});
  ExpectError(Edit(kFull, pools, "routing:\n  max_prefill_queue_tokens: -5\n" + pools),
              {"routing.max_prefill_queue_tokens", "-5", "0 = no limit"});
  ExpectError(Edit(kFull, pools, "routing:\n  max_local_prefill_tokens: many\n" + pools),
              {"routing.max_local_prefill_tokens", "many"});
}

TEST(ConfigTest, HeadPatternIsOptional) {
  Result<Config> config = ParseConfig(kFull);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->head_pattern_path, "");
  Result<Config> with = ParseConfig(Edit(kFull, "served_name: smollm2-135m-instruct",
                                         "served_name: smollm2-135m-instruct\n"
                                         "  head_pattern: heads/streaming.yaml"));
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->head_pattern_path, "heads/streaming.yaml");  // ParseConfig keeps it as written
}

TEST(ConfigTest, HeadPatternMustBeANonEmptyString) {
  ExpectError(Edit(kFull, "served_name: smollm2-135m-instruct",
                   "served_name: smollm2-135m-instruct\n  head_pattern: \"\""),
              {"model.head_pattern", "\"\"", "head-pattern YAML file", "leave the key out"});
  ExpectError(Edit(kFull, "served_name: smollm2-135m-instruct",
                   "served_name: smollm2-135m-instruct\n  head_pattern: [a.yaml]"),
              {"model.head_pattern", "(a list)", "a string"});
  ExpectError(Edit(kFull, "served_name: smollm2-135m-instruct",
                   "served_name: smollm2-135m-instruct\n  head_patern: a.yaml"),
              {"unknown key `model.head_patern`", "head_pattern"});
}

TEST(ConfigTest, LoadConfigFileResolvesHeadPatternAgainstTheConfigDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "headway_config_head_pattern";
  fs::create_directories(dir / "sub");
  const std::string with_pattern = Edit(kFull, "served_name: smollm2-135m-instruct",
                                        "served_name: smollm2-135m-instruct\n"
                                        "  head_pattern: ../heads.yaml");
  const fs::path path = dir / "sub" / "deploy.yaml";
  {
    std::ofstream out(path);
    out << with_pattern;
  }
  Result<Config> config = LoadConfigFile(path.string());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->head_pattern_path, (dir / "heads.yaml").lexically_normal().string());
  {
    std::ofstream out(path);
    out << Edit(with_pattern, "../heads.yaml", "/abs/heads.yaml");
  }
  config = LoadConfigFile(path.string());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->head_pattern_path, "/abs/heads.yaml");
  fs::remove_all(dir);
}

TEST(ConfigTest, ShippedStreamingConfigIsValid) {
  Result<Config> config =
      LoadConfigFile(testing::SourceDir() + "/deploy/configs/smollm2-streaming.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const std::filesystem::path expected = std::filesystem::absolute(
      testing::SourceDir() + "/deploy/configs/smollm2-streaming-heads.yaml");
  EXPECT_EQ(config->head_pattern_path, expected.lexically_normal().string());
  EXPECT_TRUE(std::filesystem::exists(config->head_pattern_path));
}

TEST(ConfigTest, ShippedGemma3ConfigIsValid) {
  Result<Config> config = LoadConfigFile(testing::SourceDir() + "/deploy/configs/gemma3.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->model_path, "gemma-3-270m-q4_k_m.gguf");
  EXPECT_TRUE(config->enable_recycling);
}

TEST(ConfigTest, GpuMemoryUtilizationIsAFraction) {
  Result<Config> by_default = ParseConfig(kFull);
  ASSERT_TRUE(by_default.ok());
  EXPECT_DOUBLE_EQ(by_default->gpu_memory_utilization, 0.9);
  const std::string key = "kv_memory_mb: 256";
  Result<Config> half = ParseConfig(Edit(kFull, key, key + "\n  gpu_memory_utilization: 0.5"));
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  EXPECT_DOUBLE_EQ(half->gpu_memory_utilization, 0.5);
  EXPECT_TRUE(ParseConfig(Edit(kFull, key, key + "\n  gpu_memory_utilization: 1")).ok());
  for (const char* bad : {"0", "1.5", "-0.1"}) {
    ExpectError(Edit(kFull, key, key + "\n  gpu_memory_utilization: " + bad),
                {"cache.gpu_memory_utilization", "(0, 1]"});
  }
  ExpectError(Edit(kFull, key, key + "\n  gpu_memory_utilization: most"),
              {"cache.gpu_memory_utilization", "most", "a number"});
}

TEST(ConfigTest, CudaRanksTakeConsecutiveGpusPerHost) {
  InstanceConfig instance;
  EXPECT_EQ(instance.CudaDevice(0), -1);  // cpu
  instance.device = "cuda:2";
  instance.tp_size = 3;
  EXPECT_EQ(instance.CudaDevice(0), 2);
  EXPECT_EQ(instance.CudaDevice(2), 4);
  instance.hosts = {"10.0.0.1", "10.0.0.2", "10.0.0.1"};
  EXPECT_EQ(instance.CudaDevice(0), 2);
  EXPECT_EQ(instance.CudaDevice(1), 2);
  EXPECT_EQ(instance.CudaDevice(2), 3);
}

TEST(ConfigTest, ShippedCudaConfigIsValid) {
  Result<Config> config = LoadConfigFile(testing::SourceDir() + "/deploy/configs/cuda.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const InstanceConfig& instance = *config->Instances()[0];
  EXPECT_EQ(instance.CudaDevice(0), 0);
  EXPECT_EQ(instance.CollectiveBackend(), "nccl");
  EXPECT_DOUBLE_EQ(config->gpu_memory_utilization, 0.9);
}

// ---- addresses: bind vs advertise -------------------------------------------

constexpr const char* kTwoHosts = R"(
model: {path: m.gguf}
coordinator:
  control_address: tcp://coordinator.headway.svc:5557
  control_bind: tcp://0.0.0.0:5557
pools:
  - instances:
      - {tp_size: 1}
      - {tp_size: 3, collective: gloo, hosts: [127.0.0.1, worker-1, worker-2]}
host_addresses:
  worker-1: {bind: 0.0.0.0, advertise: 10.1.2.3}
  worker-2: {bind: eth-addr.local}
  127.0.0.1: {advertise: localhost}
)";

TEST(ConfigTest, ControlBindDefaultsToControlAddress) {
  Result<Config> minimal = ParseConfig(kMinimal);
  ASSERT_TRUE(minimal.ok()) << minimal.status().ToString();
  EXPECT_EQ(minimal->control_bind, "");
  EXPECT_EQ(minimal->ControlBindAddress(), "tcp://127.0.0.1:5557");
  Result<Config> split = ParseConfig(kTwoHosts);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  EXPECT_EQ(split->control_address, "tcp://coordinator.headway.svc:5557");
  EXPECT_EQ(split->ControlBindAddress(), "tcp://0.0.0.0:5557");
}

TEST(ConfigTest, ControlBindErrorsNameTheKey) {
  ExpectError(Edit(kTwoHosts, "tcp://0.0.0.0:5557", "\"\""),
              {"coordinator.control_bind", "\"\"", "leave the key out"});
  ExpectError(Edit(kTwoHosts, "tcp://0.0.0.0:5557", "ipc:///tmp/c.sock"),
              {"coordinator.control_bind", "ipc:///tmp/c.sock", "same transport", "tcp://"});
  ExpectError(Edit(kTwoHosts, "control_bind:", "control_bnid:"),
              {"coordinator.control_bnid", "control_bind"});
}

TEST(ConfigTest, WorkerAddressesDefaultToTheHostName) {
  Result<Config> config = ParseConfig(kTwoHosts);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<WorkerAddresses> first = WorkerAddressesOf(*config, 0, 0, "", "");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  // 127.0.0.1 has an entry with only `advertise`: bind stays the host name.
  EXPECT_EQ(first->host, "127.0.0.1");
  EXPECT_EQ(first->bind, "127.0.0.1");
  EXPECT_EQ(first->bind_key, "pools[0].instances[0].hosts[0]");
  EXPECT_EQ(first->advertise, "localhost");
  EXPECT_EQ(first->advertise_key, "host_addresses[\"127.0.0.1\"].advertise");
  EXPECT_TRUE(first->configured);

  Result<WorkerAddresses> rank1 = WorkerAddressesOf(*config, 1, 1, "", "");
  ASSERT_TRUE(rank1.ok());
  EXPECT_EQ(rank1->host, "worker-1");
  EXPECT_EQ(rank1->bind, "0.0.0.0");
  EXPECT_EQ(rank1->bind_key, "host_addresses[\"worker-1\"].bind");
  EXPECT_EQ(rank1->advertise, "10.1.2.3");

  Result<WorkerAddresses> rank2 = WorkerAddressesOf(*config, 1, 2, "", "");
  ASSERT_TRUE(rank2.ok());
  EXPECT_EQ(rank2->bind, "eth-addr.local");
  EXPECT_EQ(rank2->advertise, "worker-2");
  EXPECT_EQ(rank2->advertise_key, "pools[0].instances[1].hosts[2]");

  Result<Config> plain = ParseConfig(kMinimal);
  ASSERT_TRUE(plain.ok());
  Result<WorkerAddresses> none = WorkerAddressesOf(*plain, 0, 0, "", "");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->bind, "127.0.0.1");
  EXPECT_EQ(none->advertise, "127.0.0.1");
  EXPECT_FALSE(none->configured);
}

TEST(ConfigTest, WorkerAddressFlagsOverrideTheConfig) {
  Result<Config> config = ParseConfig(kTwoHosts);
  ASSERT_TRUE(config.ok());
  Result<WorkerAddresses> both = WorkerAddressesOf(*config, 1, 1, "::", "10.9.8.7");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->bind, "::");
  EXPECT_EQ(both->bind_key, "--bind-host");
  EXPECT_EQ(both->advertise, "10.9.8.7");
  EXPECT_EQ(both->advertise_key, "--advertise-host");

  Result<WorkerAddresses> wildcard = WorkerAddressesOf(*config, 1, 1, "", "0.0.0.0");
  ASSERT_FALSE(wildcard.ok());
  EXPECT_NE(wildcard.status().message().find("--advertise-host"), std::string::npos);
  EXPECT_NE(wildcard.status().message().find("not a wildcard"), std::string::npos);
  Result<WorkerAddresses> port = WorkerAddressesOf(*config, 1, 1, "10.0.0.1:80", "");
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.status().message().find("--bind-host"), std::string::npos);
  EXPECT_NE(port.status().message().find("10.0.0.1:80"), std::string::npos);
}

TEST(ConfigTest, HostAddressesErrorsNameTheKey) {
  // Unknown keys, inside an entry and misspelt sections.
  ExpectError(Edit(kTwoHosts, "{bind: eth-addr.local}", "{bind: eth-addr.local, adverise: x}"),
              {"host_addresses[\"worker-2\"].adverise", "advertise"});
  ExpectError(Edit(kTwoHosts, "host_addresses:", "host_address:"),
              {"host_address", "host_addresses"});
  // A host no instance runs on.
  ExpectError(Edit(kTwoHosts, "worker-2: {bind", "worker-3: {bind"),
              {"host_addresses[\"worker-3\"]", "127.0.0.1, worker-1, worker-2"});
  // Values.
  ExpectError(Edit(kTwoHosts, "advertise: 10.1.2.3", "advertise: 0.0.0.0"),
              {"host_addresses[\"worker-1\"].advertise", "0.0.0.0", "not a wildcard"});
  ExpectError(Edit(kTwoHosts, "bind: 0.0.0.0", "bind: \"*\""),
              {"host_addresses[\"worker-1\"].bind", "\"*\"", "0.0.0.0 / ::"});
  ExpectError(Edit(kTwoHosts, "bind: 0.0.0.0", "bind: \"tcp://10.0.0.1:5000\""),
              {"host_addresses[\"worker-1\"].bind", "tcp://10.0.0.1:5000", "no scheme, port"});
  ExpectError(Edit(kTwoHosts, "advertise: 10.1.2.3", "advertise: \"\""),
              {"host_addresses[\"worker-1\"].advertise", "\"\""});
  ExpectError(Edit(kTwoHosts, "{bind: eth-addr.local}", "[eth-addr.local]"),
              {"host_addresses[\"worker-2\"]", "mapping"});
}

}  // namespace
}  // namespace headway
