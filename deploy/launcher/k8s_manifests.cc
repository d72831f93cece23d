#include "deploy/launcher/k8s_manifests.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <sstream>

namespace headway::launcher {
namespace {

constexpr int kMaxDnsLabel = 63;
constexpr int kRankOverheadMb = 512;  // a worker's step buffers, code, UCX and ZeroMQ

bool IsDnsLabel(const std::string& s) {
  if (s.empty() || int(s.size()) > kMaxDnsLabel) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

Status CheckDnsLabel(const std::string& key, const std::string& value) {
  if (IsDnsLabel(value)) return Status::Ok();
  return Status::InvalidArgument(key + " = \"" + value +
                                 "\" is not a DNS label: lower-case letters, digits and '-', "
                                 "starting and ending with a letter or digit, at most 63 "
                                 "characters (Kubernetes names objects and pods with it)");
}

// A DNS subdomain name (RFC 1123), as Kubernetes wants for a Secret's name.
bool IsDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return std::isalnum(static_cast<unsigned char>(s.front())) &&
         std::isalnum(static_cast<unsigned char>(s.back()));
}

std::string PoolKey(size_t pool) { return "pools[" + std::to_string(pool) + "]"; }

// Every instance of a pool runs from one pod template, so they must agree
// on everything the template depends on.
Status CheckOneShape(const PoolConfig& pool, size_t pool_index) {
  const InstanceConfig& first = pool.instances[0];
  for (size_t j = 1; j < pool.instances.size(); ++j) {
    const InstanceConfig& other = pool.instances[j];
    const bool same = other.tp_size == first.tp_size && other.device == first.device &&
                      other.hosts.size() == first.hosts.size() &&
                      other.num_threads == first.num_threads &&
                      other.collective == first.collective &&
                      other.collective_timeout_ms == first.collective_timeout_ms;
    if (!same) {
      return Status::InvalidArgument(
          PoolKey(pool_index) + ".instances[" + std::to_string(j) + "] differs from " +
          PoolKey(pool_index) + ".instances[0] in tp_size, device, the number of hosts, "
          "num_threads, collective or collective_timeout_ms: Kubernetes runs a pool from one "
          "pod template; put instances of another shape in a pool of their own");
    }
  }
  if (first.device.rfind("cuda:", 0) == 0 && first.device != "cuda:0") {
    return Status::InvalidArgument(PoolKey(pool_index) + ".instances[0].device = \"" +
                                   first.device +
                                   "\": a pod's GPUs are numbered from 0; use cuda:0");
  }
  return Status::Ok();
}

bool InDisaggregatedSet(const PoolConfig& pool) { return pool.role != PoolRole::kMixed; }

YAML::Node Labels(const K8sOptions& options, const std::string& component) {
  YAML::Node labels;
  labels["app.kubernetes.io/name"] = "headway";
  labels["app.kubernetes.io/instance"] = options.name;
  labels["app.kubernetes.io/component"] = component;
  return labels;
}

YAML::Node Metadata(const K8sOptions& options, const std::string& name,
                    const std::string& component) {
  YAML::Node metadata;
  metadata["name"] = name;
  metadata["namespace"] = options.namespace_name;
  metadata["labels"] = Labels(options, component);
  return metadata;
}

YAML::Node Mount(const std::string& name, const std::string& path, bool read_only) {
  YAML::Node mount;
  mount["name"] = name;
  mount["mountPath"] = path;
  if (read_only) mount["readOnly"] = true;
  return mount;
}

std::string ConfigMapName(const K8sOptions& options) { return options.name + "-config"; }
std::string KeySecretName(const K8sOptions& options) {
  return options.key_secret.empty() ? options.name + "-keys" : options.key_secret;
}

// Which control-plane key files a pod mounts: each process reads only its own.
enum class PodKeys { kNone, kCoordinator, kWorker };

YAML::Node KeyItem(const char* key) {
  YAML::Node item;
  item["key"] = key;
  item["path"] = key;
  return item;
}
std::string ControlServiceName(const K8sOptions& options) { return options.name + "-control"; }

// The config and model volumes every pod mounts; workers add /dev/shm, and
// with keys each pod the Secret's files it needs.
YAML::Node Volumes(const K8sOptions& options, bool with_shm, PodKeys keys) {
  YAML::Node volumes;
  YAML::Node config;
  config["name"] = "config";
  config["configMap"]["name"] = ConfigMapName(options);
  volumes.push_back(config);
  YAML::Node models;
  models["name"] = "models";
  models["persistentVolumeClaim"]["claimName"] = options.model_claim;
  models["persistentVolumeClaim"]["readOnly"] = true;
  volumes.push_back(models);
  if (with_shm) {
    // A container's /dev/shm is 64 MiB unless mounted: the shm all-reduce
    // and UCX's shared-memory transports map theirs there.
    YAML::Node shm;
    shm["name"] = "dshm";
    shm["emptyDir"]["medium"] = "Memory";
    volumes.push_back(shm);
  }
  if (keys != PodKeys::kNone) {
    YAML::Node secret;
    secret["name"] = "keys";
    secret["secret"]["secretName"] = KeySecretName(options);
    // 0440: never readable by others (a worker's preflight checks the same
    // of a bare host's files); the group lets a pod's fsGroup read them.
    secret["secret"]["defaultMode"] = 0440;
    if (keys == PodKeys::kCoordinator) {
      secret["secret"]["items"].push_back(KeyItem(kK8sSecretCoordinatorKey));
      secret["secret"]["items"].push_back(KeyItem(kK8sSecretAuthorizedKeys));
    } else {
      secret["secret"]["items"].push_back(KeyItem(kK8sSecretCoordinatorPublicKey));
      secret["secret"]["items"].push_back(KeyItem(kK8sSecretClientKey));
    }
    volumes.push_back(secret);
  }
  return volumes;
}

YAML::Node VolumeMounts(bool with_shm, PodKeys keys) {
  YAML::Node mounts;
  mounts.push_back(Mount("config", kK8sConfigDir, true));
  mounts.push_back(Mount("models", kK8sModelDir, true));
  if (with_shm) mounts.push_back(Mount("dshm", "/dev/shm", false));
  if (keys != PodKeys::kNone) mounts.push_back(Mount("keys", kK8sKeyDir, true));
  return mounts;
}

PodKeys KeysOf(const Config& config, PodKeys role) {
  return config.security.HasKeys() ? role : PodKeys::kNone;
}

std::string Emit(const YAML::Node& node) {
  YAML::Emitter out;
  out << node;
  return std::string(out.c_str()) + "\n";
}

// Secret N-keys: the key files' text (stringData: the API server encodes it).
std::string KeySecret(const K8sOptions& options) {
  YAML::Node s;
  s["apiVersion"] = "v1";
  s["kind"] = "Secret";
  s["metadata"] = Metadata(options, KeySecretName(options), "keys");
  s["type"] = "Opaque";
  s["stringData"][kK8sSecretCoordinatorKey] = options.key_files.coordinator_key;
  s["stringData"][kK8sSecretCoordinatorPublicKey] = options.key_files.coordinator_public_key;
  s["stringData"][kK8sSecretClientKey] = options.key_files.client_key;
  s["stringData"][kK8sSecretAuthorizedKeys] = options.key_files.authorized_keys;
  return Emit(s);
}

// The config the pods read (see the header): the input's keys, with the
// coordinator's addresses and every instance's hosts rewritten.
Result<std::string> PodConfig(const std::string& config_yaml, const Config& config,
                              bool has_head_pattern, const K8sOptions& options,
                              int control_port) {
  // Workers dial the Service; the coordinator binds its pod's interfaces.
  HW_ASSIGN_OR_RETURN(YAML::Node root,
                      ConfigServingEverywhere(config_yaml,
                                              "tcp://" + ControlServiceName(options) + "." +
                                                  options.namespace_name + ".svc:" +
                                                  std::to_string(control_port),
                                              control_port));
  if (has_head_pattern) root["model"]["head_pattern"] = kK8sHeadPatternFile;
  if (config.security.HasKeys()) {
    const std::string dir = std::string(kK8sKeyDir) + "/";
    root["security"]["coordinator_key"] = dir + kK8sSecretCoordinatorKey;
    root["security"]["coordinator_public_key"] = dir + kK8sSecretCoordinatorPublicKey;
    root["security"]["client_key"] = dir + kK8sSecretClientKey;
    root["security"]["authorized_keys"] = dir + kK8sSecretAuthorizedKeys;
  }
  for (size_t i = 0; i < config.pools.size(); ++i) {
    const PoolConfig& pool = config.pools[i];
    const std::string lws = options.name + "-" + pool.name;
    YAML::Node instances = root["pools"][i]["instances"];
    if (instances.IsMap()) {
      // {count: N, template: {...}}: each instance gets its own pods' host
      // names, so the rendered config lists them.
      if (!instances["count"]) {
        return Status::InvalidArgument(
            PoolKey(i) + ".instances: a pool of `min`/`max` standby slots is not rendered "
            "for Kubernetes yet; give `count` or list the instances");
      }
      YAML::Node list(YAML::NodeType::Sequence);
      for (size_t j = 0; j < pool.instances.size(); ++j) {
        list.push_back(YAML::Clone(instances["template"]));
      }
      root["pools"][i]["instances"] = list;
    }
    for (size_t j = 0; j < pool.instances.size(); ++j) {
      YAML::Node hosts(YAML::NodeType::Sequence);
      hosts.SetStyle(YAML::EmitterStyle::Flow);
      if (InDisaggregatedSet(pool)) {
        hosts.push_back("localhost");
      } else {
        for (size_t w = 0; w < pool.instances[j].hosts.size(); ++w) {
          hosts.push_back(LwsPodHost(lws, options.namespace_name, int(j), int(w)));
        }
      }
      root["pools"][i]["instances"][j]["hosts"] = hosts;
    }
  }
  std::string text = "# Rendered by headway-launch render k8s: hosts are pod DNS names, the\n"
                     "# control address is the coordinator's control Service.\n" +
                     Emit(root);
  // The rendered text must still be a valid config.
  Result<Config> reparsed = ParseConfig(text);
  if (!reparsed.ok()) {
    return Status::Internal("the rendered config does not load: " + reparsed.status().message());
  }
  return text;
}

// A YAML block scalar: `text` indented by `indent` spaces, one line per line.
std::string Indented(const std::string& text, int indent) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.pop_back();
    out += line.empty() ? "\n" : std::string(size_t(indent), ' ') + line + "\n";
  }
  return out;
}

