// The coordinator's handling of arbitrary control messages: each record's
// frames (control_codec.h) go through DecodeInbound, the checks every
// message received on the control socket passes, and what it admits
// reaches a real Engine (control_codec.h) through a ControlServer that plays the records one
// engine-loop iteration apart (so that plans sent in reply to one message
// precede the next). Reaches registration (and its refusals), the ranks'
// rendezvous store, heartbeats, step results for the request in flight, KV
// transfer results, drains and disconnects; the Engine then stops, failing
// what is left. Any input must leave the coordinator running: no crash, no
// sanitizer report, no hang.
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/control_channel.h"
#include "common/config.h"
#include "coordinator/engine/engine.h"
#include "tests/coordinator/tiny_vocab.h"
#include "tests/fuzz/control_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;

class ScriptedServer final : public ControlServer {
 public:
  explicit ScriptedServer(std::vector<fuzz::ControlRecord> records)
      : records_(records.begin(), records.end()) {}

  Status Send(const std::string& peer, const proto::Envelope& envelope) override {
    if (envelope.has_step_plan()) last_step_id_[peer] = envelope.step_plan().step_id();
    if (envelope.has_transfer_plan()) {
      last_transfer_id_[peer] = envelope.transfer_plan().transfer_id();
    }
    return Status::Ok();
  }

  // One message per engine-loop iteration: a message, then nothing.
  std::optional<Inbound> Receive(std::chrono::milliseconds) override {
    if (paused_) {
      paused_ = false;
      return std::nullopt;
    }
    while (!records_.empty()) {
      fuzz::ControlRecord r = std::move(records_.front());
      records_.pop_front();
      std::optional<Inbound> in = Decode(r);
      if (!in) continue;  // dropped, as ReadEnvelope drops it
      paused_ = true;
      return in;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    return std::nullopt;
  }

  void set_engine(Engine* engine) { engine_ = engine; }

  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  std::optional<Inbound> Decode(fuzz::ControlRecord& r) {
    if (r.flags & fuzz::kRecordSubmitRequest) {
      EngineRequest request;
      for (int i = 0; i < 10; ++i) request.prompt_ids.push_back(97 + i);  // "abcdefghij"
      request.max_tokens = 3;
      (void)engine_->Submit(std::move(request));
    }
    if (r.flags & fuzz::kRecordDisconnect) {
      Inbound in;
      in.kind = Inbound::Kind::kDisconnected;
      in.peer = r.identity;
      return in;
    }
    if (r.flags & fuzz::kRecordAnswerLastPlan) {
      proto::Envelope env;
      if (env.ParseFromString(r.payload)) {
        if (env.has_step_result() && last_step_id_.count(r.identity)) {
          env.mutable_step_result()->set_step_id(last_step_id_[r.identity]);
        }
        if (env.has_transfer_result() && last_transfer_id_.count(r.identity)) {
          env.mutable_transfer_result()->set_transfer_id(last_transfer_id_[r.identity]);
        }
        r.payload = env.SerializeAsString();
      }
    }
    Result<Inbound> in = DecodeInbound(r.identity, r.payload, /*routed=*/true);
    if (!in.ok()) {
      FUZZ_CHECK(in.status().code() == StatusCode::kInvalidArgument, in.status().ToString());
      for (unsigned char c : in.status().message()) {
        FUZZ_CHECK(c >= 0x20 && c < 0x7f, "a control byte in a log line");
      }
      return std::nullopt;
    }
    return std::move(*in);
  }

  Engine* engine_ = nullptr;  // set before the engine starts
  // Engine thread only.
  std::deque<fuzz::ControlRecord> records_;
  bool paused_ = false;
  std::map<std::string, uint64_t> last_step_id_;
  std::map<std::string, uint64_t> last_transfer_id_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
};

const Config* config = nullptr;
const Tokenizer* tokenizer = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  Result<Config> c = ParseConfig(fuzz::ControlWorldConfig());
  FUZZ_CHECK(c.ok(), c.status().ToString());
  config = new Config(std::move(*c));
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(testing::TinyVocab());
  FUZZ_CHECK(t.ok(), t.status().ToString());
  tokenizer = t->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto server = std::make_unique<ScriptedServer>(
      fuzz::DecodeRecords(std::string_view(reinterpret_cast<const char*>(data), size)));
  ScriptedServer* script = server.get();
  Engine engine(*config, fuzz::ControlWorldSpec(), tokenizer, std::move(server));
  script->set_engine(&engine);
  engine.Start();
  script->WaitDone();
  engine.Stop("fuzz input played");
  return 0;
}
