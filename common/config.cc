#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <string_view>

#include "common/net_address.h"
#include "common/yaml_fields.h"

namespace headway {
namespace {

using yaml::BadValue;
using yaml::CheckRange;
using yaml::CheckRealRange;
using yaml::CheckKeys;
using yaml::Describe;
using yaml::ReadBool;
using yaml::ReadDouble;
using yaml::ReadInt;
using yaml::ReadInt64;
using yaml::ReadString;
using yaml::RequireMap;

// Instances of one pool, slots included (`count` or `max`).
constexpr int kMaxInstancesPerPool = 256;

// Upper bounds, checked before any arithmetic: sums of two timeouts stay in
// an int, kv_memory_mb << 20 in an int64_t, and a typo of a few extra digits
// is refused rather than overflowing into a negative size or deadline.
constexpr int64_t kMaxTimeoutMs = 24 * 3600 * 1000;  // a day
constexpr int64_t kMaxKvMemoryMb = int64_t(1) << 24;  // 16 TiB per worker
constexpr int64_t kMaxTpSize = 1024;
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxNumSeqs = 1 << 16;
constexpr int64_t kMaxTokens = 1 << 24;  // max_model_len, max_num_batched_tokens

Status CheckAtLeast(const std::string& key, int64_t value, int64_t min);

// Parsing happens in two passes: this file's readers turn YAML into a Config
// and report type errors (a list where a number belongs, "abc" for an int);
// ValidateConfig then checks ranges and cross-field rules, so values that come
// from command-line flags get the same checks and the same messages.

std::string Child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string Index(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

Result<PoolRole> ParseRole(const YAML::Node& node, const std::string& key) {
  std::string text;
  HW_RETURN_IF_ERROR(ReadString(node, key, text));
  if (text == "mixed") return PoolRole::kMixed;
  if (text == "prefill") return PoolRole::kPrefill;
  if (text == "decode") return PoolRole::kDecode;
  return BadValue(key, "\"" + text + "\"", "one of mixed, prefill, decode");
}

Status ParseModel(const YAML::Node& node, Config& config) {
  const std::string path = "model";
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(CheckKeys(node, path, {"path", "served_name", "head_pattern"}));
  if (!node["path"]) {
    return Status::InvalidArgument("missing key `model.path`: must be the GGUF file (absolute, "
                                   "or relative to the model directory)");
  }
  HW_RETURN_IF_ERROR(ReadString(node["path"], "model.path", config.model_path));
  if (node["served_name"]) {
    HW_RETURN_IF_ERROR(
        ReadString(node["served_name"], "model.served_name", config.served_model_name));
  }
  if (node["head_pattern"]) {
    HW_RETURN_IF_ERROR(
        ReadString(node["head_pattern"], "model.head_pattern", config.head_pattern_path));
    // An empty value would silently mean "no pattern": the key is there, so
    // the writer meant a file.
    if (config.head_pattern_path.empty()) {
      return BadValue("model.head_pattern", "\"\"",
                      "a head-pattern YAML file (absolute, or relative to the config file's "
                      "directory); leave the key out for the model's own attention specs");
    }
  }
  return Status::Ok();
}

Status ParseCoordinator(const YAML::Node& node, Config& config) {
  const std::string path = "coordinator";
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(CheckKeys(node, path,
                               {"http_host", "http_port", "control_address", "control_bind",
                                "heartbeat_interval_ms", "heartbeat_timeout_ms",
                                "drain_timeout_ms", "control_max_message_mb", "api_key", "api_key_file",
                                "metrics_require_api_key", "ssl_certfile", "ssl_keyfile",
                                "http_max_body_bytes", "http_max_header_bytes",
                                "http_max_json_depth", "http_max_connections",
                                "http_read_timeout_ms", "http_keep_alive_timeout_ms"}));
  HW_RETURN_IF_ERROR(ParseHttpApiKeys(node, config.http));
  if (node["http_host"]) {
    HW_RETURN_IF_ERROR(ReadString(node["http_host"], "coordinator.http_host", config.http_host));
  }
  if (node["http_port"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["http_port"], "coordinator.http_port", config.http_port));
  }
  if (node["control_address"]) {
    HW_RETURN_IF_ERROR(ReadString(node["control_address"], "coordinator.control_address",
                                  config.control_address));
  }
  if (node["control_bind"]) {
    HW_RETURN_IF_ERROR(
        ReadString(node["control_bind"], "coordinator.control_bind", config.control_bind));
    // An empty value would silently mean "bind control_address": the key is
    // there, so the writer meant an address.
    if (config.control_bind.empty()) {
      return BadValue("coordinator.control_bind", "\"\"",
                      "a ZeroMQ bind address such as tcp://0.0.0.0:5557; leave the key out to "
                      "bind coordinator.control_address");
    }
  }
  if (node["heartbeat_interval_ms"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["heartbeat_interval_ms"],
                               "coordinator.heartbeat_interval_ms",
                               config.heartbeat_interval_ms));
  }
  if (node["heartbeat_timeout_ms"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["heartbeat_timeout_ms"], "coordinator.heartbeat_timeout_ms",
                               config.heartbeat_timeout_ms));
  }
  if (node["control_max_message_mb"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["control_max_message_mb"],
                               "coordinator.control_max_message_mb",
                               config.control_max_message_mb));
  }
  if (node["drain_timeout_ms"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["drain_timeout_ms"], "coordinator.drain_timeout_ms",
                               config.drain_timeout_ms));
  }
  return Status::Ok();
}

