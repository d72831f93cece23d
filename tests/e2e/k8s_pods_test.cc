// The pods `headway-launch render k8s` describes, run on this machine: for a
// shipped config (deploy/configs/local.yaml, pd.yaml, and tp3.yaml with a
// host per rank: one group of 3 pods) the test renders the
// manifests, lists the pods the coordinator Deployment and each
// LeaderWorkerSet would create (replicas x size; a DisaggregatedSet's roles
// each become one LeaderWorkerSet), gives each pod the environment
// LeaderWorkerSet injects (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE,
// LWS_WORKER_INDEX) and its downward-API values (the group-index label),
// expands $(VAR) in its command as the kubelet does, maps its volumes (the
// ConfigMap's files, the model claim, the image's binaries) to local paths,
// and runs that exact command, every pod in random order, the coordinator
// among them. The deployment must come up (/ready 200, /health "ok") and
// answer greedy completions exactly as a headway-launch run of the same
// config does.
//
// Every pod runs in a network namespace of its own, all of them on one
// bridge (tests/support/netns_lan.h), with an /etc/hosts that maps the
// coordinator's Services to the coordinator pod's address and each pod's
// DNS name to that pod's address: the stand-in for cluster DNS. The test's
// HTTP client sits in one more namespace on the same bridge. The config the
// pods read must name exactly the pods LeaderWorkerSet would create.
// Not exercised: an API server, the LeaderWorkerSet and DisaggregatedSet
// controllers, a kubelet, Services and kube-proxy (a Service name resolves
// straight to the coordinator pod), cluster DNS and its timing, image
// contents and resource limits.
//
// Needs the model and root (network namespaces); skips without either.
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "tests/support/deployment.h"
#include "tests/support/netns_lan.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTokens = 16;
constexpr char kNamespace[] = "hwtest";
constexpr char kImageBinDir[] = "/opt/headway/bin";
// A DisaggregatedSet names its LeaderWorkerSets <name>-<revision>-<role>;
// the revision is a hash the test cannot know, so any will do.
constexpr char kFakeRevision[] = "5d2c9a1f";

std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string Tail(const ChildProcess& p, size_t max_chars = 2500) {
  const std::string log = p.Log();
  return p.log_path() + ":\n" + (log.size() > max_chars ? log.substr(log.size() - max_chars) : log);
}

