// RenderK8s on in-memory configs: which files come out, what the pods' config
// says (hosts are the LeaderWorkerSet pods' DNS names, the control address
// the coordinator's Service), the pod template's node agent command, and the
// configs refused. WorkersOfGroupMember: which workers a pod's agent runs.
// Schema validation of the rendered files is K8sManifests.ValidateAgainstSchemas
// (tests/deploy/validate_k8s_manifests.py); running the pods' commands is
// tests/e2e/k8s_pods_test.cc.
#include "deploy/launcher/k8s_manifests.h"

#include <yaml-cpp/yaml.h>

#include <map>

#include <gtest/gtest.h>

#include "deploy/launcher/launch_plan.h"

namespace headway::launcher {
namespace {

constexpr char kMixed[] = R"(
model:
  path: m.gguf
coordinator:
  http_port: 8080
  control_address: tcp://10.1.1.1:6000
pools:
  - name: main
    instances:
      - tp_size: 3
        hosts: [a, b, c]
        num_threads: 2
      - tp_size: 3
        hosts: [d, e, f]
        num_threads: 2
  - name: small
    instances:
      - tp_size: 1
)";

constexpr char kPd[] = R"(
model:
  path: m.gguf
kv_transfer:
  transports: tcp
pools:
  - name: prefill
    role: prefill
    instances:
      - tp_size: 1
      - tp_size: 1
  - name: decode
    role: decode
    instances:
      - tp_size: 3
        hosts: [x]
)";

Config Parse(const std::string& yaml) {
  Result<Config> config = ParseConfig(yaml);
  EXPECT_TRUE(config.ok()) << config.status().message();
  return config.ok() ? *config : Config{};
}

std::map<std::string, std::string> Render(const std::string& yaml, const K8sOptions& options = {},
                                          const std::string& head_pattern = "") {
  Result<std::vector<RenderedFile>> files = RenderK8s(yaml, Parse(yaml), head_pattern, options);
  EXPECT_TRUE(files.ok()) << files.status().message();
  std::map<std::string, std::string> by_name;
  if (files.ok()) {
    for (const RenderedFile& f : *files) by_name[f.file_name] = f.text;
  }
  return by_name;
}

// The config the pods read, from the rendered ConfigMap.
Config PodConfig(const std::map<std::string, std::string>& files) {
  const YAML::Node map = YAML::Load(files.at("configmap.yaml"));
  return Parse(map["data"][kK8sConfigFile].as<std::string>());
}

std::vector<std::string> Strings(const YAML::Node& seq) {
  std::vector<std::string> out;
  for (const YAML::Node& n : seq) out.push_back(n.as<std::string>());
  return out;
}

TEST(K8sManifestsTest, MixedPoolsBecomeLeaderWorkerSets) {
  K8sOptions options;
  options.namespace_name = "serving";
  const auto files = Render(kMixed, options);
  std::vector<std::string> names;
  for (const auto& [name, text] : files) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"configmap.yaml", "coordinator-control-service.yaml",
                                             "coordinator-deployment.yaml",
                                             "coordinator-service.yaml", "lws-main.yaml",
                                             "lws-small.yaml"}));

  const YAML::Node lws = YAML::Load(files.at("lws-main.yaml"));
  EXPECT_EQ(lws["kind"].as<std::string>(), "LeaderWorkerSet");
  EXPECT_EQ(lws["metadata"]["name"].as<std::string>(), "headway-main");
  EXPECT_EQ(lws["metadata"]["namespace"].as<std::string>(), "serving");
  EXPECT_EQ(lws["spec"]["replicas"].as<int>(), 2);
  EXPECT_EQ(lws["spec"]["leaderWorkerTemplate"]["size"].as<int>(), 3);
  const YAML::Node container =
      lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0];
  EXPECT_EQ(Strings(container["command"]),
            std::vector<std::string>{"/usr/local/bin/headway-node"});
  EXPECT_EQ(Strings(container["args"]),
            (std::vector<std::string>{"--config", "/etc/headway/config.yaml", "--model-dir",
                                      "/models", "--bin-dir", "/usr/local/bin", "--pool", "main",
                                      "--group-index", "$(HEADWAY_GROUP_INDEX)",
                                      "--worker-index", "$(LWS_WORKER_INDEX)", "--bind-host",
                                      "0.0.0.0", "--advertise-host", "$(POD_IP)"}));
  EXPECT_EQ(container["env"][0]["name"].as<std::string>(), "HEADWAY_GROUP_INDEX");
  EXPECT_EQ(container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(),
            "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']");
  EXPECT_EQ(container["env"][1]["name"].as<std::string>(), "POD_IP");
  EXPECT_EQ(container["env"][1]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(),
            "status.podIP");
  // SIGTERM drains: the grace period covers drain_timeout_ms (25 s by
  // default) and a heartbeat timeout (10 s).
  EXPECT_EQ(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
               ["terminationGracePeriodSeconds"].as<int>(),
            45);
  // One rank per pod, 2 threads each.
  EXPECT_EQ(container["resources"]["requests"]["cpu"].as<std::string>(), "2");

  const YAML::Node small = YAML::Load(files.at("lws-small.yaml"));
  EXPECT_EQ(small["spec"]["replicas"].as<int>(), 1);
  EXPECT_EQ(small["spec"]["leaderWorkerTemplate"]["size"].as<int>(), 1);
}