// A KV cache dtype by its name (KvCacheDtypeName); BadValue naming `key`,
// the value and the names allowed otherwise.
Status ReadKvCacheDtype(const YAML::Node& node, const std::string& key,
                        std::optional<KvCacheDtype>& out) {
  std::string name;
  HW_RETURN_IF_ERROR(ReadString(node, key, name));
  out = ParseKvCacheDtype(name);
  if (!out) return BadValue(key, "\"" + name + "\"", std::string("one of ") + KvCacheDtypeNames());
  return Status::Ok();
}

Status ParseCache(const YAML::Node& node, Config& config) {
  const std::string path = "cache";
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(
      CheckKeys(node, path, {"block_size", "kv_memory_mb", "enable_prefix_caching",
                             "enable_recycling", "recycling_granularity",
                             "gpu_memory_utilization", "kv_cache_dtype",
                             "kv_cache_dtype_sliding"}));
  if (node["block_size"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["block_size"], "cache.block_size", config.block_size));
  }
  if (node["kv_memory_mb"]) {
    HW_RETURN_IF_ERROR(ReadInt64(node["kv_memory_mb"], "cache.kv_memory_mb", config.kv_memory_mb));
  }
  if (node["gpu_memory_utilization"]) {
    HW_RETURN_IF_ERROR(ReadDouble(node["gpu_memory_utilization"], "cache.gpu_memory_utilization",
                                  config.gpu_memory_utilization));
  }
  if (node["enable_prefix_caching"]) {
    HW_RETURN_IF_ERROR(ReadBool(node["enable_prefix_caching"], "cache.enable_prefix_caching",
                                config.enable_prefix_caching));
  }
  if (node["enable_recycling"]) {
    HW_RETURN_IF_ERROR(ReadBool(node["enable_recycling"], "cache.enable_recycling",
                                config.enable_recycling));
  }
  if (node["kv_cache_dtype"]) {
    std::optional<KvCacheDtype> dtype;
    HW_RETURN_IF_ERROR(ReadKvCacheDtype(node["kv_cache_dtype"], "cache.kv_cache_dtype", dtype));
    config.kv_cache_dtype = *dtype;
  }
  if (node["kv_cache_dtype_sliding"]) {
    HW_RETURN_IF_ERROR(ReadKvCacheDtype(node["kv_cache_dtype_sliding"],
                                        "cache.kv_cache_dtype_sliding",
                                        config.kv_cache_dtype_sliding));
  }
  if (node["recycling_granularity"]) {
    const std::string key = "cache.recycling_granularity";
    HW_RETURN_IF_ERROR(ReadString(node["recycling_granularity"], key,
                                  config.recycling_granularity));
    if (config.recycling_granularity != "kv_head" && config.recycling_granularity != "layer") {
      return BadValue(key, "\"" + config.recycling_granularity + "\"", "one of kv_head, layer");
    }
  }
  return Status::Ok();
}

Status ParseChat(const YAML::Node& node, Config& config) {
  HW_RETURN_IF_ERROR(RequireMap(node, "chat"));
  HW_RETURN_IF_ERROR(CheckKeys(node, "chat", {"parse_special_in_content"}));
  if (node["parse_special_in_content"]) {
    HW_RETURN_IF_ERROR(ReadBool(node["parse_special_in_content"], "chat.parse_special_in_content",
                                config.chat_parse_special_in_content));
  }
  return Status::Ok();
}

Status ParseKvTransfer(const YAML::Node& node, Config& config) {
  const std::string path = "kv_transfer";
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(CheckKeys(node, path, {"enabled", "transports", "timeout_ms"}));
  config.kv_transfer_enabled = true;  // the section asks for it unless it says otherwise
  if (node["enabled"]) {
    HW_RETURN_IF_ERROR(
        ReadBool(node["enabled"], "kv_transfer.enabled", config.kv_transfer_enabled));
  }
  if (node["transports"]) {
    HW_RETURN_IF_ERROR(ReadString(node["transports"], "kv_transfer.transports",
                                  config.kv_transfer_transports));
  }
  if (node["timeout_ms"]) {
    HW_RETURN_IF_ERROR(
        ReadInt(node["timeout_ms"], "kv_transfer.timeout_ms", config.kv_transfer_timeout_ms));
  }
  return Status::Ok();
}

