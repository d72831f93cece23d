// The worker's handling of arbitrary StepPlan bytes: each message parsed as
// the proto::Envelope the worker's control socket receives and, when it
// holds a StepPlan, validated and run by a StepExecutor (worker_loop.cc does
// exactly this) on a tiny random llama (2 layers, 50 tokens; no model
// file). Several plans per input (step_plan_codec.h) reach decode steps,
// deltas on existing sequences and releases. A rejected plan must change
// nothing; an accepted one must answer every sampled sequence with a token
// of the vocabulary.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "proto/control.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/step_plan_codec.h"
#include "worker/decoder_model.h"
#include "worker/kv_pool.h"
#include "worker/model_weights.h"
#include "worker/step_executor.h"

namespace {

using namespace headway;

constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 64;

ModelSpec TinySpec() {
  ModelSpec spec;
  spec.name = "tiny";
  spec.architecture = "llama";
  spec.num_layers = 2;
  spec.hidden_size = 32;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 16;
  spec.intermediate_size = 32;
  spec.vocab_size = 50;
  spec.context_length = 64;
  spec.rope_freq_base = 10000.0f;
  spec.tied_embeddings = true;
  spec.slot_specs.assign(size_t(spec.num_layers * spec.num_kv_heads), SlotSpec{});
  return spec;
}

DecoderModel* model = nullptr;
KvPool* pool = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const ModelSpec spec = TinySpec();
  TpShard shard;
  shard.kv_head_end = spec.num_kv_heads;
  shard.q_head_end = spec.num_heads;
  shard.intermediate_end = spec.intermediate_size;
  shard.padded_vocab_size = shard.vocab_end = spec.vocab_size;
  Result<std::unique_ptr<DecoderModel>> m =
      DecoderModel::Create(spec, ModelWeights::TEST_Random(spec, shard, 7, 0.2f));
  FUZZ_CHECK(m.ok(), m.status().ToString());
  model = m->release();
  const KvCacheLayout layout{kBlockSize, spec.head_dim};
  Result<std::unique_ptr<KvPool>> p = KvPool::Create(layout, int64_t(kNumBlocks) * layout.BlockBytes());
  FUZZ_CHECK(p.ok(), p.status().ToString());
  pool = p->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StepExecutorOptions options;
  options.max_tokens_per_step = 32;
  options.seed_base = 1;
  StepExecutor executor(model, pool, options);
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (std::string_view bytes : fuzz::SplitMessages(input)) {
    proto::Envelope envelope;
    if (!envelope.ParseFromArray(bytes.data(), int(bytes.size())) || !envelope.has_step_plan()) {
      continue;
    }
    const proto::StepPlan& plan = envelope.step_plan();
    const std::optional<uint64_t> last_step = executor.last_step_id();
    const size_t num_sequences = executor.num_sequences();
    const proto::StepResult result = executor.Execute(plan);
    FUZZ_CHECK(!result.fatal(), result.error());
    FUZZ_CHECK(result.step_id() == plan.step_id(), "the result names another step");
    if (!result.error().empty()) {
      FUZZ_CHECK(executor.last_step_id() == last_step && executor.num_sequences() == num_sequences,
                 "a rejected plan changed the executor: " + result.error());
      continue;
    }
    FUZZ_CHECK(executor.last_step_id() == plan.step_id(), "last_step_id not advanced");
    int num_sampled = 0;
    for (const proto::SequenceStep& s : plan.seqs()) num_sampled += s.sample() ? 1 : 0;
    FUZZ_CHECK(result.tokens_size() == num_sampled,
               std::to_string(result.tokens_size()) + " tokens for " +
                   std::to_string(num_sampled) + " sampled sequences");
    for (const proto::SampledToken& t : result.tokens()) {
      FUZZ_CHECK(t.token_id() >= 0 && t.token_id() < model->spec().vocab_size,
                 "token " + std::to_string(t.token_id()));
    }
  }
  return 0;
}