// Hand-written so that the config stays readable YAML (a block scalar).
std::string ConfigMap(const K8sOptions& options, const std::string& pod_config,
                      const std::string& head_pattern_yaml) {
  YAML::Node head;
  head["apiVersion"] = "v1";
  head["kind"] = "ConfigMap";
  head["metadata"] = Metadata(options, ConfigMapName(options), "config");
  std::string text = Emit(head) + "data:\n  " + kK8sConfigFile + ": |\n" + Indented(pod_config, 4);
  if (!head_pattern_yaml.empty()) {
    text += std::string("  ") + kK8sHeadPatternFile + ": |\n" + Indented(head_pattern_yaml, 4);
  }
  return text;
}

YAML::Node ContainerPort(const std::string& name, int port) {
  YAML::Node p;
  p["name"] = name;
  p["containerPort"] = port;
  p["protocol"] = "TCP";
  return p;
}

YAML::Node HttpProbe(const std::string& path, int period_s, int failure_threshold) {
  YAML::Node probe;
  probe["httpGet"]["path"] = path;
  probe["httpGet"]["port"] = "http";
  probe["periodSeconds"] = period_s;
  probe["timeoutSeconds"] = 2;
  probe["failureThreshold"] = failure_threshold;
  return probe;
}

std::string CoordinatorDeployment(const Config& config, const K8sOptions& options,
                                  int control_port) {
  YAML::Node container;
  container["name"] = "coordinator";
  container["image"] = options.image;
  container["command"].push_back(options.image_bin_dir + "/headway-coordinator");
  for (const std::string& arg :
       {std::string("--config"), std::string(kK8sConfigDir) + "/" + kK8sConfigFile,
        std::string("--model-dir"), std::string(kK8sModelDir)}) {
    container["args"].push_back(arg);
  }
  container["ports"].push_back(ContainerPort("http", config.http_port));
  container["ports"].push_back(ContainerPort("control", control_port));
  // /ready is 503 until every instance registered, which takes the workers'
  // model load: the liveness probe alone restarts a coordinator, and only
  // when /live stops answering. The startup probe gives the coordinator's
  // own model load (vocabulary, spec) up to 2 minutes before that.
  container["startupProbe"] = HttpProbe("/live", 2, 60);
  container["livenessProbe"] = HttpProbe("/live", 10, 3);
  container["readinessProbe"] = HttpProbe("/ready", 5, 1);
  // The coordinator holds the vocabulary and the block tables, not the weights.
  container["resources"]["requests"]["cpu"] = "1";
  container["resources"]["requests"]["memory"] = "1Gi";
  container["resources"]["limits"]["memory"] = "2Gi";
  container["volumeMounts"] = VolumeMounts(false, KeysOf(config, PodKeys::kCoordinator));

  YAML::Node d;
  d["apiVersion"] = "apps/v1";
  d["kind"] = "Deployment";
  d["metadata"] = Metadata(options, options.name + "-coordinator", "coordinator");
  d["spec"]["replicas"] = 1;
  // Two coordinators would both claim the workers: the old one goes first.
  d["spec"]["strategy"]["type"] = "Recreate";
  d["spec"]["selector"]["matchLabels"] = Labels(options, "coordinator");
  d["spec"]["template"]["metadata"]["labels"] = Labels(options, "coordinator");
  d["spec"]["template"]["spec"]["containers"].push_back(container);
  d["spec"]["template"]["spec"]["volumes"] =
      Volumes(options, false, KeysOf(config, PodKeys::kCoordinator));
  return Emit(d);
}

