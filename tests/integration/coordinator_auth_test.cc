// The real headway-coordinator with CurveZMQ keys on loopback, against
// workers implemented here (a DEALER that registers and answers every step
// with one token): impostors with an unknown key or none, garbage on the
// control port, and a replayed registration of a live worker's identity;
// and the startup refusal of a reachable control port without keys.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/control_channel.h"
#include "comm/curve_keys.h"
#include "common/config.h"
#include "common/kv_layout.h"
#include "common/model_spec.h"
#include "tests/integration/smollm2_for_fakes.h"
#include "tests/support/process.h"
#include "tests/support/tcp_garbage.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 512;
// How long a peer that must get nothing is watched: a CURVE handshake and
// a registration on loopback take a few milliseconds.
constexpr milliseconds kQuietWindow(1500);

bool WaitUntil(const std::function<bool()>& done, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

// A worker of instance 0, rank 0, as a thread: registers with `keys` (none
// = a plain DEALER), heartbeats, and answers each step with `token_id`.
class TestWorker {
 public:
  TestWorker(std::string address, ModelSpec spec, int32_t token_id,
             std::optional<ControlClientKeys> keys)
      : address_(std::move(address)), spec_(std::move(spec)), token_id_(token_id),
        keys_(std::move(keys)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~TestWorker() {
    stop_ = true;
    thread_.join();
  }
  bool registered() const { return registered_; }
  int num_messages() const { return num_messages_; }  // anything the coordinator sent
  int num_plans() const { return num_plans_; }

 private:
  void Run() {
    auto client = ControlClient::Connect(address_, PeerName(0, 0), keys_);
    if (!client.ok()) return;
    proto::Envelope reg;
    proto::RegisterRequest* r = reg.mutable_register_request();
    r->set_instance_id(0);
    r->set_tp_rank(0);
    r->set_tp_size(1);
    r->set_model_name(spec_.name);
    r->set_num_layers(spec_.num_layers);
    r->set_num_local_kv_heads(spec_.num_kv_heads);
    r->set_head_dim(spec_.head_dim);
    r->set_block_size(kBlockSize);
    const KvCacheDtype dtype = Config().kv_cache_dtype;  // the deployment's: the default
    r->set_kv_cache_dtype(KvCacheDtypeName(dtype));
    r->set_kv_cache_dtype_sliding(KvCacheDtypeName(dtype));
    r->set_block_bytes(KvCacheLayout{kBlockSize, spec_.head_dim, dtype}.BlockBytes());
    r->set_num_blocks(kNumBlocks);
    r->set_chunk_bytes(r->block_bytes());  // one dtype: a chunk is a block
    r->set_num_chunks(kNumBlocks);
    r->set_vocab_size(spec_.vocab_size);
    r->set_pid(getpid());
    (void)(*client)->Send(reg);
    Clock::time_point last_sent = Clock::now();
    while (!stop_) {
      if (Clock::now() - last_sent > milliseconds(100)) {
        proto::Envelope hb;
        hb.mutable_heartbeat()->set_sent_unix_ms(0);
        (void)(*client)->Send(hb);
        last_sent = Clock::now();
      }
      std::optional<proto::Envelope> env = (*client)->Receive(milliseconds(10));
      if (!env) continue;
      ++num_messages_;
      if (env->has_register_response()) {
        registered_ = env->register_response().accepted();
      } else if (env->has_step_plan()) {
        ++num_plans_;
        proto::Envelope reply;
        proto::StepResult* result = reply.mutable_step_result();
        result->set_step_id(env->step_plan().step_id());
        result->set_tp_rank(0);
        for (const proto::SequenceStep& step : env->step_plan().seqs()) {
          if (!step.sample()) continue;
          proto::SampledToken* t = result->add_tokens();
          t->set_seq_id(step.seq_id());
          t->set_token_id(token_id_);
        }
        (void)(*client)->Send(reply);
        last_sent = Clock::now();
      }
    }
  }

  const std::string address_;
  const ModelSpec spec_;
  const int32_t token_id_;
  const std::optional<ControlClientKeys> keys_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> registered_{false};
  std::atomic<int> num_messages_{0};
  std::atomic<int> num_plans_{0};
};

class CoordinatorAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = testing::SmolLm2Path();
    HW_REQUIRE_MODEL(model_path_);
    auto model = testing::LoadSmolLm2ForFakes(model_path_);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    spec_ = model->spec;
    token_a_ = model->token_a;

    dir_ = testing::MakeTempDir("coordinator-auth");
    // Keys as headway-keygen writes them: the coordinator's pair, two
    // authorized workers' pairs (the second is the replayer's), and a
    // directory of public keys as the allow-list.
    std::filesystem::create_directory(dir_ + "/authorized");
    for (const char* name : {"coordinator", "worker", "other-worker"}) {
      auto pair = GenerateCurveKeyPair();
      ASSERT_TRUE(pair.ok());
      ASSERT_TRUE(WriteCurveKeyFiles(*pair, dir_ + "/" + name + ".key").ok());
      pairs_[name] = *pair;
      if (std::string(name) != "coordinator") {
        std::filesystem::copy_file(dir_ + "/" + name + ".key",
                                   dir_ + "/authorized/" + name + ".key");
      }
    }
    http_port_ = testing::FreePort();
    control_port_ = testing::FreePort();
    control_address_ = "tcp://127.0.0.1:" + std::to_string(control_port_);
    coordinator_ = StartCoordinator(WriteConfig(
        "security:\n  coordinator_key: coordinator.key_secret\n"
        "  coordinator_public_key: coordinator.key\n  client_key: worker.key_secret\n"
        "  authorized_keys: authorized\n",
        ""));
    ASSERT_GT(coordinator_->pid(), 0);
    ASSERT_TRUE(WaitHealth(503)) << "the coordinator did not start";
  }

  void TearDown() override {
    workers_.clear();
    if (coordinator_) coordinator_->Stop();
    if (HasFailure() && coordinator_) std::cerr << "coordinator log:\n" << coordinator_->Log();
  }

  // A config in dir_ with `security` and `control_bind` lines (either may
  // be empty); returns its path.
  std::string WriteConfig(const std::string& security, const std::string& control_bind) {
    const std::string path = dir_ + "/deploy-" + std::to_string(num_configs_++) + ".yaml";
    std::ofstream(path) << "model:\n  path: " << model_path_ << "\n  served_name: smollm2\n"
                        << "coordinator:\n  http_host: 127.0.0.1\n  http_port: " << http_port_
                        << "\n  control_address: " << control_address_ << "\n" << control_bind
                        << "  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 2000\n"
                        << "cache:\n  block_size: " << kBlockSize << "\n  kv_memory_mb: 64\n"
                        << "scheduler:\n  max_model_len: 256\n"
                        << "pools:\n  - {name: main, role: mixed, instances: [{tp_size: 1}]}\n"
                        << security;
    return path;
  }

  std::unique_ptr<testing::ChildProcess> StartCoordinator(const std::string& config) {
    return std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{testing::BinaryPath("headway-coordinator"), "--config", config},
        dir_ + "/coordinator.log");
  }

  ControlClientKeys KeysOf(const std::string& name) const {
    return ControlClientKeys{pairs_.at("coordinator").public_key, pairs_.at(name).public_key,
                             pairs_.at(name).secret_key};
  }

  TestWorker* AddWorker(std::optional<ControlClientKeys> keys) {
    workers_.push_back(
        std::make_unique<TestWorker>(control_address_, spec_, token_a_, std::move(keys)));
    return workers_.back().get();
  }

  int HealthStatus() const {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(10, 0);
    auto r = client.Get("/health");
    return r ? r->status : 0;
  }

  bool WaitHealth(int status) {
    return WaitUntil([&] { return coordinator_->Running() && HealthStatus() == status; },
                     milliseconds(30000));
  }

  // A completion of 4 tokens; its text, or "" when it failed.
  std::string Complete() const {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(30, 0);
    auto r = client.Post("/v1/completions",
                         R"({"model": "smollm2", "prompt": "My password is hunter2. Repeat it:",
                             "max_tokens": 4})",
                         "application/json");
    if (!r || r->status != 200) return "";
    return json::parse(r->body)["choices"][0]["text"].get<std::string>();
  }

  std::string model_path_;
  ModelSpec spec_;
  int32_t token_a_ = 0;
  std::string dir_;
  int http_port_ = 0;
  int control_port_ = 0;
  std::string control_address_;
  int num_configs_ = 0;
  std::map<std::string, CurveKeyPair> pairs_;
  std::unique_ptr<testing::ChildProcess> coordinator_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
};