Status ParseRouting(const YAML::Node& node, Config& config) {
  const std::string path = "routing";
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(CheckKeys(
      node, path,
      {"policy", "prefix_weight", "balance_abs_threshold", "balance_rel_threshold",
       "max_local_prefill_tokens", "max_prefill_queue_tokens"}));
  if (node["policy"]) {
    HW_RETURN_IF_ERROR(ReadString(node["policy"], "routing.policy", config.routing_policy));
  }
  if (node["prefix_weight"]) {
    HW_RETURN_IF_ERROR(
        ReadDouble(node["prefix_weight"], "routing.prefix_weight", config.routing_prefix_weight));
  }
  if (node["balance_abs_threshold"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["balance_abs_threshold"], "routing.balance_abs_threshold",
                               config.routing_balance_abs_threshold));
  }
  if (node["balance_rel_threshold"]) {
    HW_RETURN_IF_ERROR(ReadDouble(node["balance_rel_threshold"], "routing.balance_rel_threshold",
                                  config.routing_balance_rel_threshold));
  }
  if (node["max_local_prefill_tokens"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["max_local_prefill_tokens"], "routing.max_local_prefill_tokens",
                               config.routing_max_local_prefill_tokens));
  }
  if (node["max_prefill_queue_tokens"]) {
    HW_RETURN_IF_ERROR(ReadInt64(node["max_prefill_queue_tokens"],
                                 "routing.max_prefill_queue_tokens",
                                 config.routing_max_prefill_queue_tokens));
  }
  return Status::Ok();
}

Status ParseScheduler(const YAML::Node& node, Config& config) {
  const std::string path = "scheduler";
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(
      CheckKeys(node, path,
                {"max_num_seqs", "max_num_batched_tokens", "max_model_len", "admission_policy"}));
  if (node["max_num_seqs"]) {
    HW_RETURN_IF_ERROR(
        ReadInt(node["max_num_seqs"], "scheduler.max_num_seqs", config.max_num_seqs));
  }
  if (node["max_num_batched_tokens"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["max_num_batched_tokens"], "scheduler.max_num_batched_tokens",
                               config.max_num_batched_tokens));
  }
  if (node["max_model_len"]) {
    HW_RETURN_IF_ERROR(
        ReadInt(node["max_model_len"], "scheduler.max_model_len", config.max_model_len));
  }
  if (node["admission_policy"]) {
    const std::string key = "scheduler.admission_policy";
    HW_RETURN_IF_ERROR(ReadString(node["admission_policy"], key, config.admission_policy));
    if (config.admission_policy != "guaranteed_no_evict" &&
        config.admission_policy != "max_utilization") {
      return BadValue(key, "\"" + config.admission_policy + "\"",
                      "one of guaranteed_no_evict, max_utilization");
    }
  }
  return Status::Ok();
}

Status ParseInstance(const YAML::Node& node, const std::string& path, InstanceConfig& instance) {
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(CheckKeys(node, path, {"tp_size", "device", "hosts", "num_threads",
                                             "collective", "collective_timeout_ms"}));
  if (node["tp_size"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["tp_size"], Child(path, "tp_size"), instance.tp_size));
  }
  if (node["device"]) {
    HW_RETURN_IF_ERROR(ReadString(node["device"], Child(path, "device"), instance.device));
  }
  if (node["num_threads"]) {
    HW_RETURN_IF_ERROR(
        ReadInt(node["num_threads"], Child(path, "num_threads"), instance.num_threads));
  }
  if (node["collective"]) {
    HW_RETURN_IF_ERROR(
        ReadString(node["collective"], Child(path, "collective"), instance.collective));
  }
  if (node["collective_timeout_ms"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["collective_timeout_ms"], Child(path, "collective_timeout_ms"),
                               instance.collective_timeout_ms));
  }
  if (node["hosts"]) {
    const YAML::Node hosts = node["hosts"];
    const std::string key = Child(path, "hosts");
    if (!hosts.IsSequence()) {
      return BadValue(key, Describe(hosts), "a list of host names, e.g. [127.0.0.1]");
    }
    instance.hosts.clear();
    for (size_t i = 0; i < hosts.size(); ++i) {
      std::string host;
      HW_RETURN_IF_ERROR(ReadString(hosts[i], Index(key, i), host));
      instance.hosts.push_back(host);
    }
  }
  return Status::Ok();
}

// The dotted key of host `host`'s entry: host_addresses["h"] (quoted: host
// names and IPs hold dots).
std::string HostAddressesKey(const std::string& host) {
  return "host_addresses[\"" + host + "\"]";
}

