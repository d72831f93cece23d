// Writes the binary seed inputs of the fuzz targets into
// <corpus dir>/{gguf,step_plan,control_message}/ (the text targets' seeds
// are written by hand). Run from the repository root after a normal build:
//   build/bin/headway-fuzz-seeds tests/fuzz/corpus
// Each seed is a valid input the target accepts far into its code; the
// fuzzer mutates from there.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/coordinator/fake_instances.h"
#include "tests/fuzz/control_codec.h"
#include "tests/fuzz/step_plan_codec.h"
#include "tests/support/gguf_writer.h"
#include "tests/worker/block_granter.h"

namespace {

using namespace headway;
namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
}

std::string ToString(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

void GgufSeeds(const fs::path& dir) {
  testing::GgufWriter kinds;
  kinds.AddString("general.architecture", "llama");
  kinds.AddString("general.name", "kinds");
  kinds.AddUInt32("llama.block_count", 1);
  kinds.AddInt32("i32", -5);
  kinds.AddUInt64("u64", 1ull << 40);
  kinds.AddFloat32("f32", 0.5f);
  kinds.AddBool("flag", true);
  kinds.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>"});
  kinds.AddInt32Array("tokenizer.ggml.token_type", {1, 1, 3});
  kinds.AddFloat32Array("tokenizer.ggml.scores", {0.0f, -1.0f, 0.0f});
  kinds.SetAlignment(32);
  (void)kinds.AddTensor("f32", {4}, GgmlType::kF32, {1, 2, 3, 4});
  (void)kinds.AddTensor("f16", {2, 2}, GgmlType::kF16, {1, 2, 3, 4});
  (void)kinds.AddTensor("q8_0", {32}, GgmlType::kQ8_0, std::vector<float>(32, 0.25f));
  Write(dir / "kinds.gguf", ToString(kinds.Serialize()));

  // A whole (tiny) model: LoadModelSpec, the tokenizer keys and
  // CheckModelTensors all accept it.
  testing::TinyLlamaOptions o;
  o.num_layers = 1;
  o.hidden_size = 32;
  o.num_heads = 2;
  o.num_kv_heads = 1;
  o.intermediate_size = 32;
  o.vocab_size = 8;
  o.context_length = 64;
  const fs::path model = dir / "tiny-llama.gguf";
  fs::create_directories(dir);
  const Status s = testing::WriteTinyLlama(model.string(), o);
  if (!s.ok()) std::fprintf(stderr, "tiny-llama: %s\n", s.ToString().c_str());
  std::printf("%s: %ju bytes\n", model.c_str(), uintmax_t(fs::file_size(model)));
}

std::string Plan(const proto::StepPlan& plan) {
  proto::Envelope env;
  *env.mutable_step_plan() = plan;
  return env.SerializeAsString();
}

void StepPlanSeeds(const fs::path& dir) {
  constexpr int kNumSlots = 2;  // step_plan_fuzz.cc's model: 2 layers x 1 KV head
  constexpr int kBlockSize = 4;
  {
    testing::BlockGranter g(kNumSlots, kBlockSize);
    proto::StepPlan p;
    p.set_step_id(1);
    g.AddStep(&p, 7, {1, 2, 3}, 0, true, true);
    Write(dir / "prefill.bin", Plan(p));
  }
  {
    // Prefill, two decode steps, release.
    testing::BlockGranter g(kNumSlots, kBlockSize);
    std::vector<std::string> plans;
    proto::StepPlan p;
    p.set_step_id(1);
    g.AddStep(&p, 7, {1, 2, 3, 4, 5}, 0, true, true);
    plans.push_back(Plan(p));
    for (uint32_t pos = 5; pos < 7; ++pos) {
      proto::StepPlan d;
      d.set_step_id(pos - 3);
      g.AddStep(&d, 7, {int32_t(pos)}, pos, false, true)->set_num_generated(pos - 4);
      plans.push_back(Plan(d));
    }
    proto::StepPlan r;
    r.set_step_id(4);
    r.add_released_seq_ids(7);
    plans.push_back(Plan(r));
    Write(dir / "prefill-decode-release.bin", fuzz::JoinMessages(plans));
  }
  {
    // Two sequences, one chunked, sampled with temperature, top-k/p, seed
    // and logprobs.
    testing::BlockGranter g(kNumSlots, kBlockSize);
    std::vector<std::string> plans;
    proto::StepPlan p;
    p.set_step_id(10);
    proto::SequenceStep* a = g.AddStep(&p, 1, {4, 5, 6, 7, 8, 9}, 0, true, false);
    (void)a;
    proto::SequenceStep* b = g.AddStep(&p, 2, {10, 11}, 0, true, true);
    proto::SamplingParams* sp = b->mutable_sampling();
    sp->set_temperature(0.8f);
    sp->set_top_p(0.9f);
    sp->set_top_k(5);
    sp->set_seed(42);
    sp->set_has_seed(true);
    sp->set_num_logprobs(3);
    sp->set_logprobs(true);
    plans.push_back(Plan(p));
    proto::StepPlan q;
    q.set_step_id(11);
    g.AddStep(&q, 1, {12, 13}, 6, false, true);
    plans.push_back(Plan(q));
    Write(dir / "batch-chunked-sampling.bin", fuzz::JoinMessages(plans));
  }
}

std::string Env(const proto::Envelope& env) { return env.SerializeAsString(); }

void ControlSeeds(const fs::path& dir) {
  const ModelSpec spec = fuzz::ControlWorldSpec();
  Result<Config> config = ParseConfig(fuzz::ControlWorldConfig());
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", config.status().ToString().c_str());
    std::exit(1);
  }
  auto reg = [&](int instance, int rank, int tp) {
    proto::Envelope env;
    *env.mutable_register_request() = testing::FakeRegistration(
        spec, instance, rank, tp, fuzz::kControlWorldBlockSize, 64, config->KvTransferEnabled());
    return fuzz::ControlRecord{0, PeerName(instance, rank), Env(env)};
  };
  std::vector<fuzz::ControlRecord> all = {reg(0, 0, 1), reg(1, 0, 2), reg(1, 1, 2)};

  // A request through prefill, KV transfer and decode.
  std::vector<fuzz::ControlRecord> serve = all;
  proto::Envelope heartbeat;
  heartbeat.mutable_heartbeat()->set_sent_unix_ms(1);
  serve.push_back({fuzz::kRecordSubmitRequest, "i0r0", Env(heartbeat)});
  proto::Envelope prefill_done;
  prefill_done.mutable_step_result()->set_tp_rank(0);
  serve.push_back({fuzz::kRecordAnswerLastPlan, "i0r0", Env(prefill_done)});
  proto::Envelope transferred;
  transferred.mutable_transfer_result()->set_tp_rank(0);
  transferred.mutable_transfer_result()->set_bytes(4096);
  transferred.mutable_transfer_result()->set_blocks(8);
  serve.push_back({fuzz::kRecordAnswerLastPlan, "i0r0", Env(transferred)});
  for (int step = 0; step < 3; ++step) {
    proto::Envelope r0;
    proto::SampledToken* t = r0.mutable_step_result()->add_tokens();
    t->set_seq_id(1);
    t->set_token_id(98 + step);
    t->set_logprob(-0.5f);
    serve.push_back({fuzz::kRecordAnswerLastPlan, "i1r0", Env(r0)});
    proto::Envelope r1;
    r1.mutable_step_result()->set_tp_rank(1);
    serve.push_back({fuzz::kRecordAnswerLastPlan, "i1r1", Env(r1)});
  }
  Write(dir / "serve-pd.bin", fuzz::EncodeRecords(serve));

  // The ranks' rendezvous store, then a drain and a disconnect.
  std::vector<fuzz::ControlRecord> store;
  proto::Envelope set;
  set.mutable_store_set()->set_key("gloo/1/0");
  set.mutable_store_set()->set_value("addr");
  store.push_back({0, "i1r0", Env(set)});
  proto::Envelope get;
  get.mutable_store_get()->set_key("gloo/1/0");
  store.push_back({0, "i1r1", Env(get)});
  for (const fuzz::ControlRecord& r : all) store.push_back(r);
  proto::Envelope drain;
  drain.mutable_drain_request()->set_reason("maintenance");
  store.push_back({fuzz::kRecordSubmitRequest, "i1r0", Env(drain)});
  store.push_back({fuzz::kRecordDisconnect, "i1r1", ""});
  store.push_back({0, "i1r1", Env(heartbeat)});
  Write(dir / "store-drain-disconnect.bin", fuzz::EncodeRecords(store));

  // Garbage: a binary identity, an unparsable payload, an impostor
  // registering twice, a result from nobody.
  std::vector<fuzz::ControlRecord> garbage = {
      {0, std::string("\x00\x01\xff", 3), Env(heartbeat)},
      {0, "i0r0", "\x0a\xff\xff"},
      reg(0, 0, 1),
      reg(0, 0, 1),
      {0, "i9r9", Env(prefill_done)},
  };
  Write(dir / "garbage.bin", fuzz::EncodeRecords(garbage));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir, e.g. tests/fuzz/corpus>\n", argv[0]);
    return 2;
  }
  const fs::path corpus(argv[1]);
  GgufSeeds(corpus / "gguf");
  StepPlanSeeds(corpus / "step_plan");
  ControlSeeds(corpus / "control_message");
  return 0;
}