// $(VAR) as the kubelet expands it in a container's command and args: a
// variable the container defines is replaced, $$ is a literal $, anything
// else stays as written.
std::string ExpandKubelet(const std::string& s, const std::map<std::string, std::string>& env) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '(') {
      const size_t close = s.find(')', i + 2);
      if (close != std::string::npos) {
        auto it = env.find(s.substr(i + 2, close - i - 2));
        if (it != env.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out += s[i];
  }
  return out;
}

// Three of the shared prompts (chat turns and plain text): enough to tell
// deployments apart, few enough to keep the test in seconds.
std::vector<nlohmann::json> Prompts() {
  const std::vector<std::string>& all = SmolLm2TestPrompts();
  return {all[0], all[1], all[2]};
}

// One pod: what the kubelet would run.
struct Pod {
  std::string name;
  std::string dns_name;                       // as the pod's headless Service publishes it
  YAML::Node spec;                            // the pod template's spec
  std::map<std::string, std::string> env;     // injected by LWS + downward API
  std::string group_index;                    // the group-index label ("" for the coordinator)
};

// Resolves the container's env (values and downward-API references) on top
// of `pod.env`; `pod_ip` is status.podIP. Fails the test on a reference it
// does not know.
std::map<std::string, std::string> ContainerEnv(const Pod& pod, const YAML::Node& container,
                                                const std::string& pod_ip) {
  std::map<std::string, std::string> env = pod.env;
  for (const YAML::Node& var : container["env"]) {
    const std::string name = var["name"].as<std::string>();
    if (var["value"]) {
      env[name] = ExpandKubelet(var["value"].as<std::string>(), env);
      continue;
    }
    const std::string field = var["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>("");
    if (field == "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']") {
      env[name] = pod.group_index;
    } else if (field == "status.podIP") {
      env[name] = pod_ip;
    } else if (field == "metadata.name") {
      env[name] = pod.name;
    } else if (field == "metadata.namespace") {
      env[name] = kNamespace;
    } else {
      ADD_FAILURE() << pod.name << ": env " << name << " refers to " << field
                    << ", which this test does not provide";
    }
  }
  return env;
}

// The pod's container command with $(VAR) expanded and its mounts mapped to
// local paths, in member `member` of `lan`.
std::vector<std::string> PodArgv(const Pod& pod, const NetnsLan& lan, int member,
                                 const std::map<std::string, std::string>& volume_paths) {
  const YAML::Node container = pod.spec["containers"][0];
  std::map<std::string, std::string> mounts = {{kImageBinDir, BinaryPath("")}};
  for (const YAML::Node& m : container["volumeMounts"]) {
    auto local = volume_paths.find(m["name"].as<std::string>());
    if (local != volume_paths.end()) mounts[m["mountPath"].as<std::string>()] = local->second;
  }
  auto map_path = [&](const std::string& arg) {
    for (const auto& [in_pod, here] : mounts) {
      if (arg == in_pod) return here;
      if (arg.rfind(in_pod + "/", 0) == 0) return here + arg.substr(in_pod.size());
    }
    return arg;
  };
  const std::map<std::string, std::string> env =
      ContainerEnv(pod, container, lan.address(member));
  std::vector<std::string> vars;
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  std::vector<std::string> argv;
  for (const char* key : {"command", "args"}) {
    for (const YAML::Node& a : container[key]) {
      argv.push_back(map_path(ExpandKubelet(a.as<std::string>(), env)));
    }
  }
  return lan.ExecArgv(member, argv, vars);
}

// The pods of one LeaderWorkerSet spec named `lws`.
void AddLwsPods(const std::string& lws, const YAML::Node& spec, std::vector<Pod>* pods) {
  const int replicas = spec["replicas"].as<int>();
  const int size = spec["leaderWorkerTemplate"]["size"].as<int>();
  const YAML::Node tmpl = spec["leaderWorkerTemplate"]["workerTemplate"];
  for (int g = 0; g < replicas; ++g) {
    const std::string leader = lws + "-" + std::to_string(g);
    for (int w = 0; w < size; ++w) {
      Pod pod;
      pod.name = w == 0 ? leader : leader + "-" + std::to_string(w);
      pod.dns_name = pod.name + "." + lws + "." + kNamespace;
      // The leader's own template when there is one; workers always use workerTemplate.
      pod.spec = (w == 0 && spec["leaderWorkerTemplate"]["leaderTemplate"])
                     ? spec["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
                     : tmpl["spec"];
      pod.group_index = std::to_string(g);
      pod.env = {{"LWS_LEADER_ADDRESS", leader + "." + lws + "." + kNamespace},
                 {"LWS_GROUP_SIZE", std::to_string(size)},
                 {"LWS_WORKER_INDEX", std::to_string(w)}};
      pods->push_back(pod);
    }
  }
}

// The reference: headway-launch on `config`; greedy texts for the prompts.
std::vector<std::string> LaunchTexts(const std::string& config, int http_port,
                                     const std::string& served_name, const std::string& dir,
                                     std::string* error) {
  ChildProcess launcher({BinaryPath("headway-launch"), config, "--model-dir",
                         std::filesystem::path(SmolLm2Path()).parent_path().string()},
                        dir + "/launch.log");
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (Clock::now() < deadline && launcher.Running()) {
    if (EveryInstanceReady(HttpGet(http_port, "/health", 5))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!EveryInstanceReady(HttpGet(http_port, "/health", 5))) {
    *error = "headway-launch never became ready\n" + Tail(launcher);
    return {};
  }
  return GreedyTexts(
      [&](const std::string& body) {
        nlohmann::json j = nlohmann::json::parse(body);
        j["model"] = served_name;
        return HttpPost(http_port, "/v1/completions", j.dump(), 60);
      },
      Prompts(), kMaxTokens, 1);
}

// `edit` turns the shipped config's text into the one both runs use.
void RunPodsOf(const std::string& shipped_config,
               const std::function<std::string(const std::string&)>& edit = nullptr) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  ScopedTempDir dir("headway-k8s-pods");
  ASSERT_FALSE(dir.path.empty());
  const std::string model_dir = std::filesystem::path(SmolLm2Path()).parent_path().string();
  std::string shipped = ReadText(SourceDir() + "/deploy/configs/" + shipped_config);
  ASSERT_FALSE(shipped.empty()) << shipped_config;
  if (edit) shipped = edit(shipped);
  // The same config on free ports: once for headway-launch, once rendered.
  auto on_ports = [&](int http_port, int control_port) {
    return Replaced(Replaced(shipped, "http_port: 8000", "http_port: " + std::to_string(http_port)),
                    "tcp://127.0.0.1:5557", "tcp://127.0.0.1:" + std::to_string(control_port));
  };
  const Result<Config> parsed = ParseConfig(shipped);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const std::string served_name = parsed->served_model_name;

  const int launch_port = FreePort();
  const std::string launch_config = dir.path + "/launch.yaml";
  std::ofstream(launch_config) << on_ports(launch_port, FreePort());
  std::string error;
  const std::vector<std::string> expected =
      LaunchTexts(launch_config, launch_port, served_name, dir.path, &error);
  ASSERT_FALSE(expected.empty()) << error;

  const int http_port = FreePort();
  const std::string k8s_config = dir.path + "/k8s-input.yaml";
  // The rendered pods' control port is on the pod network; the renderer
  // makes no Secret for keys yet (README "Security"), so this cluster
  // network is trusted explicitly.
  std::ofstream(k8s_config) << on_ports(http_port, FreePort()) << "security:\n  insecure: true\n";
  const std::string out = dir.path + "/manifests";
  ChildProcess render({BinaryPath("headway-launch"), "render", "k8s", k8s_config, "-o", out,
                       "--namespace", kNamespace, "--image-bin-dir", kImageBinDir, "--model-dir",
                       model_dir},
                      dir.path + "/render.log");
  const int render_status = render.WaitExit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(render_status) && WEXITSTATUS(render_status) == 0) << Tail(render);

  // The ConfigMap's files, where the pods' config volume points.
  const std::string config_dir = dir.path + "/configmap";
  std::filesystem::create_directories(config_dir);
  const YAML::Node config_map = YAML::LoadFile(out + "/configmap.yaml");
  for (const auto& entry : config_map["data"]) {
    std::ofstream(config_dir + "/" + entry.first.as<std::string>())
        << entry.second.as<std::string>();
  }
  std::map<std::string, std::string> volume_paths = {{"config", config_dir},
                                                     {"models", model_dir}};

  const Result<Config> pod_config = ParseConfig(ReadText(config_dir + "/config.yaml"));
  ASSERT_TRUE(pod_config.ok()) << pod_config.status().message();

  std::vector<Pod> pods;
  const YAML::Node deployment = YAML::LoadFile(out + "/coordinator-deployment.yaml");
  ASSERT_EQ(deployment["spec"]["replicas"].as<int>(), 1);
  Pod coordinator;
  coordinator.name = deployment["metadata"]["name"].as<std::string>() + "-pod";
  coordinator.spec = deployment["spec"]["template"]["spec"];
  pods.push_back(coordinator);
  for (const auto& entry : std::filesystem::directory_iterator(out)) {
    const YAML::Node obj = YAML::LoadFile(entry.path().string());
    const std::string kind = obj["kind"].as<std::string>();
    const std::string name = obj["metadata"]["name"].as<std::string>();
    if (kind == "LeaderWorkerSet") AddLwsPods(name, obj["spec"], &pods);
    if (kind == "DisaggregatedSet") {
      for (const YAML::Node& role : obj["spec"]["roles"]) {
        AddLwsPods(name + "-" + kFakeRevision + "-" + role["name"].as<std::string>(),
                   role["spec"], &pods);
      }
    }
  }
  ASSERT_GE(pods.size(), 2u);

  // One namespace per pod (pods[i] is member i), one more for the client.
  NetnsLan lan("k8s", int(pods.size()) + 1);
  HW_SETUP_NETNS_LAN_OR_SKIP(lan);
  const int client = int(pods.size());
  const std::string& control = pod_config->control_address;
  const std::string control_host = control.substr(6, control.rfind(':') - 6);
  std::string hosts = "127.0.0.1 localhost\n";
  // The coordinator pod is pods[0]: both Services lead to it.
  const YAML::Node http_service = YAML::LoadFile(out + "/coordinator-service.yaml");
  hosts += lan.address(0) + " " + control_host + " " +
           http_service["metadata"]["name"].as<std::string>() + "." + kNamespace + ".svc\n";
  std::set<std::string> pod_names = {"localhost"};
  for (size_t i = 1; i < pods.size(); ++i) {
    hosts += lan.address(int(i)) + " " + pods[i].dns_name + "\n";
    pod_names.insert(pods[i].dns_name);
  }
  for (const PoolConfig& pool : pod_config->pools) {
    for (const InstanceConfig& instance : pool.instances) {
      for (const std::string& host : instance.hosts) {
        EXPECT_EQ(pod_names.count(host), 1u) << "the config names " << host
                                             << ", which is no pod's name";
      }
    }
  }
  ASSERT_TRUE(lan.WriteHosts(hosts).ok());
  const std::string coordinator_ip = lan.address(0);

  std::random_device device;
  const unsigned seed = device();
  std::mt19937 rng(seed);
  // An order of indices: assigning a YAML::Node writes through to the node
  // it refers to, so Pods are not moved around.
  std::vector<size_t> start_order(pods.size());
  for (size_t i = 0; i < pods.size(); ++i) start_order[i] = i;
  std::shuffle(start_order.begin(), start_order.end(), rng);
  std::string order;
  for (size_t i : start_order) order += (order.empty() ? "" : ", ") + pods[i].name;
  std::printf("[ info     ] %s: %zu pods, started in this order (seed %u): %s\n",
              shipped_config.c_str(), pods.size(), seed, order.c_str());

  std::vector<std::unique_ptr<ChildProcess>> running;
  for (size_t i : start_order) {
    const Pod& pod = pods[i];
    running.push_back(std::make_unique<ChildProcess>(PodArgv(pod, lan, int(i), volume_paths),
                                                     dir.path + "/" + pod.name + ".log"));
    ASSERT_GT(running.back()->pid(), 0) << Tail(*running.back());
    // Apart enough that a pod started early is really waiting for the others.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(
        0, 300)(rng)));
  }
  auto logs = [&] {
    std::string all;
    for (const auto& p : running) all += Tail(*p) + "\n";
    return all;
  };
  auto all_running = [&] {
    for (const auto& p : running) {
      if (!p->Running()) return false;
    }
    return true;
  };

  // From the client's namespace, across the bridge, as a client of Service N would.
  bool ready = false;
  int live_status = 0;
  std::string health_status;
  std::vector<std::string> got;
  std::string metrics_page;
  const Status in_ns = lan.RunInNamespace(client, [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline && all_running()) {
      if (HttpGet(coordinator_ip, http_port, "/ready", 5).status == 200 &&
          EveryInstanceReady(HttpGet(coordinator_ip, http_port, "/health", 5))) {
        ready = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (!ready) return;
    live_status = HttpGet(coordinator_ip, http_port, "/live", 5).status;
    health_status = HttpGet(coordinator_ip, http_port, "/health", 5).json.value("status", "");
    got = GreedyTexts(
        [&](const std::string& body) {
          nlohmann::json j = nlohmann::json::parse(body);
          j["model"] = served_name;
          return HttpPost(coordinator_ip, http_port, "/v1/completions", j.dump(), 60);
        },
        Prompts(), kMaxTokens, 1);
    metrics_page = HttpGet(coordinator_ip, http_port, "/metrics", 10).body;
  });
  ASSERT_TRUE(in_ns.ok()) << in_ns.ToString();
  ASSERT_TRUE(ready) << "the pods never became ready\n" << logs();
  EXPECT_EQ(live_status, 200);
  EXPECT_EQ(health_status, "ok");
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_FALSE(IsErrorText(got[i])) << got[i];
    EXPECT_EQ(got[i], expected[i]) << "prompt " << i;
  }
  if (pod_config->KvTransferEnabled()) {
    // The blocks crossed from the prefill pod to the decode pod: no request
    // fell back to computing its prompt on the decode side.
    EXPECT_GT(SumOfSamples(metrics_page, "headway:kv_transfer_blocks_total"), 0) << metrics_page;
    EXPECT_EQ(SumOfSamples(metrics_page, "headway:kv_transfer_fallbacks_total"), 0) << metrics_page;
  }
  if (::testing::Test::HasFailure()) ADD_FAILURE() << logs();
}

TEST(K8sPodsTest, LocalConfigPodsServeAsHeadwayLaunchDoes) { RunPodsOf("local.yaml"); }

TEST(K8sPodsTest, DisaggregatedConfigPodsServeAsHeadwayLaunchDoes) { RunPodsOf("pd.yaml"); }

// tp3.yaml with a host per rank and Gloo between them: a LeaderWorkerSet of
// one group of 3 pods, whose ranks find each other by the pods' DNS names.
// headway-launch runs the same config's three ranks here, over Gloo too.
// About 30 s on two cores (a Gloo all-reduce per layer, twice, over the bridge): labelled slow.
TEST(K8sPodsTest, TpGroupAcrossThreePodsServesAsHeadwayLaunchDoesSlow) {
  RunPodsOf("tp3.yaml", [](const std::string& text) {
    return Replaced(Replaced(text, "hosts: [127.0.0.1]", "hosts: [127.0.0.1, 127.0.0.1, 127.0.0.1]"),
                    "        collective: shm ", "        collective: gloo ");
  });
}

}  // namespace
}  // namespace headway::testing