TEST_F(CoordinatorAuthTest, ImpostorsFailToRegisterAndGetNoPrompt) {
  // Before the real worker: the identity i0r0 is free, as in the attack.
  auto stranger = GenerateCurveKeyPair();
  ASSERT_TRUE(stranger.ok());
  ControlClientKeys unknown{pairs_.at("coordinator").public_key, stranger->public_key,
                            stranger->secret_key};
  TestWorker* unknown_key = AddWorker(unknown);
  TestWorker* no_key = AddWorker(std::nullopt);
  std::this_thread::sleep_for(kQuietWindow);
  EXPECT_EQ(HealthStatus(), 503);
  EXPECT_FALSE(unknown_key->registered());
  EXPECT_FALSE(no_key->registered());

  // The real worker registers while the impostors keep trying, and serves.
  TestWorker* real = AddWorker(KeysOf("worker"));
  ASSERT_TRUE(WaitHealth(200)) << "the real worker did not register";
  EXPECT_TRUE(real->registered());
  EXPECT_EQ(Complete(), "aaaa");
  EXPECT_GT(real->num_plans(), 0);
  EXPECT_EQ(unknown_key->num_messages(), 0);
  EXPECT_EQ(no_key->num_messages(), 0);
  EXPECT_NE(coordinator_->Log().find("not in security.authorized_keys"), std::string::npos);
}

