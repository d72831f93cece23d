// headway-worker: one TP rank of one instance. Loads its weight shard, sizes
// its KV pool, registers with the coordinator and executes step plans.
//
//   headway-worker --config deploy/configs/local.yaml --instance-id 0 --tp-rank 0
//                  [--model-dir DIR] [--threads N] [--control-address ADDR]
//                  [--bind-host H] [--advertise-host H]
//
// The worker dials control_address. Its collective (Gloo) and KV-transfer
// (UCX) endpoints bind --bind-host and are published to peers as
// --advertise-host; without the flags, its host's host_addresses entry,
// else its entry in `hosts` (WorkerAddressesOf in common/config.h). What
// each library can bind and advertise: comm/gloo_communicator.h,
// comm/kv_transfer.h.
//
// Signals: SIGTERM once registered drains: the worker asks the coordinator
// to drain its instance (no new request; the running ones finish, at most
// coordinator.drain_timeout_ms) and exits when released. SIGINT, a second
// SIGTERM, or SIGTERM before registering stop at once.
//
// Exit status: 0 after an orderly Shutdown message or SIGTERM/SIGINT; 2 when
// starting again cannot help (bad flags, config or fault-injection value, a
// malformed --bind-host or --advertise-host, a model file that does not load
// or shard, a missing GPU): the node agent does not restart it; 1 on any
// other failure (a bind or advertise host that does not resolve yet,
// registration refused or unanswered, TP group or KV transfer setup,
// coordinator silent for heartbeat_timeout_ms, a Shutdown for a fault: the
// coordinator took this worker's instance down, e.g. after it was stopped
// past the heartbeat timeout).
//
// Environment (test-only fault injection; never set in a deployment):
//   HEADWAY_FAULT_TRANSFER_STALL_MS=N  every KV transfer target stalls N ms
//                                      after half its blocks (KvSenderOptions).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "comm/communicator.h"
#include "comm/control_channel.h"
#include "comm/control_keys.h"
#include "comm/control_store.h"
#include "common/config.h"
#include "common/deployment_check.h"
#include "common/gguf.h"
#include "common/head_pattern.h"
#include "common/model_spec.h"
#include "common/net_address.h"
#include "common/startup.h"
#include "worker/compute_thread.h"
#include "worker/decoder_model.h"
#include "worker/kv_pool.h"
#include "worker/kv_sender.h"
#include "worker/model_weights.h"
#include "worker/step_executor.h"
#include "worker/worker_loop.h"
#if HEADWAY_HAVE_CUDA
#include "worker/cuda/cuda_decoder_model.h"
#include "worker/cuda/device_kv_pool.h"
#endif