TEST(K8sManifestsTest, PodConfigNamesPodsAndTheControlService) {
  K8sOptions options;
  options.namespace_name = "serving";
  const Config pod = PodConfig(Render(kMixed, options));
  EXPECT_EQ(pod.http_host, "0.0.0.0");
  EXPECT_EQ(pod.http_port, 8080);
  EXPECT_EQ(pod.control_address, "tcp://headway-control.serving.svc:6000");
  EXPECT_EQ(pod.control_bind, "tcp://0.0.0.0:6000");
  ASSERT_EQ(pod.pools.size(), 2u);
  EXPECT_EQ(pod.pools[0].instances[1].hosts,
            (std::vector<std::string>{"headway-main-1.headway-main.serving",
                                      "headway-main-1-1.headway-main.serving",
                                      "headway-main-1-2.headway-main.serving"}));
  EXPECT_EQ(pod.pools[1].instances[0].hosts,
            std::vector<std::string>{"headway-small-0.headway-small.serving"});
  // Everything else is the input's.
  EXPECT_EQ(pod.pools[0].instances[0].num_threads, 2);
  EXPECT_EQ(pod.model_path, "m.gguf");
}

TEST(K8sManifestsTest, CoordinatorBindsEverywhereAndIsProbed) {
  const auto files = Render(kMixed);
  const YAML::Node d = YAML::Load(files.at("coordinator-deployment.yaml"));
  const YAML::Node c = d["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(Strings(c["args"]),
            (std::vector<std::string>{"--config", "/etc/headway/config.yaml", "--model-dir",
                                      "/models"}));
  EXPECT_EQ(c["startupProbe"]["httpGet"]["path"].as<std::string>(), "/live");
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["path"].as<std::string>(), "/live");
  EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"].as<std::string>(), "/ready");
  EXPECT_EQ(c["ports"][0]["containerPort"].as<int>(), 8080);
  EXPECT_TRUE(c["resources"]["requests"]);

  const YAML::Node http = YAML::Load(files.at("coordinator-service.yaml"));
  EXPECT_EQ(http["metadata"]["name"].as<std::string>(), "headway");
  EXPECT_EQ(http["spec"]["ports"][0]["port"].as<int>(), 8080);
  EXPECT_FALSE(http["spec"]["publishNotReadyAddresses"]);
  // Workers register before the coordinator is ready.
  const YAML::Node control = YAML::Load(files.at("coordinator-control-service.yaml"));
  EXPECT_EQ(control["metadata"]["name"].as<std::string>(), "headway-control");
  EXPECT_EQ(control["spec"]["ports"][0]["port"].as<int>(), 6000);
  EXPECT_TRUE(control["spec"]["publishNotReadyAddresses"].as<bool>());
}