Status ParseHostAddresses(const YAML::Node& node, Config& config) {
  HW_RETURN_IF_ERROR(RequireMap(node, "host_addresses"));
  for (const auto& entry : node) {
    std::string host;
    HW_RETURN_IF_ERROR(ReadString(entry.first, "host_addresses", host));
    const std::string path = HostAddressesKey(host);
    HW_RETURN_IF_ERROR(RequireMap(entry.second, path));
    HW_RETURN_IF_ERROR(CheckKeys(entry.second, path, {"bind", "advertise"}));
    HostAddresses addresses;
    if (entry.second["bind"]) {
      HW_RETURN_IF_ERROR(ReadString(entry.second["bind"], path + ".bind", addresses.bind));
      HW_RETURN_IF_ERROR(CheckHostSyntax(path + ".bind", addresses.bind, true));
    }
    if (entry.second["advertise"]) {
      HW_RETURN_IF_ERROR(
          ReadString(entry.second["advertise"], path + ".advertise", addresses.advertise));
      HW_RETURN_IF_ERROR(CheckHostSyntax(path + ".advertise", addresses.advertise, false));
    }
    config.host_addresses[host] = addresses;
  }
  return Status::Ok();
}

// `instances: {count: N, template: {...}}` (N instances) or `{min: A, max:
// B, template: {...}}` (B slots, the first A started with the deployment).
Status ParseInstanceRange(const YAML::Node& node, const std::string& path, PoolConfig& pool) {
  HW_RETURN_IF_ERROR(CheckKeys(node, path, {"count", "min", "max", "template"}));
  const bool counted = bool(node["count"]);
  if (counted == (node["min"] || node["max"])) {
    return Status::InvalidArgument("`" + path + "`: give either `count` or `min` and `max`");
  }
  if (!node["template"]) {
    return Status::InvalidArgument("missing key `" + Child(path, "template") +
                                   "`: must be an instance ({tp_size: ..., hosts: [...]})");
  }
  InstanceConfig shape;
  HW_RETURN_IF_ERROR(ParseInstance(node["template"], Child(path, "template"), shape));
  int num_slots = 0;
  if (counted) {
    HW_RETURN_IF_ERROR(ReadInt(node["count"], Child(path, "count"), num_slots));
    HW_RETURN_IF_ERROR(CheckAtLeast(Child(path, "count"), num_slots, 1));
  } else {
    if (!node["min"] || !node["max"]) {
      return Status::InvalidArgument("`" + path + "`: `min` and `max` come together");
    }
    int min = 0;
    HW_RETURN_IF_ERROR(ReadInt(node["min"], Child(path, "min"), min));
    HW_RETURN_IF_ERROR(ReadInt(node["max"], Child(path, "max"), num_slots));
    HW_RETURN_IF_ERROR(CheckAtLeast(Child(path, "min"), min, 0));
    HW_RETURN_IF_ERROR(CheckAtLeast(Child(path, "max"), num_slots, std::max(min, 1)));
    pool.min_instances = min;
  }
  // Slots are instance ids on the wire and series in /metrics: a bound keeps
  // a typo from allocating millions.
  if (num_slots > kMaxInstancesPerPool) {
    return BadValue(Child(path, counted ? "count" : "max"), std::to_string(num_slots),
                    "at most " + std::to_string(kMaxInstancesPerPool));
  }
  pool.instances.assign(size_t(num_slots), shape);
  return Status::Ok();
}

Status ParsePool(const YAML::Node& node, const std::string& path, PoolConfig& pool) {
  HW_RETURN_IF_ERROR(RequireMap(node, path));
  HW_RETURN_IF_ERROR(CheckKeys(node, path, {"name", "role", "instances"}));
  if (node["name"]) HW_RETURN_IF_ERROR(ReadString(node["name"], Child(path, "name"), pool.name));
  if (node["role"]) {
    HW_ASSIGN_OR_RETURN(pool.role, ParseRole(node["role"], Child(path, "role")));
  }
  const std::string key = Child(path, "instances");
  const YAML::Node instances = node["instances"];
  if (!instances) {
    return Status::InvalidArgument("missing key `" + key +
                                   "`: must be a list of at least one instance");
  }
  if (instances.IsMap()) return ParseInstanceRange(instances, key, pool);
  if (!instances.IsSequence()) {
    return BadValue(key, Describe(instances),
                    "a list of at least one instance, or {count: N, template: {...}} or "
                    "{min: A, max: B, template: {...}}");
  }
  for (size_t i = 0; i < instances.size(); ++i) {
    InstanceConfig instance;
    HW_RETURN_IF_ERROR(ParseInstance(instances[i], Index(key, i), instance));
    pool.instances.push_back(std::move(instance));
  }
  return Status::Ok();
}