std::string CoordinatorService(const K8sOptions& options, const std::string& name,
                               const std::string& port_name, int port, bool not_ready_too) {
  YAML::Node s;
  s["apiVersion"] = "v1";
  s["kind"] = "Service";
  s["metadata"] = Metadata(options, name, "coordinator");
  s["spec"]["type"] = "ClusterIP";
  s["spec"]["selector"] = Labels(options, "coordinator");
  YAML::Node p;
  p["name"] = port_name;
  p["port"] = port;
  p["targetPort"] = port_name;
  p["protocol"] = "TCP";
  s["spec"]["ports"].push_back(p);
  if (not_ready_too) s["spec"]["publishNotReadyAddresses"] = true;
  return Emit(s);
}

// The pod template of one pool's LeaderWorkerSet: every pod runs the node
// agent for its place in the group.
YAML::Node WorkerTemplate(const PoolConfig& pool, const Config& config,
                          const K8sOptions& options) {
  const int64_t kv_memory_mb = config.kv_memory_mb;
  const int drain_grace_s = (config.drain_timeout_ms + config.heartbeat_timeout_ms) / 1000 + 10;
  const InstanceConfig& shape = pool.instances[0];
  const int ranks_per_pod = shape.hosts.size() == 1 ? shape.tp_size : 1;
  YAML::Node container;
  container["name"] = "node";
  container["image"] = options.image;
  container["command"].push_back(options.image_bin_dir + "/headway-node");
  for (const std::string& arg :
       {std::string("--config"), std::string(kK8sConfigDir) + "/" + kK8sConfigFile,
        std::string("--model-dir"), std::string(kK8sModelDir), std::string("--bin-dir"),
        options.image_bin_dir, std::string("--pool"), pool.name, std::string("--group-index"),
        std::string("$(HEADWAY_GROUP_INDEX)"), std::string("--worker-index"),
        std::string("$(LWS_WORKER_INDEX)"),
        // Collective and KV endpoints listen on the pod's interfaces and
        // are published to peers as the pod IP (README "Network endpoints").
        std::string("--bind-host"), std::string("0.0.0.0"), std::string("--advertise-host"),
        std::string("$(POD_IP)")}) {
    container["args"].push_back(arg);
  }
  YAML::Node group;
  group["name"] = "HEADWAY_GROUP_INDEX";
  group["valueFrom"]["fieldRef"]["fieldPath"] =
      std::string("metadata.labels['") + kLwsGroupIndexLabel + "']";
  container["env"].push_back(group);
  YAML::Node pod_ip;
  pod_ip["name"] = "POD_IP";
  pod_ip["valueFrom"]["fieldRef"]["fieldPath"] = "status.podIP";
  container["env"].push_back(pod_ip);

  const bool cuda = shape.device.rfind("cuda:", 0) == 0;
  // A CPU worker's KV pool is host memory; a CUDA worker's is on its GPU.
  const int64_t memory_mb = int64_t(ranks_per_pod) *
                            (options.model_mb + kRankOverheadMb + (cuda ? 0 : kv_memory_mb));
  const int cpus = shape.num_threads > 0 ? shape.num_threads * ranks_per_pod : ranks_per_pod;
  container["resources"]["requests"]["cpu"] = std::to_string(cpus);
  container["resources"]["requests"]["memory"] = std::to_string(memory_mb) + "Mi";
  container["resources"]["limits"]["memory"] = std::to_string(memory_mb) + "Mi";
  if (cuda) {
    container["resources"]["requests"]["nvidia.com/gpu"] = std::to_string(ranks_per_pod);
    container["resources"]["limits"]["nvidia.com/gpu"] = std::to_string(ranks_per_pod);
  }
  container["volumeMounts"] = VolumeMounts(true, KeysOf(config, PodKeys::kWorker));

  YAML::Node tmpl;
  tmpl["metadata"]["labels"] = Labels(options, "worker");
  tmpl["metadata"]["labels"]["app.kubernetes.io/part-of"] = options.name + "-" + pool.name;
  tmpl["spec"]["containers"].push_back(container);
  // SIGTERM drains the pod's instances (deploy/node/main.cc): their requests
  // get drain_timeout_ms, a worker then waits a heartbeat timeout more for a
  // silent coordinator, before the kubelet's SIGKILL.
  tmpl["spec"]["terminationGracePeriodSeconds"] = drain_grace_s;
  tmpl["spec"]["volumes"] = Volumes(options, true, KeysOf(config, PodKeys::kWorker));
  return tmpl;
}

