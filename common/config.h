// Deployment configuration: one YAML file, validated on load.
//
// Example (deploy/configs/local.yaml):
//   model:
//     path: SmolLM2-135M-Instruct.Q4_1.gguf   # relative: resolved against the model dir
//     served_name: smollm2-135m-instruct
//     head_pattern: heads.yaml     # optional: streaming KV heads (common/head_pattern.h)
//   coordinator:
//     http_host: 127.0.0.1
//     http_port: 8000
//     control_address: tcp://127.0.0.1:5557   # what workers dial
//     control_bind: tcp://0.0.0.0:5557        # optional: what the coordinator binds
//     heartbeat_interval_ms: 1000
//     heartbeat_timeout_ms: 10000
//     control_max_message_mb: 64   # larger control messages drop their peer
//     drain_timeout_ms: 25000      # a draining instance's requests get this long
//     api_key: [key-a]             # and the HTTP keys of common/http_config.h
//   chat:
//     parse_special_in_content: false   # true: special tokens from message text too (vLLM)
//   cache:
//     block_size: 16
//     kv_memory_mb: 256            # per CPU worker
//     gpu_memory_utilization: 0.9  # per CUDA worker: share of the GPU's memory
//     enable_prefix_caching: true
//     enable_recycling: true
//     recycling_granularity: kv_head   # or layer
//     kv_cache_dtype: float16      # or float32, q8_0, q4_0, q4_0_hadamard (common/kv_layout.h)
//     kv_cache_dtype_sliding: q8_0 # optional: sliding-window slots' dtype (common/kv_arena.h);
//                                  # default kv_cache_dtype
//   scheduler:
//     max_num_seqs: 32
//     max_num_batched_tokens: 512
//     max_model_len: 2048
//   kv_transfer:                   # optional: KV block transfer between instances
//     transports: tcp              # UCX_TLS syntax; "" = UCX's choice
//     timeout_ms: 5000
//   pools:
//     - name: main
//       role: mixed
//       instances:
//         - tp_size: 1
//           device: cpu
//           hosts: [127.0.0.1]
//           num_threads: 2
//           collective: gloo         # TP all-reduce backend: gloo | shm | nccl
//           collective_timeout_ms: 30000
//   host_addresses:                # optional, per host named in `hosts`
//     127.0.0.1:
//       bind: 0.0.0.0              # where its workers' Gloo and UCX endpoints listen
//       advertise: 127.0.0.1       # what their peers dial (an IP or a resolvable name)
//   launch:                        # optional: remote hosts over ssh (common/launch_config.h)
//     user: headway
//   security:                      # optional: control-plane keys (common/security_config.h)
//     coordinator_key: coordinator.key_secret
//
// Network endpoints (README "Network endpoints" lists each with its default
// and who dials it): the coordinator's HTTP API binds http_host:http_port;
// its ZeroMQ ROUTER binds control_bind (default: control_address) and
// workers dial control_address. A worker's collective (Gloo) and KV-transfer
// (UCX) endpoints bind host_addresses[h].bind and are published to peers as
// host_addresses[h].advertise, where h is the worker's entry in `hosts`;
// both default to h itself. headway-worker and headway-node's --bind-host
// and --advertise-host override them at run time (a Kubernetes pod learns
// its IP from the environment).
//
// Every error names the key (dotted path, e.g. `pools[0].instances[0].tp_size`),
// the value found and what is allowed.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http_config.h"
#include "common/kv_arena.h"
#include "common/kv_layout.h"
#include "common/launch_config.h"
#include "common/security_config.h"
#include "common/status.h"

namespace headway {

enum class PoolRole { kMixed, kPrefill, kDecode };
const char* PoolRoleName(PoolRole role);

struct InstanceConfig {
  int tp_size = 1;
  // "cpu", or "cuda:N": the instance's ranks on one host take GPUs N, N+1,
  // ... in rank order (CudaDevice).
  std::string device = "cpu";
  std::vector<std::string> hosts = {"127.0.0.1"};  // one per rank, or one for all
  int num_threads = 0;                  // compute threads per worker; 0 = all cores / tp_size
  // TP collectives (comm/communicator.h): "gloo" (TCP), "shm" (shared
  // memory, every rank on one host) or "nccl" (CUDA ranks); "" = "nccl" on
  // cuda, else "shm" when every rank is on one host, else "gloo". Same-host
  // CPU ranks default to shm because a Gloo all-reduce over loopback costs
  // milliseconds and a decode step needs 2 per layer
  // (headway-allreduce-bench).
  std::string collective;
  // A collective slower than this fails the step; the coordinator also
  // takes the instance down when a rank's step result is this late after
  // its first peer's (InstanceRegistry::FindStragglers).
  int collective_timeout_ms = 30000;