Status ParseDocument(const YAML::Node& root, Config& config) {
  HW_RETURN_IF_ERROR(RequireMap(root, ""));
  HW_RETURN_IF_ERROR(
      CheckKeys(root, "", {"model", "coordinator", "cache", "scheduler", "routing", "kv_transfer",
                           "pools", "host_addresses", "launch", "chat", "security"}));
  if (!root["model"]) {
    return Status::InvalidArgument("missing key `model.path`: must be the GGUF file (absolute, "
                                   "or relative to the model directory)");
  }
  HW_RETURN_IF_ERROR(ParseModel(root["model"], config));
  if (root["coordinator"]) HW_RETURN_IF_ERROR(ParseCoordinator(root["coordinator"], config));
  if (root["cache"]) HW_RETURN_IF_ERROR(ParseCache(root["cache"], config));
  if (root["chat"]) HW_RETURN_IF_ERROR(ParseChat(root["chat"], config));
  if (root["scheduler"]) HW_RETURN_IF_ERROR(ParseScheduler(root["scheduler"], config));
  if (root["routing"]) HW_RETURN_IF_ERROR(ParseRouting(root["routing"], config));
  if (root["kv_transfer"]) HW_RETURN_IF_ERROR(ParseKvTransfer(root["kv_transfer"], config));
  if (root["host_addresses"]) {
    HW_RETURN_IF_ERROR(ParseHostAddresses(root["host_addresses"], config));
  }
  if (root["launch"]) HW_RETURN_IF_ERROR(ParseLaunchSection(root["launch"], &config.launch));
  if (root["security"]) {
    HW_RETURN_IF_ERROR(ParseSecuritySection(root["security"], &config.security));
  }
  const YAML::Node pools = root["pools"];
  if (pools) {
    if (!pools.IsSequence()) return BadValue("pools", Describe(pools), "a list of pools");
    for (size_t i = 0; i < pools.size(); ++i) {
      PoolConfig pool;
      HW_RETURN_IF_ERROR(ParsePool(pools[i], Index("pools", i), pool));
      config.pools.push_back(std::move(pool));
    }
  }
  return Status::Ok();
}

// ---- range checks ----------------------------------------------------------

Status CheckAtLeast(const std::string& key, int64_t value, int64_t min) {
  if (value >= min) return Status::Ok();
  return BadValue(key, std::to_string(value), "an integer >= " + std::to_string(min));
}

// "cpu" or "cuda:N" with N a non-negative integer.
bool IsValidDevice(const std::string& device) {
  if (device == "cpu") return true;
  constexpr std::string_view kCuda = "cuda:";
  if (device.size() <= kCuda.size() || device.compare(0, kCuda.size(), kCuda) != 0) return false;
  for (size_t i = kCuda.size(); i < device.size(); ++i) {
    if (device[i] < '0' || device[i] > '9') return false;
  }
  return device.size() - kCuda.size() <= 4;
}

Status ValidateInstance(const InstanceConfig& instance, const std::string& path) {
  HW_RETURN_IF_ERROR(CheckRange(Child(path, "tp_size"), instance.tp_size, 1, kMaxTpSize));
  if (!IsValidDevice(instance.device)) {
    return BadValue(Child(path, "device"), "\"" + instance.device + "\"",
                    "\"cpu\" or \"cuda:N\" (N = GPU index)");
  }
  HW_RETURN_IF_ERROR(
      CheckRange(Child(path, "num_threads"), instance.num_threads, 0, kMaxThreads, "(0 = all)"));
  const std::string& c = instance.collective;
  if (!c.empty() && c != "gloo" && c != "shm" && c != "nccl") {
    return BadValue(Child(path, "collective"), "\"" + c + "\"", "\"gloo\", \"shm\" or \"nccl\"");
  }
  const bool cuda = instance.device != "cpu";
  if (c == "nccl" && !cuda) {
    return BadValue(Child(path, "collective"), "\"nccl\"",
                    "\"gloo\" or \"shm\" for device \"cpu\" (NCCL needs CUDA devices)");
  }
  if (c == "shm" && instance.hosts.size() > 1) {
    for (const std::string& host : instance.hosts) {
      if (host != instance.hosts[0]) {
        return BadValue(Child(path, "collective"), "\"shm\"",
                        "\"gloo\" when the ranks are on different hosts (shm needs one host)");
      }
    }
  }
  HW_RETURN_IF_ERROR(CheckRange(Child(path, "collective_timeout_ms"),
                                instance.collective_timeout_ms, 1, kMaxTimeoutMs, "(ms)"));
  const size_t num_hosts = instance.hosts.size();
  if (num_hosts != 1 && num_hosts != static_cast<size_t>(instance.tp_size)) {
    return BadValue(Child(path, "hosts"), "a list of " + std::to_string(num_hosts) + " hosts",
                    "1 host (all ranks) or tp_size = " + std::to_string(instance.tp_size) +
                        " hosts (one per TP rank)");
  }
  for (size_t i = 0; i < num_hosts; ++i) {
    if (instance.hosts[i].empty()) {
      return BadValue(Index(Child(path, "hosts"), i), "\"\"", "a host name or IP address");
    }
  }
  return Status::Ok();
}

}  // namespace