// A LeaderWorkerSet's spec for one pool: a group per instance, a pod per host.
YAML::Node LwsSpec(const PoolConfig& pool, const Config& config, const K8sOptions& options) {
  YAML::Node spec;
  // Standby slots are what `kubectl scale` may add, up to the pool's max.
  spec["replicas"] = pool.NumInitial();
  spec["startupPolicy"] = "LeaderCreated";
  spec["leaderWorkerTemplate"]["size"] = int(pool.instances[0].hosts.size());
  // A TP group cannot go on without a rank: a pod that dies takes its group.
  spec["leaderWorkerTemplate"]["restartPolicy"] = "RecreateGroupOnPodRestart";
  spec["leaderWorkerTemplate"]["workerTemplate"] = WorkerTemplate(pool, config, options);
  return spec;
}

}  // namespace

std::string LwsPodHost(const std::string& lws, const std::string& namespace_name,
                       int group_index, int worker_index) {
  std::string pod = lws + "-" + std::to_string(group_index);
  if (worker_index > 0) pod += "-" + std::to_string(worker_index);
  return pod + "." + lws + "." + namespace_name;
}

Result<std::vector<RenderedFile>> RenderK8s(const std::string& config_yaml, const Config& config,
                                       const std::string& head_pattern_yaml,
                                       const K8sOptions& options) {
  HW_RETURN_IF_ERROR(CheckDnsLabel("--name", options.name));
  HW_RETURN_IF_ERROR(CheckDnsLabel("--namespace", options.namespace_name));
  if (!options.key_secret.empty() && !IsDnsSubdomain(options.key_secret)) {
    return Status::InvalidArgument("--key-secret = \"" + options.key_secret +
                                   "\" is not a Secret name: lower-case letters, digits, '-' "
                                   "and '.', starting and ending with a letter or digit");
  }
  HW_ASSIGN_OR_RETURN(const int control_port, ControlPortOf(config.control_address, "Kubernetes pods reach the coordinator over TCP"));
  if (config.http_port == 0) {
    return Status::InvalidArgument(
        "`coordinator.http_port` = 0: the Services and probes need a fixed port");
  }
  int num_disaggregated = 0;
  for (size_t i = 0; i < config.pools.size(); ++i) {
    const PoolConfig& pool = config.pools[i];
    HW_RETURN_IF_ERROR(CheckDnsLabel(PoolKey(i) + ".name", pool.name));
    HW_RETURN_IF_ERROR(CheckOneShape(pool, i));
    const int num_hosts = int(pool.instances[0].hosts.size());
    if (InDisaggregatedSet(pool)) {
      ++num_disaggregated;
      if (num_hosts > 1) {
        return Status::InvalidArgument(
            PoolKey(i) + ".instances[0].hosts has " + std::to_string(num_hosts) +
            " hosts: a " + PoolRoleName(pool.role) +
            " instance runs in one pod of a DisaggregatedSet, whose pods' names are not known "
            "in advance; list one host");
      }
      continue;
    }
    // The longest pod name of the pool's LeaderWorkerSet must fit a DNS label.
    const std::string longest = options.name + "-" + pool.name + "-" +
                                std::to_string(pool.instances.size() - 1) +
                                (num_hosts > 1 ? "-" + std::to_string(num_hosts - 1) : "");
    if (int(longest.size()) > kMaxDnsLabel) {
      return Status::InvalidArgument(PoolKey(i) + ".name = \"" + pool.name + "\" with --name " +
                                     options.name + " makes pod names such as " + longest +
                                     " longer than 63 characters; shorten either");
    }
  }
  HW_RETURN_IF_ERROR(CheckDnsLabel("--name (as N-control)", ControlServiceName(options)));
  HW_RETURN_IF_ERROR(CheckDnsLabel("--name (as N-coordinator)", options.name + "-coordinator"));

  HW_ASSIGN_OR_RETURN(const std::string pod_config,
                      PodConfig(config_yaml, config, !head_pattern_yaml.empty(), options,
                                control_port));
  std::vector<RenderedFile> files;
  files.push_back({"configmap.yaml", ConfigMap(options, pod_config, head_pattern_yaml)});
  if (config.security.HasKeys() && options.key_secret.empty()) {
    files.push_back({"secret.yaml", KeySecret(options), /*executable=*/false, /*secret=*/true});
  }
  files.push_back({"coordinator-deployment.yaml",
                   CoordinatorDeployment(config, options, control_port)});
  files.push_back({"coordinator-service.yaml",
                   CoordinatorService(options, options.name, "http", config.http_port, false)});
  // Workers must reach the coordinator before it is ready: it is ready only
  // once they have registered.
  files.push_back({"coordinator-control-service.yaml",
                   CoordinatorService(options, ControlServiceName(options), "control",
                                      control_port, true)});
  for (const PoolConfig& pool : config.pools) {
    if (InDisaggregatedSet(pool)) continue;
    YAML::Node lws;
    lws["apiVersion"] = "leaderworkerset.x-k8s.io/v1";
    lws["kind"] = "LeaderWorkerSet";
    lws["metadata"] = Metadata(options, options.name + "-" + pool.name, "worker");
    lws["spec"] = LwsSpec(pool, config, options);
    files.push_back({"lws-" + pool.name + ".yaml", Emit(lws)});
  }
  if (num_disaggregated > 0) {
    YAML::Node ds;
    ds["apiVersion"] = "disaggregatedset.x-k8s.io/v1";
    ds["kind"] = "DisaggregatedSet";
    ds["metadata"] = Metadata(options, options.name, "worker");
    for (const PoolConfig& pool : config.pools) {
      if (!InDisaggregatedSet(pool)) continue;
      YAML::Node role;
      role["name"] = pool.name;
      role["spec"] = LwsSpec(pool, config, options);
      ds["spec"]["roles"].push_back(role);
    }
    files.push_back({"disaggregatedset.yaml", Emit(ds)});
  }
  return files;
}

}  // namespace headway::launcher
