// Kubernetes manifests for a deployment config (`headway-launch render k8s`,
// DESIGN.md "Configuration and deployment"). Pure logic: text in, text out.
//
// What is rendered, for options.name = N in namespace NS:
//   configmap.yaml                    ConfigMap N-config: the config as the pods
//                                     read it (config.yaml; head_pattern.yaml)
//   coordinator-deployment.yaml       Deployment N-coordinator, one replica,
//                                     probes on /live and /ready
//   coordinator-service.yaml          Service N: the HTTP API
//   coordinator-control-service.yaml  Service N-control: what workers dial
//   lws-<pool>.yaml                   per mixed pool, LeaderWorkerSet N-<pool>:
//                                     replicas = instances, size = hosts per instance
//   disaggregatedset.yaml             the prefill and decode pools, one
//                                     DisaggregatedSet N with a role per pool
//   secret.yaml                       with security keys and no
//                                     options.key_secret: Secret N-keys holding
//                                     the key files (written with mode 0600)
//
// Control-plane keys. When the config has security keys, every pod mounts a
// Secret read-only at kK8sKeyDir: the coordinator's pod its secret key and
// the allow-list, a worker pod the coordinator's public key and the
// workers' secret key, under the Secret keys kK8sSecret*. The Secret is
// options.key_secret, one the user made (the manifests then hold no key
// material), or else Secret N-keys, rendered from options.key_files.
//
// How a pod finds its workers: every worker container runs the node agent as
//   headway-node --pool P --group-index $(HEADWAY_GROUP_INDEX)
//                --worker-index $(LWS_WORKER_INDEX) ...
// where HEADWAY_GROUP_INDEX is the pod's label
// leaderworkerset.sigs.k8s.io/group-index (downward API) and LWS_WORKER_INDEX
// is set by LeaderWorkerSet (0 on the leader). Group g of pool P's
// LeaderWorkerSet is the pool's g-th instance.
//
// The config the pods read differs from the input in four places:
//   * security.coordinator_key, coordinator_public_key, client_key and
//     authorized_keys name the files under kK8sKeyDir (when it has keys);
//   * coordinator.http_host is 0.0.0.0, coordinator.control_address is
//     tcp://N-control.NS.svc:PORT and coordinator.control_bind is
//     tcp://0.0.0.0:PORT;
//   * a mixed pool's instance g lists its pods' DNS names as hosts: the
//     leader N-P-g.N-P.NS, then N-P-g-w.N-P.NS for w >= 1 (the
//     LeaderWorkerSet's headless Service is named after it);
//   * a prefill or decode instance has one host, `localhost`: the
//     LeaderWorkerSets of a DisaggregatedSet are named with a revision hash
//     (N-<revision>-<role>), so their pods' names are not known in advance;
//     such an instance must keep all its ranks in one pod.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "deploy/launcher/rendered_file.h"

namespace headway::launcher {

// Where the pods see what the manifests mount.
inline constexpr char kK8sConfigDir[] = "/etc/headway";  // the ConfigMap
inline constexpr char kK8sConfigFile[] = "config.yaml";   // in kK8sConfigDir
inline constexpr char kK8sHeadPatternFile[] = "head_pattern.yaml";
inline constexpr char kK8sModelDir[] = "/models";         // options.model_claim
// Where the pods see the control-plane keys (the Secret), and the Secret's
// keys, which are also the files' names there.
inline constexpr char kK8sKeyDir[] = "/etc/headway-keys";
inline constexpr char kK8sSecretCoordinatorKey[] = "coordinator.key_secret";
inline constexpr char kK8sSecretCoordinatorPublicKey[] = "coordinator.key";
inline constexpr char kK8sSecretClientKey[] = "client.key_secret";
inline constexpr char kK8sSecretAuthorizedKeys[] = "authorized_keys";  // `public-key = "..."` lines
// The pod label LeaderWorkerSet puts the group index in.
inline constexpr char kLwsGroupIndexLabel[] = "leaderworkerset.sigs.k8s.io/group-index";

struct K8sOptions {
  std::string name = "headway";       // prefix of every object's name; a DNS label
  std::string namespace_name = "default";
  std::string image = "headway:latest";  // holds the Headway binaries
  std::string image_bin_dir = "/usr/local/bin";  // where, in the image
  // PersistentVolumeClaim holding the model directory, mounted read-only at
  // kK8sModelDir in every pod (a relative model.path is taken against it).
  std::string model_claim = "headway-models";
  // Size of the model file, MiB: with cache.kv_memory_mb it sizes each
  // worker's memory request (per rank: weights + KV pool + 512 MiB).
  int64_t model_mb = 1024;
  // A Secret the user created holding the four kK8sSecret* keys; "" =
  // render Secret N-keys from key_files. Used only when the config has
  // security keys.
  std::string key_secret;
  // The key files' contents, for the rendered Secret (headway-keygen's
  // certificate text; authorized_keys as `public-key = "..."` lines).
  struct KeyFiles {
    std::string coordinator_key;
    std::string coordinator_public_key;
    std::string client_key;
    std::string authorized_keys;
  } key_files;
};


// Renders `config` (as loaded by LoadConfigFile from `config_yaml`, the
// file's text; keys the pods' config keeps come from that text) into the
// files listed above, ConfigMap first. `head_pattern_yaml` is the text of
// config.head_pattern_path ("" when there is none); it travels in the
// ConfigMap. The result is deterministic: the same input, the same bytes.
// Errors (InvalidArgument, naming the key or option and what is allowed):
// a name that is not a DNS label or makes a pod name longer than 63
// characters; coordinator.control_address not tcp://; http_port 0; a
// prefill or decode instance with more than one host; a pool whose
// instances differ in shape (tp_size, device, hosts count, num_threads,
// collective, collective_timeout_ms); device cuda:N with N > 0 (a pod's
// GPUs count from 0); config_yaml that does not parse; key_secret that is
// not a DNS subdomain name.
// REQUIRES: ValidateConfig(config).ok().
Result<std::vector<RenderedFile>> RenderK8s(const std::string& config_yaml, const Config& config,
                                       const std::string& head_pattern_yaml,
                                       const K8sOptions& options);

// The DNS name of host `worker_index` of instance `group_index` of a
// LeaderWorkerSet `lws` in `namespace_name`: the leader (index 0) is
// lws-g.lws.ns, the others lws-g-w.lws.ns.
std::string LwsPodHost(const std::string& lws, const std::string& namespace_name,
                       int group_index, int worker_index);

}  // namespace headway::launcher