PoolRole Config::RoleOf(int instance_id) const {
  for (const PoolConfig& pool : pools) {
    if (instance_id < int(pool.instances.size())) return pool.role;
    instance_id -= int(pool.instances.size());
  }
  HW_CHECK(false);
  return PoolRole::kMixed;
}

bool Config::KvTransferEnabled() const {
  if (kv_transfer_enabled) return true;
  for (const PoolConfig& pool : pools) {
    if (pool.role != PoolRole::kMixed) return true;
  }
  return false;
}

int InstanceConfig::CudaDevice(int tp_rank) const {
  constexpr std::string_view kCuda = "cuda:";
  if (device.compare(0, kCuda.size(), kCuda) != 0) return -1;
  int ordinal = std::atoi(device.c_str() + kCuda.size());
  if (hosts.size() == 1) return ordinal + tp_rank;
  for (int r = 0; r < tp_rank; ++r) ordinal += hosts[r] == hosts[tp_rank] ? 1 : 0;
  return ordinal;
}

std::string InstanceConfig::CollectiveBackend() const {
  if (!collective.empty()) return collective;
  if (device != "cpu") return "nccl";
  for (const std::string& host : hosts) {
    if (host != hosts[0]) return "gloo";
  }
  return "shm";
}

const char* PoolRoleName(PoolRole role) {
  switch (role) {
    case PoolRole::kMixed: return "mixed";
    case PoolRole::kPrefill: return "prefill";
    case PoolRole::kDecode: return "decode";
  }
  return "unknown";
}

bool Config::IsStandby(int instance_id) const {
  int first = 0;
  for (const PoolConfig& pool : pools) {
    if (instance_id < first + int(pool.instances.size())) return pool.IsStandby(instance_id - first);
    first += int(pool.instances.size());
  }
  return false;
}

std::vector<const InstanceConfig*> Config::Instances() const {
  std::vector<const InstanceConfig*> out;
  for (const PoolConfig& pool : pools) {
    for (const InstanceConfig& instance : pool.instances) out.push_back(&instance);
  }
  return out;
}