TEST(K8sManifestsTest, PrefillAndDecodePoolsBecomeOneDisaggregatedSet) {
  const auto files = Render(kPd);
  EXPECT_EQ(files.count("disaggregatedset.yaml"), 1u);
  EXPECT_EQ(files.count("lws-prefill.yaml"), 0u);
  const YAML::Node ds = YAML::Load(files.at("disaggregatedset.yaml"));
  EXPECT_EQ(ds["kind"].as<std::string>(), "DisaggregatedSet");
  ASSERT_EQ(ds["spec"]["roles"].size(), 2u);
  EXPECT_EQ(ds["spec"]["roles"][0]["name"].as<std::string>(), "prefill");
  EXPECT_EQ(ds["spec"]["roles"][0]["spec"]["replicas"].as<int>(), 2);
  EXPECT_EQ(ds["spec"]["roles"][1]["name"].as<std::string>(), "decode");
  EXPECT_EQ(ds["spec"]["roles"][1]["spec"]["leaderWorkerTemplate"]["size"].as<int>(), 1);
  const YAML::Node decode = ds["spec"]["roles"][1]["spec"]["leaderWorkerTemplate"]
                              ["workerTemplate"]["spec"]["containers"][0];
  EXPECT_EQ(decode["args"][7].as<std::string>(), "decode");
  // Three ranks in one pod: three CPUs at least.
  EXPECT_EQ(decode["resources"]["requests"]["cpu"].as<std::string>(), "3");
  const Config pod = PodConfig(files);
  EXPECT_EQ(pod.pools[1].instances[0].hosts, std::vector<std::string>{"localhost"});
  EXPECT_TRUE(pod.kv_transfer_enabled);
}

TEST(K8sManifestsTest, HeadPatternTravelsInTheConfigMap) {
  const std::string yaml = std::string(kMixed) + "\n";
  std::string with_pattern = yaml;
  with_pattern.replace(with_pattern.find("  path: m.gguf"), 13,
                       "  path: m.gguf\n  head_pattern: /somewhere/heads.yaml");
  const auto files = Render(with_pattern, {}, "every_layer: sff\n");
  const YAML::Node map = YAML::Load(files.at("configmap.yaml"));
  EXPECT_EQ(map["data"][kK8sHeadPatternFile].as<std::string>(), "every_layer: sff\n");
  EXPECT_EQ(PodConfig(files).head_pattern_path, kK8sHeadPatternFile);
}

TEST(K8sManifestsTest, SameInputSameBytes) {
  const auto a = Render(kMixed);
  const auto b = Render(kMixed);
  EXPECT_EQ(a, b);
}

constexpr char kSecurity[] = R"(
security:
  coordinator_key: /keys/c.key_secret
  coordinator_public_key: /keys/c.key
  client_key: /keys/w.key_secret
  authorized_keys: /keys/authorized
)";