  // The backend in effect: `collective`, or the device's default.
  std::string CollectiveBackend() const;
  // The CUDA device ordinal of rank `tp_rank`: N of "cuda:N" plus the number
  // of lower ranks on the same host; -1 for "cpu".
  // REQUIRES: 0 <= tp_rank < tp_size, hosts has 1 or tp_size entries.
  int CudaDevice(int tp_rank) const;
};

struct PoolConfig {
  std::string name = "main";
  PoolRole role = PoolRole::kMixed;
  // Every instance the pool may have (its slots; the index in the pool is
  // a LeaderWorkerSet's group index). Written as a list, or as
  // `{count: N, template: {...}}` or `{min: A, max: B, template: {...}}`.
  std::vector<InstanceConfig> instances;
  // How many of `instances` start with the deployment (`min`); the others
  // are standby slots that join when a node agent runs them (headway-node
  // --pool P --group-index G) and leave when it is stopped (a drain).
  // nullopt = all of them (a list, or `count`).
  std::optional<int> min_instances;

  int NumInitial() const { return min_instances.value_or(int(instances.size())); }
  // True for a slot that does not start with the deployment.
  bool IsStandby(int index_in_pool) const { return index_in_pool >= NumInitial(); }
};

// Where the workers of one host (an entry of InstanceConfig::hosts) open
// their collective and KV-transfer endpoints. Each is an IP address or a
// host name; "" = the host name itself.
struct HostAddresses {
  std::string bind;       // the listening address; 0.0.0.0 or :: = every interface
  std::string advertise;  // what peers dial; never a wildcard
};

// The values of routing.policy (coordinator/engine/router.h gives each its
// RoutingPolicy; a test there keeps the two lists equal).
inline constexpr std::array<std::string_view, 3> kRoutingPolicyNames = {
    "prefix_aware", "least_loaded", "round_robin"};

struct Config {
  // model
  std::string model_path;               // absolute after ResolvePaths
  std::string served_model_name;        // "" = file name without .gguf
  // Head-pattern file (common/head_pattern.h) making some KV heads streaming;
  // "" = the model's own attention specs. A relative path is taken against
  // the config file's directory by LoadConfigFile (ParseConfig keeps it as
  // written, i.e. relative to the working directory), so a config and its
  // pattern move together. Every host of a deployment must have it at the
  // same path.
  std::string head_pattern_path;
  // coordinator
  std::string http_host = "127.0.0.1";
  int http_port = 8000;
  // What workers dial to reach the coordinator's ROUTER (tcp://HOST:PORT,
  // HOST an IP or a name the workers resolve, or ipc://PATH).
  std::string control_address = "tcp://127.0.0.1:5557";
  // What the coordinator's ROUTER binds (ZeroMQ syntax: tcp://0.0.0.0:5557,
  // tcp://*:5557, tcp://eth0:5557, ipc://PATH); "" = control_address. The
  // two differ where the coordinator sits behind a name or an address it
  // does not own (a Kubernetes Service, NAT).
  std::string control_bind;
  // control_bind, or control_address when it is empty.
  const std::string& ControlBindAddress() const {
    return control_bind.empty() ? control_address : control_bind;
  }
  int heartbeat_interval_ms = 1000;
  int heartbeat_timeout_ms = 10000;     // a worker silent this long is down
  // The largest control message (ZMQ_MAXMSGSIZE on the coordinator's ROUTER
  // and every worker's DEALER), MiB: a peer that sends more is disconnected
  // before the message is buffered. The default is far above the largest
  // real step plan or result (README "Control plane").
  int control_max_message_mb = 64;
  // A draining instance (admin endpoint, or SIGTERM to its worker) takes no
  // new request and leaves once its requests have ended; those still there
  // after this long move to another instance or fail, as if it went down.
  // Kubernetes' default terminationGracePeriodSeconds is 30 s.
  int drain_timeout_ms = 25000;
  // API keys, TLS and the HTTP limits (common/http_config.h).
  HttpApiConfig http;
  // chat
  // false: special tokens only where the chat template writes them; a
  // message's "<|im_start|>" stays text. true: from the whole prompt,
  // message contents included (vLLM's behaviour).
  bool chat_parse_special_in_content = false;
  // cache
  int block_size = 16;                  // positions per block
  int64_t kv_memory_mb = 256;           // KV pool per CPU worker, MiB
  // How K and V values are stored (vLLM's --kv-cache-dtype; the byte layouts
  // are common/kv_layout.h's). Every rank of the deployment uses it. 16 bits
  // by default, as llama.cpp's f16 cache: it halves float32's memory and KV
  // transfer bytes at under 0.01 % of perplexity (docs/kv-cache-dtypes.md).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFloat16;
  // How sliding-window slots (SlotSpec::IsSliding) store K and V; nullopt =
  // kv_cache_dtype. Lets slots that keep only their window and sink take
  // another dtype than full ones. When it differs from kv_cache_dtype and
  // the model has sliding slots, a rank's blocks come in two sizes and its
  // pool is an arena of chunks (common/kv_arena.h); CheckConfigAgainstModel
  // (common/deployment_check.h) says what such a deployment may not do yet.
  std::optional<KvCacheDtype> kv_cache_dtype_sliding;
  // The dtype of each kind of slot: full = kv_cache_dtype, sliding =
  // kv_cache_dtype_sliding or kv_cache_dtype.
  KvCacheDtypes kv_cache_dtypes() const {
    return {kv_cache_dtype, kv_cache_dtype_sliding.value_or(kv_cache_dtype)};
  }
  // CUDA workers (device cuda:N): the fraction of the GPU's memory this
  // worker may use in all (vLLM's gpu_memory_utilization): the KV pool gets
  // what is left of it after the weights and the step buffers.
  double gpu_memory_utilization = 0.9;
  bool enable_prefix_caching = true;    // reuse full blocks of shared prompt prefixes
  bool enable_recycling = true;         // sliding-window blocks leave the table once out of every window
  // "kv_head": each (layer, KV head) recycles by its own spec. "layer": a
  // layer recycles only when all its KV heads share one sliding spec, as
  // engines with per-layer block tables do (a comparison baseline).
  std::string recycling_granularity = "kv_head";
  // kv_transfer: UCX block transfer between instances (comm/kv_transfer.h).
  // Workers map their pool and publish a KV endpoint at registration when
  // enabled (the section is present, or a pool has role prefill/decode).
  bool kv_transfer_enabled = false;
  std::string kv_transfer_transports;   // UCX_TLS syntax, e.g. "tcp" or "sm,self"; "" = UCX default
  int kv_transfer_timeout_ms = 5000;    // one TransferPlan; slower fails
  // The resolved switch: kv_transfer_enabled, or any prefill/decode pool.
  bool KvTransferEnabled() const;
  // scheduler
  int max_num_seqs = 32;                // running sequences per instance
  int max_num_batched_tokens = 512;     // tokens per step per instance
  int max_model_len = 2048;             // prompt + generated tokens
  // Admission (coordinator/scheduling/scheduler.h): "guaranteed_no_evict"
  // starts a request only when the pool holds every running request's
  // footprint at its max_tokens plus its own; "max_utilization" when its
  // first chunk fits, preempting by recompute as requests grow.
  std::string admission_policy = "guaranteed_no_evict";
  // routing (coordinator/engine/router.h): which instance of a pool takes a
  // new request. "prefix_aware" weighs each instance's exact prefix-cache
  // hit on the prompt against its load; "least_loaded" takes the instance
  // with the fewest sequences; "round_robin" takes them in turn.
  std::string routing_policy = "prefix_aware";
  // prefix_aware's balance between hit and load: the cost of one token of
  // the request's own prefill, in tokens of an instance's load (queued
  // prompt tokens and KV its running sequences hold; router.h). Larger
  // keeps a prefix on its instance under more imbalance; 0 routes by load
  // alone.
  double routing_prefix_weight = 8.0;
  // prefix_aware's load-balance guard (SGLang's cache-aware router,
  // balance_abs_threshold / balance_rel_threshold): while the busiest
  // accepting instance of a pool has more than routing_balance_abs_threshold
  // sequences (running + waiting) over the least busy one and more than
  // routing_balance_rel_threshold times as many, requests go to the least
  // busy one whatever their hits. -1, the default: no guard.
  int routing_balance_abs_threshold = -1;
  double routing_balance_rel_threshold = 1.5;
  // Conditional disaggregation (coordinator/engine/disaggregation.h): a
  // request of a prefill/decode deployment is prefilled on its decode
  // instance, with no transfer, when the part of its prompt that instance
  // lacks is at most routing_max_local_prefill_tokens, or when the chosen
  // prefill instance already has more than routing_max_prefill_queue_tokens
  // prompt tokens queued (0: no limit). The default 0 sends every prompt
  // with a whole block to move to a prefill instance.
  int routing_max_local_prefill_tokens = 0;
  int64_t routing_max_prefill_queue_tokens = 0;
  // pools
  std::vector<PoolConfig> pools;
  // host_addresses: per host name used in some instance's `hosts`. A host
  // without an entry binds and advertises its own name.
  std::map<std::string, HostAddresses> host_addresses;
  // launch: how headway-launch reaches remote hosts (common/launch_config.h).
  LaunchConfig launch;
  // security: the control plane's CurveZMQ keys (common/security_config.h);
  // CheckControlPlaneSecurity refuses a reachable control port without them.
  SecurityConfig security;