Status ValidateConfig(const Config& config) {
  if (config.model_path.empty()) {
    return BadValue("model.path", "\"\"", "the GGUF file (absolute, or relative to the model "
                                          "directory)");
  }
  if (config.http_host.empty()) {
    return BadValue("coordinator.http_host", "\"\"", "a host name or IP address to listen on");
  }
  if (config.http_port < 0 || config.http_port > 65535) {
    return BadValue("coordinator.http_port", std::to_string(config.http_port),
                    "an integer in [0, 65535]");
  }
  const std::string& address = config.control_address;
  if (address.rfind("tcp://", 0) != 0 && address.rfind("ipc://", 0) != 0) {
    return BadValue("coordinator.control_address", "\"" + address + "\"",
                    "a ZeroMQ address such as tcp://127.0.0.1:5557 or ipc:///tmp/headway.sock");
  }
  if (!config.control_bind.empty()) {
    const std::string& bind = config.control_bind;
    const std::string scheme = address.substr(0, address.find("://") + 3);
    if (bind.rfind(scheme, 0) != 0) {
      return BadValue("coordinator.control_bind", "\"" + bind + "\"",
                      "a ZeroMQ address of the same transport as coordinator.control_address (" +
                          scheme + "...), e.g. tcp://0.0.0.0:5557");
    }
  }
  HW_RETURN_IF_ERROR(CheckRange("coordinator.heartbeat_interval_ms",
                                config.heartbeat_interval_ms, 1, kMaxTimeoutMs, "(ms)"));
  HW_RETURN_IF_ERROR(CheckRange("coordinator.heartbeat_timeout_ms", config.heartbeat_timeout_ms,
                                1, kMaxTimeoutMs, "(ms)"));
  if (config.heartbeat_timeout_ms <= config.heartbeat_interval_ms) {
    return BadValue("coordinator.heartbeat_timeout_ms", std::to_string(config.heartbeat_timeout_ms),
                    "greater than coordinator.heartbeat_interval_ms = " +
                        std::to_string(config.heartbeat_interval_ms));
  }
  HW_RETURN_IF_ERROR(CheckRange("coordinator.control_max_message_mb",
                                config.control_max_message_mb, 1, 4096, "(MiB)"));
  HW_RETURN_IF_ERROR(CheckRange("coordinator.drain_timeout_ms", config.drain_timeout_ms, 1,
                                kMaxTimeoutMs, "(ms)"));
  HW_RETURN_IF_ERROR(ValidateHttpApiConfig(config.http));
  const int block_size = config.block_size;
  if (block_size < 1 || block_size > 256 || (block_size & (block_size - 1)) != 0) {
    return BadValue("cache.block_size", std::to_string(block_size),
                    "a power of two in [1, 256]");
  }
  HW_RETURN_IF_ERROR(
      CheckRange("cache.kv_memory_mb", config.kv_memory_mb, 1, kMaxKvMemoryMb, "(MiB)"));
  if (!(config.gpu_memory_utilization > 0.0 && config.gpu_memory_utilization <= 1.0)) {
    return BadValue("cache.gpu_memory_utilization", std::to_string(config.gpu_memory_utilization),
                    "a fraction in (0, 1] of the GPU's memory");
  }
  HW_RETURN_IF_ERROR(CheckRange("kv_transfer.timeout_ms", config.kv_transfer_timeout_ms, 1,
                                kMaxTimeoutMs, "(ms)"));
  HW_RETURN_IF_ERROR(
      CheckRange("scheduler.max_num_seqs", config.max_num_seqs, 1, kMaxNumSeqs));
  HW_RETURN_IF_ERROR(CheckRange("scheduler.max_num_batched_tokens",
                                config.max_num_batched_tokens, 1, kMaxTokens, "(tokens)"));
  HW_RETURN_IF_ERROR(
      CheckRange("scheduler.max_model_len", config.max_model_len, 1, kMaxTokens, "(tokens)"));
  if (std::find(kRoutingPolicyNames.begin(), kRoutingPolicyNames.end(),
                config.routing_policy) == kRoutingPolicyNames.end()) {
    std::string allowed;
    for (std::string_view name : kRoutingPolicyNames) {
      allowed += (allowed.empty() ? "one of " : ", ") + std::string(name);
    }
    return BadValue("routing.policy", "\"" + config.routing_policy + "\"", allowed);
  }
  HW_RETURN_IF_ERROR(CheckRealRange("routing.prefix_weight", config.routing_prefix_weight, 0.0,
                                    1e6, "[0, 1e6]"));
  HW_RETURN_IF_ERROR(CheckRange("routing.balance_abs_threshold",
                                config.routing_balance_abs_threshold, -1, 1000000,
                                "(sequences; -1 = no guard)"));
  HW_RETURN_IF_ERROR(CheckRealRange("routing.balance_rel_threshold",
                                    config.routing_balance_rel_threshold, 1.0, 1e6, "[1, 1e6]"));
  HW_RETURN_IF_ERROR(CheckRange("routing.max_local_prefill_tokens",
                                config.routing_max_local_prefill_tokens, 0, kMaxTokens, "(tokens)"));
  HW_RETURN_IF_ERROR(CheckRange("routing.max_prefill_queue_tokens",
                                config.routing_max_prefill_queue_tokens, int64_t(0),
                                int64_t(1) << 40, "(tokens; 0 = no limit)"));

  if (config.pools.empty()) {
    return Status::InvalidArgument(
        "missing key `pools`: must be a list of at least one pool with at least one instance");
  }
  std::set<std::string> names;
  bool have_prefill = false;
  bool have_decode = false;
  for (size_t p = 0; p < config.pools.size(); ++p) {
    const PoolConfig& pool = config.pools[p];
    const std::string path = Index("pools", p);
    if (pool.name.empty() || !names.insert(pool.name).second) {
      return BadValue(Child(path, "name"), "\"" + pool.name + "\"",
                      "a non-empty name used by no other pool");
    }
    have_prefill = have_prefill || pool.role == PoolRole::kPrefill;
    have_decode = have_decode || pool.role == PoolRole::kDecode;
    if (pool.instances.empty()) {
      return BadValue(Child(path, "instances"), "an empty list", "a list of at least one instance");
    }
    for (size_t i = 0; i < pool.instances.size(); ++i) {
      const std::string instance_path = Index(Child(path, "instances"), i);
      HW_RETURN_IF_ERROR(ValidateInstance(pool.instances[i], instance_path));
    }
  }
  // An entry for a host no instance uses is a typo of one that does.
  for (const auto& [host, addresses] : config.host_addresses) {
    bool used = false;
    std::string used_hosts;
    std::set<std::string> seen;
    for (const InstanceConfig* instance : config.Instances()) {
      for (const std::string& h : instance->hosts) {
        used = used || h == host;
        if (seen.insert(h).second) used_hosts += (used_hosts.empty() ? "" : ", ") + h;
      }
    }
    if (!used) {
      return BadValue(HostAddressesKey(host), "an entry for host \"" + host + "\"",
                      "entries only for hosts named in pools[*].instances[*].hosts (" +
                          used_hosts + ")");
    }
  }
  // Prefilled sequences need somewhere to decode, and decode instances only
  // receive sequences from prefill instances.
  if (have_prefill != have_decode) {
    return Status::InvalidArgument(
        std::string("`pools` has a ") + (have_prefill ? "prefill" : "decode") +
        " pool but no " + (have_prefill ? "decode" : "prefill") +
        " pool: disaggregation needs both roles (or use role: mixed)");
  }
  return Status::Ok();
}