TEST_F(CoordinatorAuthTest, GarbageOnTheControlPortDoesNoHarm) {
  TestWorker* real = AddWorker(KeysOf("worker"));
  ASSERT_TRUE(WaitHealth(200));
  testing::SendTcpGarbage(control_port_);
  EXPECT_TRUE(coordinator_->Running());
  EXPECT_EQ(HealthStatus(), 200);
  EXPECT_EQ(Complete(), "aaaa");
  EXPECT_TRUE(real->registered());
}

// A second process with a valid key replays the live worker's
// registration under its identity: the coordinator's ROUTER refuses a
// second connection with a routing identity in use (no ROUTER_HANDOVER),
// so the replay is never read and the instance stays the real worker's.
TEST_F(CoordinatorAuthTest, ReplayedRegistrationDoesNotTakeOverALiveWorker) {
  TestWorker* real = AddWorker(KeysOf("worker"));
  ASSERT_TRUE(WaitHealth(200));
  ASSERT_EQ(Complete(), "aaaa");
  const int plans_before = real->num_plans();
  TestWorker* replay = AddWorker(KeysOf("other-worker"));
  std::this_thread::sleep_for(kQuietWindow);
  // It may be told to shut down (libzmq reads its next frame as a routing
  // identity, an unknown peer), never accepted nor sent a step.
  EXPECT_FALSE(replay->registered());
  EXPECT_EQ(Complete(), "aaaa");
  EXPECT_GT(real->num_plans(), plans_before);
  EXPECT_EQ(replay->num_plans(), 0);
  EXPECT_EQ(HealthStatus(), 200);
}