// The volume named `name` of a pod spec, or an undefined node (false).
YAML::Node Volume(const YAML::Node& pod_spec, const std::string& name) {
  for (const YAML::Node& v : pod_spec["volumes"]) {
    if (v["name"].as<std::string>() == name) return v;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::vector<std::string> ItemKeys(const YAML::Node& volume) {
  std::vector<std::string> keys;
  for (const YAML::Node& item : volume["secret"]["items"]) keys.push_back(item["key"].as<std::string>());
  return keys;
}

TEST(K8sManifestsTest, KeyFilesTravelInARenderedSecretMountedReadOnly) {
  K8sOptions options;
  options.key_files = {"coordinator secret\n", "coordinator public\n", "worker secret\n",
                       "public-key = \"w\"\n"};
  const auto files = Render(std::string(kMixed) + kSecurity, options);
  ASSERT_EQ(files.count("secret.yaml"), 1u);
  const YAML::Node secret = YAML::Load(files.at("secret.yaml"));
  EXPECT_EQ(secret["kind"].as<std::string>(), "Secret");
  EXPECT_EQ(secret["metadata"]["name"].as<std::string>(), "headway-keys");
  EXPECT_EQ(secret["stringData"][kK8sSecretCoordinatorKey].as<std::string>(), "coordinator secret\n");
  EXPECT_EQ(secret["stringData"][kK8sSecretCoordinatorPublicKey].as<std::string>(),
            "coordinator public\n");
  EXPECT_EQ(secret["stringData"][kK8sSecretClientKey].as<std::string>(), "worker secret\n");
  EXPECT_EQ(secret["stringData"][kK8sSecretAuthorizedKeys].as<std::string>(), "public-key = \"w\"\n");
  Result<std::vector<RenderedFile>> rendered =
      RenderK8s(std::string(kMixed) + kSecurity, Parse(std::string(kMixed) + kSecurity), "", options);
  ASSERT_TRUE(rendered.ok());
  for (const RenderedFile& f : *rendered) EXPECT_EQ(f.secret, f.file_name == "secret.yaml") << f.file_name;

  // The pods' config names the mounted files.
  const Config pod = PodConfig(files);
  EXPECT_EQ(pod.security.coordinator_key, "/etc/headway-keys/coordinator.key_secret");
  EXPECT_EQ(pod.security.coordinator_public_key, "/etc/headway-keys/coordinator.key");
  EXPECT_EQ(pod.security.client_key, "/etc/headway-keys/client.key_secret");
  EXPECT_EQ(pod.security.authorized_keys, "/etc/headway-keys/authorized_keys");

  // Each pod mounts only the files its processes read, read-only, never
  // readable by others.
  const YAML::Node coordinator =
      YAML::Load(files.at("coordinator-deployment.yaml"))["spec"]["template"]["spec"];
  const YAML::Node worker =
      YAML::Load(files.at("lws-main.yaml"))["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"];
  for (const YAML::Node& spec : {coordinator, worker}) {
    const YAML::Node keys = Volume(spec, "keys");
    ASSERT_TRUE(keys);
    EXPECT_EQ(keys["secret"]["secretName"].as<std::string>(), "headway-keys");
    EXPECT_EQ(keys["secret"]["defaultMode"].as<int>() & 07, 0);
    bool mounted = false;
    for (const YAML::Node& m : spec["containers"][0]["volumeMounts"]) {
      if (m["name"].as<std::string>() != "keys") continue;
      mounted = true;
      EXPECT_EQ(m["mountPath"].as<std::string>(), kK8sKeyDir);
      EXPECT_TRUE(m["readOnly"].as<bool>());
    }
    EXPECT_TRUE(mounted);
  }
  EXPECT_EQ(ItemKeys(Volume(coordinator, "keys")),
            (std::vector<std::string>{kK8sSecretCoordinatorKey, kK8sSecretAuthorizedKeys}));
  EXPECT_EQ(ItemKeys(Volume(worker, "keys")),
            (std::vector<std::string>{kK8sSecretCoordinatorPublicKey, kK8sSecretClientKey}));
}

TEST(K8sManifestsTest, AnExistingSecretIsReferencedAndNoKeyMaterialIsWritten) {
  K8sOptions options;
  options.key_secret = "prod-headway-keys";
  options.key_files.client_key = "must not appear";
  const auto files = Render(std::string(kPd) + kSecurity, options);
  EXPECT_EQ(files.count("secret.yaml"), 0u);
  for (const auto& [name, text] : files) {
    EXPECT_EQ(text.find("must not appear"), std::string::npos) << name;
  }
  const YAML::Node ds = YAML::Load(files.at("disaggregatedset.yaml"));
  for (const YAML::Node& role : ds["spec"]["roles"]) {
    const YAML::Node keys =
        Volume(role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"], "keys");
    ASSERT_TRUE(keys);
    EXPECT_EQ(keys["secret"]["secretName"].as<std::string>(), "prod-headway-keys");
  }
  // Without keys, no Secret and no mount.
  const auto plain = Render(kPd, options);
  EXPECT_EQ(plain.count("secret.yaml"), 0u);
  EXPECT_FALSE(Volume(YAML::Load(plain.at("coordinator-deployment.yaml"))["spec"]["template"]["spec"],
                      "keys"));
}

TEST(K8sManifestsTest, RefusesWhatKubernetesCannotRunAsRendered) {
  struct Case {
    std::string yaml;
    K8sOptions options;
    std::string message;  // a part of the error
  };
  auto replaced = [](std::string yaml, const std::string& from, const std::string& to) {
    yaml.replace(yaml.find(from), from.size(), to);
    return yaml;
  };
  K8sOptions bad_name;
  bad_name.name = "Headway";
  K8sOptions long_name;
  long_name.name = std::string(60, 'h');
  K8sOptions bad_secret;
  bad_secret.key_secret = "Keys_1";
  const std::vector<Case> cases = {
      {replaced(kMixed, "tcp://10.1.1.1:6000", "ipc:///tmp/c"), {}, "over TCP"},
      {replaced(kMixed, "http_port: 8080", "http_port: 0"), {}, "http_port"},
      {replaced(kMixed, "hosts: [d, e, f]", "hosts: [d]"), {}, "pools[0].instances[1] differs"},
      {replaced(kMixed, "name: small", "name: Small"), {}, "pools[1].name"},
      {replaced(kMixed, "      - tp_size: 1\n", "      - tp_size: 1\n        device: cuda:1\n"),
       {}, "cuda:0"},
      {replaced(kPd, "hosts: [x]", "hosts: [x, y, z]"), {}, "pools[1].instances[0].hosts"},
      {kMixed, bad_name, "--name"},
      {kMixed, long_name, "longer than 63"},
      {std::string(kMixed) + kSecurity, bad_secret, "--key-secret"},
  };
  for (const Case& c : cases) {
    Result<Config> config = ParseConfig(c.yaml);
    ASSERT_TRUE(config.ok()) << config.status().message();
    Result<std::vector<RenderedFile>> files = RenderK8s(c.yaml, *config, "", c.options);
    ASSERT_FALSE(files.ok()) << c.message;
    EXPECT_EQ(files.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(files.status().message().find(c.message), std::string::npos)
        << files.status().message();
  }
}

TEST(K8sManifestsTest, LwsPodHostNamesLeaderAndWorkers) {
  EXPECT_EQ(LwsPodHost("hw-main", "ns", 2, 0), "hw-main-2.hw-main.ns");
  EXPECT_EQ(LwsPodHost("hw-main", "ns", 2, 1), "hw-main-2-1.hw-main.ns");
}

std::vector<std::string> Names(const std::vector<ProcessSpec>& specs) {
  std::vector<std::string> names;
  for (const ProcessSpec& s : specs) names.push_back(s.name);
  return names;
}

TEST(WorkersOfGroupMemberTest, PicksTheInstanceOfThePoolAndTheRankOfTheHost) {
  const Config config = Parse(kMixed);
  const std::vector<ProcessSpec> plan = PlanLaunch(config, LaunchOptions{});
  // Instance 1 of main is instance id 1; its host 2 runs rank 2.
  Result<std::vector<ProcessSpec>> member = WorkersOfGroupMember(config, plan, "main", 1, 2);
  ASSERT_TRUE(member.ok()) << member.status().message();
  EXPECT_EQ(Names(*member), std::vector<std::string>{"worker i1r2"});
  // Pool `small` starts at instance id 2.
  member = WorkersOfGroupMember(config, plan, "small", 0, 0);
  ASSERT_TRUE(member.ok());
  EXPECT_EQ(Names(*member), std::vector<std::string>{"worker i2r0"});

  const Config pd = Parse(kPd);
  const std::vector<ProcessSpec> pd_plan = PlanLaunch(pd, LaunchOptions{});
  member = WorkersOfGroupMember(pd, pd_plan, "decode", 0, 0);
  ASSERT_TRUE(member.ok());
  EXPECT_EQ(Names(*member),
            (std::vector<std::string>{"worker i2r0", "worker i2r1", "worker i2r2"}));
}

TEST(WorkersOfGroupMemberTest, OutOfRangeNamesTheRange) {
  const Config config = Parse(kMixed);
  const std::vector<ProcessSpec> plan = PlanLaunch(config, LaunchOptions{});
  Result<std::vector<ProcessSpec>> r = WorkersOfGroupMember(config, plan, "nope", 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pools: main, small"), std::string::npos);
  r = WorkersOfGroupMember(config, plan, "main", 2, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("(0 to 1)"), std::string::npos) << r.status().message();
  r = WorkersOfGroupMember(config, plan, "small", 0, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has 1 host (0 to 0)"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace headway::launcher