  // Instances in a fixed order (pool order, then instance order); the index
  // here is the instance id used on the wire.
  std::vector<const InstanceConfig*> Instances() const;
  // Role of the pool holding instance `instance_id` (Instances() order).
  // REQUIRES: 0 <= instance_id < Instances().size().
  PoolRole RoleOf(int instance_id) const;
  // True when instance `instance_id` is a standby slot of its pool
  // (PoolConfig::IsStandby). REQUIRES: as RoleOf.
  bool IsStandby(int instance_id) const;
};

// The addresses one worker's collective and KV-transfer endpoints use, and
// the key each came from (for errors: "--bind-host",
// "host_addresses[\"h\"].bind", "pools[0].instances[1].hosts[2]").
struct WorkerAddresses {
  std::string host;            // the worker's entry in `hosts`
  std::string bind;            // IP, name or wildcard; never empty
  std::string bind_key;
  std::string advertise;       // IP or name; never empty, never a wildcard
  std::string advertise_key;
  // True when bind or advertise was configured (host_addresses or a flag)
  // rather than taken from the host name.
  bool configured = false;
};

// The bind and advertise addresses of rank `tp_rank` of instance
// `instance_id` (Config::Instances order): the overrides when non-empty
// (headway-worker's --bind-host, --advertise-host), else the host's
// host_addresses entry, else the host name. Does not resolve names
// (ResolveHost in common/net_address.h does, where a library needs an IP).
// Errors: InvalidArgument naming the flag when an override is malformed or
// an advertised address is a wildcard.
// REQUIRES: ValidateConfig(config).ok(); the ids are in range.
Result<WorkerAddresses> WorkerAddressesOf(const Config& config, int instance_id, int tp_rank,
                                          const std::string& bind_override,
                                          const std::string& advertise_override);

// Parses YAML text. Unknown keys are errors (a typo must not pass silently).
// Errors: InvalidArgument naming key, value and what is allowed.
Result<Config> ParseConfig(const std::string& yaml_text);

// Reads and parses a file. NotFound if it cannot be read; parse errors are
// prefixed with the path. A relative model.head_pattern, and relative
// security.* key files, become absolute, taken against the directory of
// `path`.
Result<Config> LoadConfigFile(const std::string& path);

// Checks ranges and cross-field rules of an already built Config (ParseConfig
// calls it; call it again after applying command-line overrides).
// Errors: InvalidArgument naming the dotted key, the value and what is allowed.
// Does not check the model (ValidateTpSize in common/model_spec.h does).
Status ValidateConfig(const Config& config);

// Makes model_path absolute: a relative path is taken against `model_dir`.
// `model_dir` comes from main (flag or HEADWAY_MODEL_DIR).
void ResolveModelPath(Config& config, const std::string& model_dir);

}  // namespace headway