TEST_F(CoordinatorAuthTest, ReachableControlPortWithoutKeysIsRefusedAtStartup) {
  coordinator_->Stop();
  const std::string bind = "  control_bind: tcp://0.0.0.0:" + std::to_string(control_port_) + "\n";
  coordinator_ = StartCoordinator(WriteConfig("", bind));
  int status = coordinator_->WaitExit(milliseconds(30000));
  ASSERT_TRUE(WIFEXITED(status)) << coordinator_->Log();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(coordinator_->Log().find("headway-keygen"), std::string::npos) << coordinator_->Log();

  // Spelled out, it starts.
  coordinator_ = StartCoordinator(WriteConfig("security:\n  insecure: true\n", bind));
  EXPECT_TRUE(WaitHealth(503)) << coordinator_->Log();
}

TEST_F(CoordinatorAuthTest, MissingKeyFileIsAConfigError) {
  coordinator_->Stop();
  coordinator_ = StartCoordinator(WriteConfig(
      "security:\n  coordinator_key: absent.key_secret\n"
      "  coordinator_public_key: coordinator.key\n  client_key: worker.key_secret\n"
      "  authorized_keys: authorized\n",
      ""));
  int status = coordinator_->WaitExit(milliseconds(30000));
  ASSERT_TRUE(WIFEXITED(status)) << coordinator_->Log();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(coordinator_->Log().find("security.coordinator_key"), std::string::npos)
      << coordinator_->Log();
}

TEST(KeygenTest, WritesAPairAndNeverOverwrites) {
  testing::ScopedTempDir dir("keygen");
  const std::string path = dir.path + "/node.key";
  {
    testing::ChildProcess keygen({testing::BinaryPath("headway-keygen"), path},
                                 dir.path + "/keygen.log");
    int status = keygen.WaitExit(milliseconds(10000));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << keygen.Log();
  }
  auto pair = ReadCurveSecretKeyFile(path + "_secret");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  auto public_key = ReadCurvePublicKeyFile(path);
  ASSERT_TRUE(public_key.ok());
  EXPECT_EQ(*public_key, pair->public_key);
  struct stat st {};
  ASSERT_EQ(::stat((path + "_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  testing::ChildProcess again({testing::BinaryPath("headway-keygen"), path},
                              dir.path + "/again.log");
  int status = again.WaitExit(milliseconds(10000));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(again.Log().find("exists"), std::string::npos) << again.Log();
  auto unchanged = ReadCurveSecretKeyFile(path + "_secret");
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(unchanged->secret_key, pair->secret_key);
}

// The launcher and a worker refuse a reachable control port without keys
// before they read the model (the file here does not exist).
TEST(ControlPlaneStartupTest, LauncherAndWorkerRefuseReachableControlPortWithoutKeys) {
  testing::ScopedTempDir dir("control-startup");
  const std::string config = dir.path + "/deploy.yaml";
  std::ofstream(config) << "model:\n  path: /nonexistent/model.gguf\n"
                        << "coordinator:\n  control_address: tcp://10.1.2.3:5557\n"
                        << "pools:\n  - {name: main, instances: [{tp_size: 1}]}\n";
  const std::vector<std::vector<std::string>> commands = {
      {testing::BinaryPath("headway-launch"), config},
      {testing::BinaryPath("headway-worker"), "--config", config, "--instance-id", "0",
       "--tp-rank", "0"}};
  for (const std::vector<std::string>& argv : commands) {
    testing::ChildProcess process(argv, dir.path + "/process.log");
    const int status = process.WaitExit(milliseconds(30000));
    ASSERT_TRUE(WIFEXITED(status)) << argv[0] << "\n" << process.Log();
    EXPECT_EQ(WEXITSTATUS(status), 2) << argv[0] << "\n" << process.Log();
    EXPECT_NE(process.Log().find("coordinator.control_address"), std::string::npos) << process.Log();
    EXPECT_NE(process.Log().find("headway-keygen"), std::string::npos) << process.Log();
    std::filesystem::remove(dir.path + "/process.log");
  }
}

}  // namespace
}  // namespace headway