namespace {

// Set by SIGTERM/SIGINT; the only state a signal handler may touch.
std::atomic<bool> g_stop{false};

// Set once the worker serves: from then on SIGTERM drains (g_drain) rather
// than stops, so that a node agent or Kubernetes stopping this worker does
// not fail its requests; a second SIGTERM, or SIGINT, stops at once.
std::atomic<bool> g_serving{false};
std::atomic<bool> g_drain{false};

void OnSignal(int) { g_stop.store(true); }

void OnTerm(int) {
  if (g_serving.load() && !g_drain.exchange(true)) return;
  g_stop.store(true);
}

// Once a stop is requested, the worker has this long to exit cleanly. A rank
// blocked in rendezvous, or in a collective with a stalled peer, would
// otherwise wait out its timeout (tens of seconds) while the launcher waits
// to SIGKILL it.
constexpr std::chrono::seconds kExitGrace(3);

void StartExitWatchdog() {
  std::thread([] {
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(kExitGrace);
    spdlog::warn("still busy {} s after the stop request (a collective or rendezvous is "
                 "blocked); exiting now",
                 kExitGrace.count());
    spdlog::default_logger()->flush();
    std::_Exit(1);
  }).detach();
}

struct Flags {
  std::string config_path;
  int instance_id = 0;
  int tp_rank = 0;
  std::string model_dir;
  int threads = 0;
  std::string control_address;
  std::string bind_host;       // "" = from the config
  std::string advertise_host;  // "" = from the config
};

int Fail(const std::string& what, const headway::Status& status) {
  spdlog::error("{}: {}", what, status.ToString());
  return 1;
}

// A failure that a restart would repeat (see the exit statuses above).
int FailToStart(const std::string& what, const headway::Status& status) {
  spdlog::error("{}: {}", what, status.ToString());
  return 2;
}

// This worker's bind and advertise addresses, resolved to IPs where a
// library needs one, with the keys they came from for errors.
struct ResolvedAddresses {
  headway::WorkerAddresses addresses;
  std::string bind_ip;       // a wildcard stays a wildcard
  std::string advertise_ip;
};

headway::Result<ResolvedAddresses> ResolveAddresses(const headway::WorkerAddresses& addresses) {
  ResolvedAddresses out{addresses, "", ""};
  HW_ASSIGN_OR_RETURN(out.bind_ip, headway::ResolveHost(addresses.bind_key, addresses.bind));
  HW_ASSIGN_OR_RETURN(out.advertise_ip,
                      headway::ResolveHost(addresses.advertise_key, addresses.advertise));
  return out;
}

// The UCX network device for the KV endpoint (KvTransferOptions::
// net_devices): UCX publishes its devices' own addresses, so it is the
// interface holding the advertised address. "" (UCX's choice, as before
// these keys existed) when neither address was configured or
// UCX_NET_DEVICES is set (`env_devices`, which wins). Errors:
// InvalidArgument naming the key when the advertised address is on no
// interface of this host, or a specific bind address is on another one.
headway::Result<std::string> KvNetDevices(const ResolvedAddresses& resolved,
                                          const char* env_devices) {
  const headway::WorkerAddresses& a = resolved.addresses;
  if (!a.configured || (env_devices != nullptr && *env_devices != '\0')) return std::string();
  const std::string device = headway::InterfaceOf(resolved.advertise_ip);
  if (device.empty()) {
    return headway::Status::InvalidArgument(
        "`" + a.advertise_key + "` = \"" + a.advertise + "\" (" + resolved.advertise_ip +
        ") is on no network interface of this host: KV transfer (UCX) publishes the addresses "
        "of its own interfaces, so the advertised address must be one of them");
  }
  if (!headway::IsWildcardHost(resolved.bind_ip) &&
      headway::InterfaceOf(resolved.bind_ip) != device) {
    return headway::Status::InvalidArgument(
        "`" + a.bind_key + "` = \"" + a.bind + "\" (" + resolved.bind_ip +
        ") is not on interface " + device + ", which holds the advertised address " +
        resolved.advertise_ip + ": UCX listens on the interface it advertises; must be 0.0.0.0 "
        "or an address of " + device);
  }
  return device;
}

constexpr const char* kStallEnv = "HEADWAY_FAULT_TRANSFER_STALL_MS";

// The value of kStallEnv (unset or empty = 0): a whole number of
// milliseconds in [0, 3600000].
headway::Result<std::chrono::milliseconds> ParseStallEnv(const char* value) {
  if (value == nullptr || *value == '\0') return std::chrono::milliseconds(0);
  const std::string text = value;
  const bool digits = text.size() <= 7 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  const long ms = digits ? std::stol(text) : -1;
  if (ms < 0 || ms > 3600000) {
    return headway::Status::InvalidArgument(
        std::string(kStallEnv) + "='" + text +
        "' is not a whole number of milliseconds in [0, 3600000]");
  }
  return std::chrono::milliseconds(ms);
}

struct ModelAndPool {
  std::unique_ptr<headway::ForwardModel> model;
  std::unique_ptr<headway::KvPool> pool;
};

// The forward model on the instance's device, from `weights`, and its KV
// pool. Runs the model's kernels (weight uploads, warm-up): call it on the
// compute thread. On an error, *what names what failed ("model", "KV pool",
// ...) for the log line.
headway::Result<ModelAndPool> CreateModelAndPool(const headway::Config& config,
                                                 const headway::InstanceConfig& instance,
                                                 const std::string& config_path, int instance_id,
                                                 int tp_rank, const headway::ModelSpec& spec,
                                                 std::unique_ptr<headway::ModelWeights> weights,
                                                 headway::Communicator* comm, std::string* what) {
  using namespace headway;
  auto failure = [what](const std::string& w, const Status& status) -> Result<ModelAndPool> {
    *what = w;
    return status;
  };
  // The coordinator expects this arena (registration.cc); the head pattern
  // is applied to `spec`.
  Result<KvArenaLayout> arena = KvArenaOf(config, spec);
  if (!arena.ok()) return failure("KV pool", arena.status());
  const int cuda_device = instance.CudaDevice(tp_rank);
  ModelAndPool out;
  if (cuda_device < 0) {
    Result<std::unique_ptr<DecoderModel>> cpu_model =
        DecoderModel::Create(spec, std::move(weights), comm);
    if (!cpu_model.ok()) return failure("model", cpu_model.status());
    out.model = std::move(*cpu_model);
    Result<std::unique_ptr<KvPool>> cpu_pool =
        KvPool::CreateArena(*arena, config.kv_memory_mb * int64_t(1024) * 1024);
    if (!cpu_pool.ok()) return failure("KV pool", cpu_pool.status());
    out.pool = std::move(*cpu_pool);
  } else {
#if HEADWAY_HAVE_CUDA
    cuda::CudaModelOptions cuda_options;
    cuda_options.device = cuda_device;
    cuda_options.max_tokens_per_step = config.max_num_batched_tokens;
    cuda_options.max_seqs_per_step = config.max_num_seqs;
    cuda_options.max_model_len = config.max_model_len;
    cuda_options.block_size = config.block_size;
    Result<std::unique_ptr<cuda::CudaDecoderModel>> gpu_model =
        cuda::CudaDecoderModel::Create(spec, std::move(weights), comm, cuda_options);
    if (!gpu_model.ok()) {
      return failure("model on cuda:" + std::to_string(cuda_device), gpu_model.status());
    }
    spdlog::info("worker i{}r{}: cuda:{}: {} MiB of weights and step buffers", instance_id,
                 tp_rank, cuda_device, (*gpu_model)->device_bytes() >> 20);
    out.model = std::move(*gpu_model);
    // After the model, so the budget counts its memory (vLLM's order too).
    Result<std::unique_ptr<KvPool>> gpu_pool =
        cuda::CreateDeviceKvPool(*arena, cuda_device, config.gpu_memory_utilization);
    if (!gpu_pool.ok()) return failure("KV pool", gpu_pool.status());
    out.pool = std::move(*gpu_pool);
#else
    return failure("config " + config_path,
                   Status::Unimplemented("device " + instance.device +
                                         ": this headway-worker was built without the CUDA "
                                         "toolkit (rebuild where nvcc is found)"));
#endif
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace headway;
  Flags flags;
  CLI::App app{"Headway worker: one TP rank of one instance"};
  app.add_option("--config", flags.config_path, "deployment YAML")->required();
  app.add_option("--instance-id", flags.instance_id, "instance index (Config::Instances order)")
      ->required();
  app.add_option("--tp-rank", flags.tp_rank, "this worker's TP rank")->required();
  app.add_option("--model-dir", flags.model_dir,
                 "directory for relative model paths (default $HEADWAY_MODEL_DIR or "
                 "~/.cache/headway/models)");
  app.add_option("--threads", flags.threads, "compute threads (default from the config)");
  app.add_option("--control-address", flags.control_address,
                 "coordinator control address (overrides the config)");
  app.add_option("--bind-host", flags.bind_host,
                 "where the collective and KV-transfer endpoints listen: an IP, a name, or "
                 "0.0.0.0 (overrides host_addresses[HOST].bind)");
  app.add_option("--advertise-host", flags.advertise_host,
                 "what peers dial to reach those endpoints: an IP or a name, e.g. the pod IP "
                 "(overrides host_addresses[HOST].advertise)");
  app.footer(std::string("Environment (test-only fault injection):\n  ") + kStallEnv +
             "=N  each KV transfer target stalls N ms after half its blocks");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (105, 106, ...) would make the node agent restart it.
    return app.exit(e) == 0 ? 0 : 2;
  }

  Result<std::chrono::milliseconds> inject_stall = ParseStallEnv(std::getenv(kStallEnv));
  if (!inject_stall.ok()) return FailToStart("environment", inject_stall.status());

  std::signal(SIGTERM, OnTerm);
  std::signal(SIGINT, OnSignal);
  // A TP peer that dies turns Gloo's next write into EPIPE (an error the step
  // reports), not a SIGPIPE that would kill this rank too.
  std::signal(SIGPIPE, SIG_IGN);
  StartExitWatchdog();

  Result<Config> config = LoadConfigFile(flags.config_path);
  if (!config.ok()) return FailToStart("config " + flags.config_path, config.status());
  if (flags.model_dir.empty()) {
    flags.model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
  }
  ResolveModelPath(*config, flags.model_dir);
  if (!flags.control_address.empty()) {
    config->control_address = flags.control_address;
    if (Status s = ValidateConfig(*config); !s.ok()) return FailToStart("--control-address", s);
  }
  if (Status s = CheckControlPlaneSecurity(*config); !s.ok()) {
    return FailToStart("config " + flags.config_path, s);
  }
  // Read before the model loads: a missing key file is a config error, not
  // a registration that times out after seconds of loading.
  Result<std::optional<ControlClientKeys>> control_keys = LoadControlClientKeys(config->security);
  if (!control_keys.ok()) return FailToStart("config " + flags.config_path, control_keys.status());

  const std::vector<const InstanceConfig*> instances = config->Instances();
  if (flags.instance_id < 0 || flags.instance_id >= int(instances.size())) {
    return FailToStart("flags", Status::InvalidArgument(
                             "--instance-id " + std::to_string(flags.instance_id) +
                             " out of [0, " + std::to_string(instances.size()) + ")"));
  }
  const InstanceConfig& instance = *instances[flags.instance_id];
  if (flags.tp_rank < 0 || flags.tp_rank >= instance.tp_size) {
    return FailToStart("flags", Status::InvalidArgument(
                             "--tp-rank " + std::to_string(flags.tp_rank) + " out of [0, " +
                             std::to_string(instance.tp_size) + ")"));
  }
  Result<WorkerAddresses> addresses = WorkerAddressesOf(
      *config, flags.instance_id, flags.tp_rank, flags.bind_host, flags.advertise_host);
  if (!addresses.ok()) return FailToStart("flags", addresses.status());
  // Names resolve only where a library needs an IP: Gloo ranks and the UCX
  // KV endpoint.
  const bool gloo = instance.tp_size > 1 && instance.CollectiveBackend() == "gloo";
  ResolvedAddresses resolved{*addresses, addresses->bind, addresses->advertise};
  if (gloo || config->KvTransferEnabled()) {
    Result<ResolvedAddresses> r = ResolveAddresses(*addresses);
    if (!r.ok()) return Fail("config " + flags.config_path, r.status());
    resolved = *r;
  }
  int threads = flags.threads > 0 ? flags.threads : instance.num_threads;
  if (threads <= 0) {
    threads = std::max(1, int(std::thread::hardware_concurrency()) / instance.tp_size);
  }
  // Every kernel of this worker, loading included, runs on this one thread:
  // one pool of compute threads (worker/compute_thread.h says why).
  ComputeThread compute(threads);
#if HEADWAY_HAVE_CUDA
  // A missing GPU is reported before seconds of model loading, not after.
  if (const int device = instance.CudaDevice(flags.tp_rank); device >= 0) {
    Result<cuda::DeviceInfo> gpu = cuda::SetDevice(device);
    if (!gpu.ok()) return FailToStart("config " + flags.config_path, gpu.status());
    spdlog::info("worker i{}r{}: cuda:{} is {} ({} SMs, {} MiB free of {} MiB)", flags.instance_id,
                 flags.tp_rank, device, gpu->name, gpu->num_sms, gpu->free_bytes >> 20,
                 gpu->total_bytes >> 20);
  }
#endif

  spdlog::info("worker i{}r{}: loading {} ({} threads)", flags.instance_id, flags.tp_rank,
               config->model_path, threads);
  // The coordinator applies the same head pattern (coordinator/main.cc). The
  // deployment-wide checks are the launcher's and the coordinator's.
  StartupCheckOptions check_options;
  check_options.check_deployment = false;
  StartupCheck failed_check = StartupCheck::kSupported;
  Result<StartupModel> model_file = OpenAndCheckModel(*config, check_options, &failed_check);
  if (!model_file.ok()) {
    return FailToStart(failed_check == StartupCheck::kHeadPattern ? "config " + flags.config_path
                                                                  : std::string("model"),
                       model_file.status());
  }
  ModelSpec* const spec = &model_file->spec;
  spdlog::info("worker i{}r{}: attention: {}", flags.instance_id, flags.tp_rank,
               DescribeSlotSpecs(*spec));
  if (Status s = ValidateTpSize(*spec, instance.tp_size); !s.ok()) return FailToStart("model", s);
  const TpShard shard = ShardForRank(*spec, instance.tp_size, flags.tp_rank);
  Result<std::unique_ptr<ModelWeights>> weights =
      compute.Call([&] { return ModelWeights::Load(*model_file->file, *spec, shard); });
  if (!weights.ok()) return FailToStart("model", weights.status());
  model_file->file.reset();  // weights are dequantised copies; drop the mapping

  ControlChannelOptions control_options;
  control_options.max_message_bytes = int64_t(config->control_max_message_mb) << 20;
  Result<std::unique_ptr<ControlClient>> client = ControlClient::Connect(
      config->control_address, PeerName(flags.instance_id, flags.tp_rank), *control_keys,
      control_options);
  if (!client.ok()) return Fail("control channel", client.status());

  // The TP group meets through the coordinator's store before registering,
  // so the coordinator never plans a step for a rank without collectives.
  std::unique_ptr<Communicator> comm;
  if (instance.tp_size > 1) {
    ControlStore store(client->get());
    CommunicatorOptions comm_options;
    comm_options.backend = instance.CollectiveBackend();
    comm_options.rank = flags.tp_rank;
    comm_options.size = instance.tp_size;
    comm_options.timeout = std::chrono::milliseconds(instance.collective_timeout_ms);
    comm_options.bind_host = resolved.bind_ip;
    comm_options.advertise_host = resolved.advertise_ip;
    comm_options.device = std::max(0, instance.CudaDevice(flags.tp_rank));
    spdlog::info("worker i{}r{}: joining TP group of {} ({}{})", flags.instance_id, flags.tp_rank,
                 instance.tp_size, comm_options.backend,
                 gloo ? ": listening on and advertising " + resolved.advertise_ip + ", bind host " +
                            addresses->bind
                      : std::string());
    Result<std::unique_ptr<Communicator>> created = CreateCommunicator(comm_options, store);
    if (!created.ok()) {
      return Fail("TP group (" + addresses->bind_key + " = " + addresses->bind + ", " +
                      addresses->advertise_key + " = " + addresses->advertise + ")",
                  created.status());
    }
    comm = std::move(*created);
  }
  std::string failed;
  Result<ModelAndPool> created = compute.Call([&] {
    return CreateModelAndPool(*config, instance, flags.config_path, flags.instance_id,
                              flags.tp_rank, *spec, std::move(*weights), comm.get(), &failed);
  });
  if (!created.ok()) return Fail(failed, created.status());
  std::unique_ptr<ForwardModel>& model = created->model;
  std::unique_ptr<KvPool>& pool = created->pool;
  const KvArenaLayout& arena = pool->arena();
  if (!arena.mixed()) {
    spdlog::info("worker i{}r{}: {} KV blocks of {} bytes, {} ({})", flags.instance_id,
                 flags.tp_rank, pool->num_blocks(), pool->layout().BlockBytes(),
                 KvCacheDtypeName(pool->layout().dtype), instance.device);
  } else {
    spdlog::info("worker i{}r{}: KV arena of {} chunks of {} bytes: {} {} blocks of {} bytes "
                 "(full slots) or {} {} blocks of {} bytes (sliding slots) ({})",
                 flags.instance_id, flags.tp_rank, pool->num_chunks(), arena.chunk_bytes,
                 pool->num_blocks(arena.dtypes.full), KvCacheDtypeName(arena.dtypes.full),
                 arena.BlockLayout(arena.dtypes.full).BlockBytes(),
                 pool->num_blocks(arena.dtypes.sliding), KvCacheDtypeName(arena.dtypes.sliding),
                 arena.BlockLayout(arena.dtypes.sliding).BlockBytes(), instance.device);
  }

  std::unique_ptr<KvSender> kv_sender;
  if (config->KvTransferEnabled()) {
    KvSenderOptions sender_options;
    sender_options.transports = config->kv_transfer_transports;
    Result<std::string> devices = KvNetDevices(resolved, std::getenv("UCX_NET_DEVICES"));
    if (!devices.ok()) return Fail("config " + flags.config_path, devices.status());
    sender_options.net_devices = *devices;
    if (!devices->empty()) {
      spdlog::info("worker i{}r{}: KV endpoint on network device {} (advertise {})",
                   flags.instance_id, flags.tp_rank, *devices, resolved.advertise_ip);
    }
    // 512 KiB TCP segments carry a 256 KiB block message whole (UCX's 8 KiB
    // split it into 32): 1.6x the KV bandwidth between hosts with MTU 9000,
    // 1.15x with 1500 (bench/README.md). UCX_TCP_{TX,RX}_SEG_SIZE, when set,
    // win.
    if (std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr &&
        std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) {
      sender_options.tcp_seg_size = "512k";
    }
    sender_options.inject_stall = *inject_stall;
    if (sender_options.inject_stall.count() > 0) {
      spdlog::warn("worker i{}r{}: {}={}: KV transfers will stall (fault injection)",
                   flags.instance_id, flags.tp_rank, kStallEnv,
                   sender_options.inject_stall.count());
    }
    Result<std::unique_ptr<KvSender>> created =
        KvSender::Create(pool.get(), shard, sender_options);
    if (!created.ok()) return Fail("KV transfer", created.status());
    kv_sender = std::move(*created);
  }

  StepExecutorOptions exec_options;
  exec_options.tp_rank = flags.tp_rank;
  exec_options.max_tokens_per_step = config->max_num_batched_tokens;
  StepExecutor executor(model.get(), pool.get(), exec_options);

  proto::RegisterRequest request;
  request.set_instance_id(uint32_t(flags.instance_id));
  request.set_tp_rank(uint32_t(flags.tp_rank));
  request.set_tp_size(uint32_t(instance.tp_size));
  request.set_model_name(spec->name);
  request.set_num_layers(uint32_t(spec->num_layers));
  request.set_num_local_kv_heads(uint32_t(shard.num_local_kv_heads()));
  request.set_head_dim(uint32_t(spec->head_dim));
  request.set_block_size(uint32_t(arena.block_size));
  request.set_block_bytes(uint64_t(pool->layout().BlockBytes()));
  request.set_kv_cache_dtype(KvCacheDtypeName(config->kv_cache_dtypes().full));
  request.set_kv_cache_dtype_sliding(KvCacheDtypeName(config->kv_cache_dtypes().sliding));
  request.set_num_blocks(uint32_t(pool->num_blocks()));
  request.set_chunk_bytes(uint64_t(arena.chunk_bytes));
  request.set_num_chunks(uint32_t(pool->num_chunks()));
  request.set_vocab_size(uint32_t(spec->vocab_size));
  request.set_pid(uint32_t(getpid()));
  if (kv_sender) {
    *request.mutable_kv_endpoint() = kv_sender->endpoint();
    request.set_kv_write_key(kv_sender->write_key());
  }

  WorkerLoopOptions loop_options;
  loop_options.heartbeat_interval_ms = config->heartbeat_interval_ms;
  loop_options.heartbeat_timeout_ms = config->heartbeat_timeout_ms;
  loop_options.stop = &g_stop;
  loop_options.drain = &g_drain;
  loop_options.drain_timeout_ms = config->drain_timeout_ms;
  loop_options.on_shutdown = [] { g_stop.store(true); };
  loop_options.kv_sender = kv_sender.get();
  if (Status s = Register(**client, request, loop_options); !s.ok()) {
    if (g_stop.load()) {
      spdlog::info("worker i{}r{}: stopped by signal before registering", flags.instance_id,
                   flags.tp_rank);
      return 0;
    }
    return Fail("registration with " + config->control_address, s);
  }
  spdlog::info("worker i{}r{}: registered with {}", flags.instance_id, flags.tp_rank,
               config->control_address);
  g_serving.store(true);
  if (Status s = ServeSteps(**client, executor, compute, loop_options); !s.ok()) {
    return Fail("worker i" + std::to_string(flags.instance_id) + "r" +
                    std::to_string(flags.tp_rank) + " exiting",
                s);
  }
  spdlog::info("worker i{}r{}: stopped", flags.instance_id, flags.tp_rank);
  return 0;
}