Result<WorkerAddresses> WorkerAddressesOf(const Config& config, int instance_id, int tp_rank,
                                          const std::string& bind_override,
                                          const std::string& advertise_override) {
  int pool_index = 0;
  int index_in_pool = instance_id;
  while (index_in_pool >= int(config.pools[size_t(pool_index)].instances.size())) {
    index_in_pool -= int(config.pools[size_t(pool_index)].instances.size());
    ++pool_index;
  }
  const InstanceConfig& instance =
      config.pools[size_t(pool_index)].instances[size_t(index_in_pool)];
  const size_t host_index = instance.hosts.size() == 1 ? 0 : size_t(tp_rank);
  WorkerAddresses out;
  out.host = instance.hosts[host_index];
  const std::string instance_key =
      Index(Child(Index("pools", size_t(pool_index)), "instances"), size_t(index_in_pool));
  const std::string host_key = Index(Child(instance_key, "hosts"), host_index);
  out.bind = out.advertise = out.host;
  out.bind_key = out.advertise_key = host_key;
  if (auto it = config.host_addresses.find(out.host); it != config.host_addresses.end()) {
    if (!it->second.bind.empty()) {
      out.bind = it->second.bind;
      out.bind_key = HostAddressesKey(out.host) + ".bind";
      out.configured = true;
    }
    if (!it->second.advertise.empty()) {
      out.advertise = it->second.advertise;
      out.advertise_key = HostAddressesKey(out.host) + ".advertise";
      out.configured = true;
    }
  }
  if (!bind_override.empty()) {
    HW_RETURN_IF_ERROR(CheckHostSyntax("--bind-host", bind_override, true));
    out.bind = bind_override;
    out.bind_key = "--bind-host";
    out.configured = true;
  }
  if (!advertise_override.empty()) {
    HW_RETURN_IF_ERROR(CheckHostSyntax("--advertise-host", advertise_override, false));
    out.advertise = advertise_override;
    out.advertise_key = "--advertise-host";
    out.configured = true;
  }
  // Peers cannot dial a wildcard: a host listed as 0.0.0.0 (bound as such)
  // needs an address to advertise.
  if (IsWildcardHost(out.advertise)) {
    return BadValue(out.advertise_key, "\"" + out.advertise + "\"",
                    "an address peers can dial; set host_addresses[\"" + out.host +
                        "\"].advertise or --advertise-host");
  }
  return out;
}

Result<Config> ParseConfig(const std::string& yaml_text) {
  Config config;
  HW_ASSIGN_OR_RETURN(const YAML::Node root, yaml::LoadDocument(yaml_text));
  try {
    HW_RETURN_IF_ERROR(ParseDocument(root, config));
  } catch (const YAML::Exception& e) {
    return yaml::SyntaxError(e);
  }
  HW_RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

Result<Config> LoadConfigFile(const std::string& path) {
  HW_ASSIGN_OR_RETURN(std::string text, yaml::ReadDocumentText(path, "config file"));
  Result<Config> config = ParseConfig(text);
  if (!config.ok()) return config.status().WithContext(path);
  // Files named by the config move with it: relative paths are taken
  // against its directory.
  SecurityConfig& security = config->security;
  for (std::string* file : {&config->head_pattern_path, &security.coordinator_key,
                            &security.coordinator_public_key, &security.client_key,
                            &security.authorized_keys}) {
    if (file->empty()) continue;
    namespace fs = std::filesystem;
    fs::path resolved(*file);
    if (resolved.is_relative()) {
      std::error_code ec;
      fs::path base = fs::absolute(fs::path(path), ec).parent_path();
      if (!ec) resolved = base / resolved;
    }
    *file = resolved.lexically_normal().string();
  }
  {
    std::error_code ec;
    const std::filesystem::path base = std::filesystem::absolute(path, ec).parent_path();
    if (!ec) ResolveHttpApiPaths(config->http, base.string());
  }
  return config;
}

void ResolveModelPath(Config& config, const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path path(config.model_path);
  if (path.is_relative() && !model_dir.empty()) path = fs::path(model_dir) / path;
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  if (!ec) path = absolute;
  config.model_path = path.lexically_normal().string();
}

}  // namespace headway
