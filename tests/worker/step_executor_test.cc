// StepExecutor on a tiny random llama (no model file): plan validation
// (every rejected plan leaves the state unchanged), delta application,
// release, and that batching and chunking do not change greedy tokens.
#include "tests/worker/block_granter.h"
#include "worker/decoder_model.h"
#include "worker/step_executor.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include <gtest/gtest.h>

namespace headway {
namespace {

constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 256;

ModelSpec TinySpec() {
  ModelSpec spec;
  spec.name = "tiny";
  spec.architecture = "llama";
  spec.num_layers = 2;
  spec.hidden_size = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.intermediate_size = 96;
  spec.vocab_size = 50;
  spec.context_length = 128;
  spec.rope_freq_base = 10000.0f;
  spec.tied_embeddings = true;
  spec.slot_specs.assign(spec.num_layers * spec.num_kv_heads, SlotSpec{});
  return spec;
}

TpShard FullShard(const ModelSpec& spec) {
  TpShard s;
  s.kv_head_end = spec.num_kv_heads;
  s.q_head_end = spec.num_heads;
  s.intermediate_end = spec.intermediate_size;
  s.padded_vocab_size = s.vocab_end = spec.vocab_size;
  return s;
}

// The CPU model, made to pick greedy rows itself as a GPU model does
// (ForwardModel::device_picks), with cpu::Sample; the logits of every row it
// picked are replaced by a row that would sample token 0, so a result taken
// from them instead of the pick shows.
class PickingModel final : public ForwardModel {
 public:
  explicit PickingModel(ForwardModel* inner) : inner_(inner) {}
  const ModelSpec& spec() const override { return inner_->spec(); }
  const TpShard& shard() const override { return inner_->shard(); }
  const SlotSpec& slot_spec(int slot) const override { return inner_->slot_spec(slot); }
  double collective_seconds() const override { return 0.0; }
  const std::vector<SampleResult>* device_picks() const override { return &picks_; }
  // Logit rows per Forward, as a GPU model's buffers bound them.
  int max_logit_rows() const override { return max_logit_rows_; }
  void set_max_logit_rows(int n) { max_logit_rows_ = n; }

  Status Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits) override {
    HW_RETURN_IF_ERROR(inner_->Forward(batch, pool, logits));
    const int vocab = spec().vocab_size;
    picks_.assign(size_t(batch.num_logit_rows), SampleResult{});
    for (int i = 0; i < batch.num_logit_rows; ++i) {
      seen_.push_back(batch.greedy_picks != nullptr ? batch.greedy_picks[i] : -2);
      if (batch.greedy_picks == nullptr || batch.greedy_picks[i] < 0) continue;
      float* row = logits->data() + size_t(i) * vocab;
      picks_[i] = cpu::Sample(row, vocab, SamplingConfig{}, 0.0, batch.greedy_picks[i]);
      std::fill(row, row + vocab, -std::numeric_limits<float>::infinity());
      row[0] = 0.0f;
    }
    return Status::Ok();
  }

  // greedy_picks of every logit row seen, in order (-2: none passed).
  const std::vector<int32_t>& seen() const { return seen_; }

 private:
  ForwardModel* const inner_;
  std::vector<SampleResult> picks_;
  std::vector<int32_t> seen_;
  int max_logit_rows_ = std::numeric_limits<int>::max();
};

// A model, a pool, an executor, and a trivial allocator that hands every
// slot fresh blocks as sequences grow. With `picking`, the executor runs the
// model through a PickingModel; `max_prompt_rows` > 0 lowers the executor's
// bound on prompt logprob rows per step.
class Harness {
 public:
  explicit Harness(bool picking = false, int max_prompt_rows = 0) {
    const ModelSpec spec = TinySpec();
    model_ = std::move(DecoderModel::Create(
                           spec, ModelWeights::TEST_Random(spec, FullShard(spec), 7, 0.2f)))
                 .value();
    pool_ = std::move(KvPool::Create({kBlockSize, spec.head_dim},
                                     int64_t(kNumBlocks) * 2 * kBlockSize * spec.head_dim * 4))
                .value();
    StepExecutorOptions options;
    options.max_tokens_per_step = 64;
    options.seed_base = 1;
    options.max_prompt_logprob_rows = max_prompt_rows;
    if (picking) picking_ = std::make_unique<PickingModel>(model_.get());
    ForwardModel* runs = picking ? static_cast<ForwardModel*>(picking_.get()) : model_.get();
    executor_ = std::make_unique<StepExecutor>(runs, pool_.get(), options);
    granter_.emplace(model_->num_slots(), kBlockSize);
  }

  // Adds `tokens` of `seq_id` at `start_pos` to `plan`, with deltas giving
  // every slot the blocks the new positions need.
  proto::SequenceStep* Add(proto::StepPlan* plan, uint64_t seq_id, std::vector<int32_t> tokens,
                           uint32_t start_pos, bool is_new, bool sample = true) {
    return granter_->AddStep(plan, seq_id, tokens, start_pos, is_new, sample);
  }

  proto::StepResult Run(const proto::StepPlan& plan) { return executor_->Execute(plan); }
  StepExecutor& executor() { return *executor_; }
  DecoderModel& model() { return *model_; }
  const PickingModel* picking() const { return picking_.get(); }
  PickingModel* picking() { return picking_.get(); }

 private:
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<PickingModel> picking_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<StepExecutor> executor_;
  std::optional<testing::BlockGranter> granter_;  // set once the model exists
};

// Everything an executor remembers, for before/after comparison.
struct Snapshot {
  std::optional<uint64_t> last_step_id;
  std::map<uint64_t, std::pair<int64_t, std::vector<std::vector<int32_t>>>> seqs;
  bool operator==(const Snapshot&) const = default;
};

Snapshot Take(const StepExecutor& e, std::vector<uint64_t> ids) {
  Snapshot s;
  s.last_step_id = e.last_step_id();
  for (uint64_t id : ids) {
    if (const SequenceState* st = e.FindSequence(id)) {
      s.seqs[id] = {st->num_computed, st->block_rows};
    }
  }
  return s;
}

// A harness with seq 1 prefilled (positions [0, 5)) at step 1.
class ExecutorValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    proto::StepPlan plan;
    plan.set_step_id(1);
    h_.Add(&plan, 1, {1, 2, 3, 4, 5}, 0, true);
    ASSERT_EQ(h_.Run(plan).error(), "");
    before_ = Take(h_.executor(), {1, 2});
  }

  // Runs `plan`, expects an error containing `needle` and no state change.
  void ExpectRejected(const proto::StepPlan& plan, const std::string& needle) {
    proto::StepResult r = h_.Run(plan);
    EXPECT_NE(r.error().find(needle), std::string::npos) << "error: " << r.error();
    EXPECT_EQ(r.tokens_size(), 0);
    EXPECT_TRUE(Take(h_.executor(), {1, 2}) == before_) << "state changed by: " << r.error();
  }

  Harness h_;
  Snapshot before_;
};

TEST_F(ExecutorValidationTest, StepIdMustIncrease) {
  proto::StepPlan plan;
  plan.set_step_id(1);
  h_.Add(&plan, 1, {6}, 5, false);
  ExpectRejected(plan, "step_id 1 is not greater");
}

TEST_F(ExecutorValidationTest, UnknownSeqWithoutIsNew) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 2, {6}, 0, false);
  ExpectRejected(plan, "seq 2 is unknown");
}

TEST_F(ExecutorValidationTest, IsNewForExistingSeq) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 1, {6}, 5, true);
  ExpectRejected(plan, "already exists");
}

TEST_F(ExecutorValidationTest, StartPosMustEqualComputedPositions) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 1, {6}, 4, false);
  ExpectRejected(plan, "start_pos 4 != positions computed 5");
}

TEST_F(ExecutorValidationTest, BlockIdOutOfRange) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  proto::SequenceStep* s = h_.Add(&plan, 1, {6}, 5, false);
  proto::SlotDelta* d = s->add_deltas();
  d->set_slot(0);
  d->set_first_logical(2);
  d->add_appended(kNumBlocks);
  ExpectRejected(plan, "block id 256 out of [0, 256)");
}

TEST_F(ExecutorValidationTest, SlotOutOfRange) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  proto::SequenceStep* s = h_.Add(&plan, 1, {6}, 5, false);
  proto::SlotDelta* d = s->add_deltas();
  d->set_slot(4);
  d->set_first_logical(2);
  d->add_appended(100);
  ExpectRejected(plan, "slot out of [0, 4)");
}

TEST_F(ExecutorValidationTest, PositionWithoutBlock) {
  // Positions [5, 9) need logical blocks 1 and 2; the plan gives none for 2.
  proto::StepPlan plan;
  plan.set_step_id(2);
  proto::SequenceStep* s = plan.add_seqs();
  s->set_seq_id(1);
  s->set_start_pos(5);
  for (int t : {6, 7, 8, 9}) s->add_token_ids(t);
  ExpectRejected(plan, "logical block 2");
}

TEST_F(ExecutorValidationTest, RecycledBlockStillVisibleToFullSlot) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  proto::SequenceStep* s = h_.Add(&plan, 1, {6}, 5, false);
  proto::SlotDelta* d = s->add_deltas();
  d->set_slot(3);
  d->add_recycled(0);
  ExpectRejected(plan, "slot 3: logical block 0");
}

TEST_F(ExecutorValidationTest, TooManyTokens) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 2, std::vector<int32_t>(65, 3), 0, true);
  ExpectRejected(plan, "65 tokens, more than 64");
}

TEST_F(ExecutorValidationTest, TokenIdOutOfVocabulary) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 1, {50}, 5, false);
  ExpectRejected(plan, "token id 50 out of [0, 50)");
}

TEST_F(ExecutorValidationTest, DuplicateSeqInPlan) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 1, {6}, 5, false);
  h_.Add(&plan, 1, {7}, 6, false);
  ExpectRejected(plan, "appears twice");
}

TEST_F(ExecutorValidationTest, BadSamplingParams) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 1, {6}, 5, false)->mutable_sampling()->set_temperature(-1.0f);
  ExpectRejected(plan, "temperature");
}

TEST_F(ExecutorValidationTest, TopLogprobsNeedLogprobs) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 1, {6}, 5, false)->mutable_sampling()->set_num_logprobs(2);
  ExpectRejected(plan, "num_logprobs 2 without logprobs");
}

// The sampled token's logprob is computed only for a request that wants it.
TEST(StepExecutorTest, LogprobOnlyWhenWanted) {
  Harness h;
  proto::StepPlan plan;
  plan.set_step_id(1);
  h.Add(&plan, 1, {1, 2, 3}, 0, true);
  h.Add(&plan, 2, {1, 2, 3}, 0, true)->mutable_sampling()->set_logprobs(true);
  const proto::StepResult r = h.Run(plan);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.tokens_size(), 2);
  EXPECT_EQ(r.tokens(0).token_id(), r.tokens(1).token_id());  // same prompt, greedy
  EXPECT_EQ(r.tokens(0).logprob(), 0.0f);
  EXPECT_LT(r.tokens(1).logprob(), 0.0f);
}

// Prompt logprobs of a prefill chunk equal the logprob each prompt token
// gets as the next token of its own prefix, computed alone; the rank counts
// the tokens with a greater logit.
TEST(StepExecutorTest, PromptLogprobsEqualThoseOfEachPrefixAlone) {
  const std::vector<int32_t> prompt = {1, 5, 9, 14, 2, 33, 47};
  Harness h;
  proto::StepPlan plan;
  plan.set_step_id(1);
  h.Add(&plan, 9, {3, 4}, 0, true);  // another sequence in the batch
  proto::SequenceStep* step = h.Add(&plan, 1, {1, 5, 9, 14}, 0, true, /*sample=*/false);
  step->set_prompt_logprobs_first_row(1);  // rows 1..3 score prompt[2..4]
  for (int p = 2; p <= 4; ++p) step->add_prompt_logprob_token_ids(prompt[size_t(p)]);
  step->set_num_prompt_top_logprobs(3);
  const proto::StepResult r = h.Run(plan);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.tokens_size(), 1);  // seq 9 sampled
  ASSERT_EQ(r.prompt_logprobs_size(), 1);
  const proto::PromptLogprobs& got = r.prompt_logprobs(0);
  EXPECT_EQ(got.seq_id(), 1u);
  ASSERT_EQ(got.positions_size(), 3);

  const int vocab = TinySpec().vocab_size;
  for (int p = 2; p <= 4; ++p) {
    Harness alone;
    proto::StepPlan one;
    one.set_step_id(1);
    alone.Add(&one, 1, std::vector<int32_t>(prompt.begin(), prompt.begin() + p), 0, true);
    ASSERT_EQ(alone.Run(one).error(), "");
    const float* logits = alone.executor().TEST_last_logits().data();
    SampleResult want;
    want.token_id = prompt[size_t(p)];
    cpu::FillLogprobs(logits, vocab, 3, &want);
    const proto::SampledToken& t = got.positions(p - 2);
    EXPECT_EQ(t.token_id(), prompt[size_t(p)]);
    EXPECT_NEAR(t.logprob(), want.logprob, 1e-5f) << "position " << p;
    ASSERT_EQ(t.top_logprobs_size(), 3);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(t.top_logprobs(k).token_id(), want.top_logprobs[size_t(k)].first);
    }
    const int greater = int(std::count_if(logits, logits + vocab,
                                           [&](float v) { return v > logits[prompt[size_t(p)]]; }));
    EXPECT_EQ(t.rank(), 1 + greater);
  }
}

TEST_F(ExecutorValidationTest, BadPromptLogprobRows) {
  proto::StepPlan plan;
  plan.set_step_id(2);
  proto::SequenceStep* step = h_.Add(&plan, 2, {1, 2}, 0, true);
  step->set_prompt_logprobs_first_row(1);
  step->add_prompt_logprob_token_ids(3);
  step->add_prompt_logprob_token_ids(4);
  ExpectRejected(plan, "seq 2 prompt logprob rows [1, +2) outside its 2 tokens");
  step->set_prompt_logprobs_first_row(0);
  step->set_prompt_logprob_token_ids(1, 50);
  ExpectRejected(plan, "seq 2 prompt logprob token id 50 out of [0, 50)");
  step->set_prompt_logprob_token_ids(1, 4);
  step->set_num_prompt_top_logprobs(21);
  ExpectRejected(plan, "num_prompt_top_logprobs 21 out of [0, 20]");
}

// A GPU model computes at most max_logit_rows logits per step (its buffers
// hold one row per sampled sequence): prompt logprob rows beyond that are
// refused, naming the limit, and nothing is applied.
TEST(StepExecutorTest, MoreLogitRowsThanTheModelComputesAreRefused) {
  Harness h(/*picking=*/true);
  h.picking()->set_max_logit_rows(2);
  proto::StepPlan plan;
  plan.set_step_id(1);
  proto::SequenceStep* step = h.Add(&plan, 1, {1, 5, 9, 14}, 0, true);
  step->set_prompt_logprobs_first_row(0);
  for (int32_t id : {5, 9, 14}) step->add_prompt_logprob_token_ids(id);
  const proto::StepResult r = h.Run(plan);
  EXPECT_NE(r.error().find("needs the logits of 4 rows; this worker's model computes at most 2"),
            std::string::npos)
      << r.error();
  EXPECT_EQ(r.tokens_size(), 0);
  EXPECT_EQ(h.executor().FindSequence(1), nullptr);
  // Within the limit the same model serves the step.
  proto::StepPlan fits;
  fits.set_step_id(2);
  h.Add(&fits, 2, {1, 5}, 0, true);
  EXPECT_EQ(h.Run(fits).error(), "");
}

// More prompt logprob rows than the step protocol's bound (counted over all
// of a step's sequences) are refused, naming the bound, and nothing is applied.
TEST(StepExecutorTest, MorePromptRowsThanTheBoundAreRefused) {
  Harness h(/*picking=*/false, /*max_prompt_rows=*/3);
  proto::StepPlan plan;
  plan.set_step_id(1);
  for (uint64_t seq : {1, 2}) {
    proto::SequenceStep* step = h.Add(&plan, seq, {1, 5, 9}, 0, true);
    step->set_prompt_logprobs_first_row(0);
    step->add_prompt_logprob_token_ids(5);
    step->add_prompt_logprob_token_ids(9);
  }
  const proto::StepResult r = h.Run(plan);
  EXPECT_NE(r.error().find("step 1 has 4 prompt logprob rows, more than 3"), std::string::npos)
      << r.error();
  EXPECT_EQ(r.tokens_size(), 0);
  EXPECT_EQ(h.executor().FindSequence(1), nullptr);
  EXPECT_EQ(h.executor().FindSequence(2), nullptr);
  // At the bound the step is served, with every row's logprobs.
  plan.mutable_seqs(1)->mutable_prompt_logprob_token_ids()->RemoveLast();
  const proto::StepResult fits = h.Run(plan);
  EXPECT_EQ(fits.error(), "");
  EXPECT_EQ(fits.tokens_size(), 2);
  EXPECT_EQ(fits.prompt_logprobs_size(), 2);
}

TEST_F(ExecutorValidationTest, OneBadSeqRejectsTheWholePlan) {
  // Seq 2 is valid and new, seq 1 is wrong: neither may be applied.
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 2, {1, 2}, 0, true);
  h_.Add(&plan, 1, {6}, 3, false);
  ExpectRejected(plan, "seq 1 start_pos 3");
  EXPECT_EQ(h_.executor().FindSequence(2), nullptr);
  // The same step id is still usable once the plan is right.
  proto::StepPlan good;
  good.set_step_id(2);
  h_.Add(&good, 1, {6}, 5, false);
  proto::StepResult r = h_.Run(good);
  EXPECT_EQ(r.error(), "");
  ASSERT_EQ(r.tokens_size(), 1);
  EXPECT_EQ(h_.executor().FindSequence(1)->num_computed, 6);
}

TEST(StepExecutorTest, DeltasAppendRecycleAndRelease) {
  Harness h;
  proto::StepPlan plan;
  plan.set_step_id(10);
  proto::SequenceStep* s = plan.add_seqs();
  s->set_seq_id(7);
  s->set_is_new(true);
  s->set_start_pos(0);
  s->set_sample(false);
  for (int t : {1, 2, 3, 4, 5, 6}) s->add_token_ids(t);
  for (int slot = 0; slot < 4; ++slot) {
    proto::SlotDelta* d = s->add_deltas();
    d->set_slot(slot);
    d->set_first_logical(0);
    d->add_appended(10 * slot);
    d->add_appended(10 * slot + 1);
  }
  proto::StepResult r = h.Run(plan);
  ASSERT_EQ(r.error(), "");
  EXPECT_EQ(r.tokens_size(), 0);  // nothing asked to sample
  const SequenceState* st = h.executor().FindSequence(7);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->num_computed, 6);
  EXPECT_EQ(st->block_rows[2], (std::vector<int32_t>{20, 21}));

  SequenceState direct = *st;
  proto::SlotDelta gap;
  gap.set_slot(1);
  gap.set_first_logical(4);
  gap.add_appended(99);
  gap.add_recycled(0);
  ASSERT_TRUE(ApplySlotDelta(gap, kNumBlocks, &direct).ok());
  EXPECT_EQ(direct.block_rows[1], (std::vector<int32_t>{-1, 11, -1, -1, 99}));
  proto::SlotDelta overwrite;
  overwrite.set_slot(1);
  overwrite.set_first_logical(1);
  overwrite.add_appended(5);
  EXPECT_EQ(ApplySlotDelta(overwrite, kNumBlocks, &direct).code(), StatusCode::kInvalidArgument);
  proto::SlotDelta past_end;
  past_end.set_slot(1);
  past_end.add_recycled(5);
  EXPECT_EQ(ApplySlotDelta(past_end, kNumBlocks, &direct).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(direct.block_rows[1], (std::vector<int32_t>{-1, 11, -1, -1, 99}));

  proto::StepPlan release;
  release.set_step_id(11);
  release.add_released_seq_ids(7);
  release.add_released_seq_ids(12345);  // unknown: ignored
  ASSERT_EQ(h.Run(release).error(), "");
  EXPECT_EQ(h.executor().FindSequence(7), nullptr);
  EXPECT_EQ(h.executor().num_sequences(), 0u);
}

TEST(StepExecutorTest, SlidingSlotMayDropBlocksOutsideItsWindow) {
  SequenceState st;
  st.seq_id = 3;
  st.block_rows = {{-1, -1, 5, 6}, {1, 2, 3, 4}};
  const std::vector<SlotSpec> specs = {SlotSpec{6, 0}, SlotSpec{}};
  // Positions [13, 15) with window 6 see keys > 7: logical blocks 2 and 3.
  EXPECT_TRUE(CheckBlocksCover(st, specs, kBlockSize, 13, 15).ok());
  // Position 12 sees key 7, in logical block 1, which is gone.
  EXPECT_EQ(CheckBlocksCover(st, specs, kBlockSize, 12, 15).code(),
            StatusCode::kFailedPrecondition);
  // A sink of 2 needs logical block 0 too.
  EXPECT_FALSE(CheckBlocksCover(st, {SlotSpec{6, 2}, SlotSpec{}}, kBlockSize, 13, 15).ok());
}

// Float32 full slots and float16 sliding ones (cache.kv_cache_dtype_sliding)
// in one arena: with head_dim 16 and 4 positions a chunk of 512 bytes holds
// one float32 block or two float16 ones (common/kv_arena.h), so block ids
// count per dtype and each slot's ids are bounded by its own dtype's blocks.
// The logits do not depend on which chunks each dtype's blocks lie in.
TEST(StepExecutorTest, BlockIdsCountPerSlotDtype) {
  ModelSpec spec = TinySpec();
  spec.slot_specs[0] = spec.slot_specs[1] = SlotSpec{8, 0};  // layer 0 slides
  std::unique_ptr<DecoderModel> model =
      std::move(DecoderModel::Create(spec, ModelWeights::TEST_Random(spec, FullShard(spec), 7, 0.2f)))
          .value();
  const KvArenaLayout arena = MakeKvArenaLayout(
      kBlockSize, spec.head_dim, KvCacheDtypes{KvCacheDtype::kFloat32, KvCacheDtype::kFloat16},
      spec.slot_specs);
  ASSERT_TRUE(arena.mixed());
  ASSERT_EQ(arena.chunk_bytes, 512u);
  // Prefills 5 tokens (2 blocks a slot) with the given ids for slots 0..3
  // and returns the result and the last logits.
  auto prefill = [&](const std::vector<std::vector<int32_t>>& ids) {
    std::unique_ptr<KvPool> pool = std::move(KvPool::CreateArena(arena, 10 * 512)).value();
    EXPECT_EQ(pool->num_blocks(KvCacheDtype::kFloat32), 10);
    EXPECT_EQ(pool->num_blocks(KvCacheDtype::kFloat16), 20);
    StepExecutorOptions options;
    options.seed_base = 1;
    StepExecutor executor(model.get(), pool.get(), options);
    proto::StepPlan plan;
    plan.set_step_id(1);
    proto::SequenceStep* step = plan.add_seqs();
    step->set_seq_id(1);
    step->set_is_new(true);
    step->set_sample(true);
    for (int32_t t : {1, 2, 3, 4, 5}) step->add_token_ids(t);
    for (int slot = 0; slot < 4; ++slot) {
      proto::SlotDelta* d = step->add_deltas();
      d->set_slot(slot);
      for (int32_t id : ids[size_t(slot)]) d->add_appended(id);
    }
    proto::StepResult r = executor.Execute(plan);
    return std::pair{r, executor.TEST_last_logits()};
  };
  // float16 ids 16..19 lie in chunks 8 and 9, past the float32 ids' bound.
  const auto [high, high_logits] = prefill({{16, 17}, {18, 19}, {0, 1}, {2, 3}});
  ASSERT_EQ(high.error(), "");
  ASSERT_EQ(high.tokens_size(), 1);
  // The same blocks placed the other way round: float16 in chunks 0 and 1,
  // float32 in chunks 6..9.
  const auto [low, low_logits] = prefill({{0, 1}, {2, 3}, {6, 7}, {8, 9}});
  ASSERT_EQ(low.error(), "");
  EXPECT_EQ(low.tokens(0).token_id(), high.tokens(0).token_id());
  EXPECT_TRUE(low_logits == high_logits);
  const auto [full_past, unused1] = prefill({{0, 1}, {2, 3}, {4, 10}, {6, 7}});
  EXPECT_NE(full_past.error().find("slot 2: block id 10 out of [0, 10)"), std::string::npos)
      << full_past.error();
  const auto [sliding_past, unused2] = prefill({{0, 20}, {2, 3}, {4, 5}, {6, 7}});
  EXPECT_NE(sliding_past.error().find("block id 20 out of [0, 20)"), std::string::npos)
      << sliding_past.error();
}

// Greedy generation of `n` tokens for one prompt, prefilled in chunks of
// `chunk` tokens, optionally alongside other sequences.
std::vector<int32_t> Generate(const std::vector<int32_t>& prompt, int n, int chunk,
                              bool with_others) {
  Harness h;
  uint64_t step = 1;
  std::vector<int32_t> out;
  uint32_t pos = 0;
  std::vector<int32_t> other = {7, 8, 9, 10, 11, 12, 13};
  uint32_t other_pos = 0;
  int32_t last = -1;
  while (int(out.size()) < n) {
    proto::StepPlan plan;
    plan.set_step_id(step++);
    if (with_others) {
      h.Add(&plan, 50, other_pos == 0 ? other : std::vector<int32_t>{3}, other_pos,
            other_pos == 0);
      other_pos += other_pos == 0 ? uint32_t(other.size()) : 1;
    }
    if (pos < prompt.size()) {
      const size_t len = std::min<size_t>(chunk, prompt.size() - pos);
      std::vector<int32_t> part(prompt.begin() + pos, prompt.begin() + pos + len);
      h.Add(&plan, 9, part, pos, pos == 0, pos + len == prompt.size());
      pos += uint32_t(len);
    } else {
      h.Add(&plan, 9, {last}, pos, false)->set_num_generated(uint32_t(out.size()));
      pos += 1;
    }
    proto::StepResult r = h.Run(plan);
    EXPECT_EQ(r.error(), "");
    for (const proto::SampledToken& t : r.tokens()) {
      if (t.seq_id() == 9) {
        last = t.token_id();
        out.push_back(last);
      }
    }
  }
  return out;
}

TEST(StepExecutorTest, BatchingAndChunkingKeepGreedyTokens) {
  const std::vector<int32_t> prompt = {1, 5, 9, 14, 2, 33, 47, 8, 21, 30, 11};
  const std::vector<int32_t> alone = Generate(prompt, 8, 100, false);
  EXPECT_EQ(Generate(prompt, 8, 100, true), alone);
  EXPECT_EQ(Generate(prompt, 8, 3, false), alone);
  EXPECT_EQ(Generate(prompt, 8, 5, true), alone);
}

TEST(StepExecutorTest, SeededSamplingIsReproducible) {
  auto run = [](uint64_t seed, bool has_seed) {
    Harness h;
    proto::StepPlan plan;
    plan.set_step_id(1);
    proto::SequenceStep* s = h.Add(&plan, 4, {1, 2, 3}, 0, true);
    s->mutable_sampling()->set_temperature(1.0f);
    s->mutable_sampling()->set_seed(seed);
    s->mutable_sampling()->set_has_seed(has_seed);
    s->mutable_sampling()->set_num_logprobs(3);
    s->mutable_sampling()->set_logprobs(true);
    proto::StepResult r = h.Run(plan);
    EXPECT_EQ(r.error(), "");
    EXPECT_EQ(r.tokens(0).top_logprobs_size(), 3);
    EXPECT_LE(r.tokens(0).logprob(), 0.0f);
    return r.tokens(0).token_id();
  };
  EXPECT_EQ(run(42, true), run(42, true));
  // Same seed base (options) and seq id: the per-sequence seed repeats too.
  EXPECT_EQ(run(0, false), run(0, false));
}

// The greedy token of `raw` ([vocab]) after `processors` read `history`.
int32_t ProcessedArgmax(std::vector<float> raw, const LogitProcessors& processors,
                        const TokenHistory& history) {
  cpu::ApplyLogitProcessors(raw.data(), int(raw.size()), processors, history);
  return int32_t(std::max_element(raw.begin(), raw.end()) - raw.begin());
}

TEST(StepExecutorTest, PenaltiesReadTheHistoryAndCountWhatIsSampled) {
  Harness h;
  const int vocab = TinySpec().vocab_size;
  LogitProcessors processors;
  processors.repetition_penalty = 3.0f;
  processors.frequency_penalty = 1.5f;
  processors.presence_penalty = 2.0f;
  auto set = [&](proto::SequenceStep* s) {
    proto::SamplingParams* p = s->mutable_sampling();
    p->set_temperature(0.0f);
    p->set_num_logprobs(2);
    p->set_logprobs(true);
    p->set_repetition_penalty(processors.repetition_penalty);
    p->set_frequency_penalty(processors.frequency_penalty);
    p->set_presence_penalty(processors.presence_penalty);
  };
  // Met with a history: two earlier outputs of token 7, one of 9.
  TokenHistory history;
  history.prompt_ids = {1, 2, 3};
  history.output_counts = {{7, 2}, {9, 1}};
  proto::StepPlan plan;
  plan.set_step_id(1);
  proto::SequenceStep* s = h.Add(&plan, 4, {1, 2, 3, 7, 7, 9}, 0, true);
  set(s);
  for (int32_t id : {1, 2, 3}) s->mutable_history()->add_prompt_token_ids(id);
  for (int32_t id : {7, 7, 9}) s->mutable_history()->add_output_token_ids(id);
  proto::StepResult r = h.Run(plan);
  ASSERT_EQ(r.error(), "");
  std::vector<float> raw(h.executor().TEST_last_logits().begin(),
                         h.executor().TEST_last_logits().begin() + vocab);
  int32_t token = r.tokens(0).token_id();
  EXPECT_EQ(token, ProcessedArgmax(raw, processors, history));
  // The logprobs are the raw distribution's.
  SampleResult want;
  want.token_id = token;
  cpu::FillLogprobs(raw.data(), vocab, 2, &want);
  EXPECT_FLOAT_EQ(r.tokens(0).logprob(), want.logprob);
  EXPECT_EQ(r.tokens(0).top_logprobs(0).token_id(), want.top_logprobs[0].first);

  // Each later step counts the token sampled before it.
  for (int step = 2, pos = 6; step <= 8; ++step, ++pos) {
    ++history.output_counts[token];
    plan.Clear();
    plan.set_step_id(uint64_t(step));
    set(h.Add(&plan, 4, {token}, uint32_t(pos), false));
    r = h.Run(plan);
    ASSERT_EQ(r.error(), "");
    raw.assign(h.executor().TEST_last_logits().begin(),
               h.executor().TEST_last_logits().begin() + vocab);
    token = r.tokens(0).token_id();
    ASSERT_EQ(token, ProcessedArgmax(raw, processors, history)) << "step " << step;
  }
}

TEST(StepExecutorTest, BannedTokensAndLogitBias) {
  auto first_token = [](const std::vector<int32_t>& banned, std::pair<int32_t, float> bias) {
    Harness h;
    proto::StepPlan plan;
    plan.set_step_id(1);
    proto::SequenceStep* s = h.Add(&plan, 4, {1, 2, 3}, 0, true);
    proto::SamplingParams* p = s->mutable_sampling();
    p->set_temperature(0.0f);
    for (int32_t id : banned) p->add_banned_token_ids(id);
    if (bias.first >= 0) {
      proto::LogitBias* b = s->mutable_processors()->add_logit_bias();
      b->set_token_id(bias.first);
      b->set_bias(bias.second);
    }
    proto::StepResult r = h.Run(plan);
    EXPECT_EQ(r.error(), "");
    return r.tokens(0).token_id();
  };
  const int32_t plain = first_token({}, {-1, 0.0f});
  EXPECT_NE(first_token({plain}, {-1, 0.0f}), plain);
  const int32_t other = plain == 11 ? 12 : 11;
  EXPECT_EQ(first_token({}, {other, 100.0f}), other);
  EXPECT_NE(first_token({}, {plain, -100.0f}), plain);
}

TEST(StepExecutorTest, StructuredOutputMaskLeavesOnlyItsTokens) {
  for (float temperature : {0.0f, 1.0f}) {
    for (int32_t only : {3, 17, 49}) {
      Harness h;
      proto::StepPlan plan;
      plan.set_step_id(1);
      proto::SamplingParams* p = h.Add(&plan, 4, {1, 2, 3}, 0, true)->mutable_sampling();
      p->set_temperature(temperature);
      std::string mask(7, '\0');  // 50 tokens
      mask[size_t(only) / 8] = char(1 << (only % 8));
      p->set_allowed_token_bitmask(mask);
      proto::StepResult r = h.Run(plan);
      ASSERT_EQ(r.error(), "");
      EXPECT_EQ(r.tokens(0).token_id(), only);
    }
  }
}

TEST_F(ExecutorValidationTest, BadLogitProcessors) {
  auto plan_with = [&](const std::function<void(proto::SamplingParams*)>& edit) {
    proto::StepPlan plan;
    plan.set_step_id(2);
    edit(h_.Add(&plan, 1, {6}, 5, false)->mutable_sampling());
    return plan;
  };
  ExpectRejected(plan_with([](proto::SamplingParams* p) { p->set_min_p(1.5f); }), "min_p");
  ExpectRejected(plan_with([](proto::SamplingParams* p) { p->set_repetition_penalty(-1.0f); }),
                 "repetition_penalty");
  ExpectRejected(plan_with([](proto::SamplingParams* p) { p->set_presence_penalty(3.0f); }),
                 "presence_penalty");
  ExpectRejected(plan_with([](proto::SamplingParams* p) { p->add_banned_token_ids(-1); }),
                 "banned token id");
  proto::StepPlan plan;
  plan.set_step_id(2);
  h_.Add(&plan, 2, {1}, 0, true)->mutable_history()->add_output_token_ids(50);
  ExpectRejected(plan, "history token id 50");
  plan.Clear();
  plan.set_step_id(2);
  proto::LogitBias* b = h_.Add(&plan, 2, {1}, 0, true)->mutable_processors()->add_logit_bias();
  b->set_token_id(50);
  b->set_bias(1.0f);
  ExpectRejected(plan, "logit_bias");
  plan.Clear();
  plan.set_step_id(2);
  h_.Add(&plan, 2, {1}, 0, true)->mutable_processors()->add_allowed_token_ids(-3);
  ExpectRejected(plan, "allowed token id -3");
  ExpectRejected(plan_with([](proto::SamplingParams* p) {
                   p->set_allowed_token_bitmask(std::string(1000, '\xff'));
                 }),
                 "allowed_token_bitmask of 1000 bytes");
  ExpectRejected(plan_with([](proto::SamplingParams* p) {
                   p->set_allowed_token_bitmask(std::string(2, '\0'));
                 }),
                 "allows no token");
}

TEST(KvPoolTest, SizesFromMemoryAndRejectsTooLittle) {
  const KvCacheLayout layout{16, 64};
  Result<std::unique_ptr<KvPool>> pool = KvPool::Create(layout, 10 * 8192 + 100);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->num_blocks(), 10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->data()) % KvPool::kAlignmentBytes, 0u);
  EXPECT_EQ(KvPool::Create(layout, 8191).status().code(), StatusCode::kInvalidArgument);
}

// Rows a model picks on its device (GPU greedy sampling) give the executor
// the same results as sampling their logits on the host; other rows are
// still sampled from the logits.
TEST(ExecutorDevicePicksTest, PickedRowsGiveTheSameResultsAsHostSampling) {
  Harness host, picking(/*picking=*/true);
  auto plan_for = [](Harness& h, uint64_t step, bool prefill, const std::vector<int32_t>& last) {
    proto::StepPlan plan;
    plan.set_step_id(step);
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      const uint32_t pos = prefill ? 0 : uint32_t(4 + step - 2);
      proto::SequenceStep* s =
          prefill ? h.Add(&plan, seq, {int32_t(seq), 5, 6, 7}, 0, true)
                  : h.Add(&plan, seq, {last[seq - 1]}, pos, false);
      s->set_num_generated(uint32_t(step - 1));
      proto::SamplingParams* p = s->mutable_sampling();
      if (seq == 2) {                                 // greedy with top logprobs
        p->set_logprobs(true);
        p->set_num_logprobs(3);
      }
      if (seq == 3) {                                 // sampled: never picked
        p->set_temperature(0.8f);
        p->set_seed(42);
        p->set_num_logprobs(2);
        p->set_logprobs(true);
      }
    }
    return plan;
  };
  std::vector<int32_t> last_host(3), last_picking(3);
  for (uint64_t step = 1; step <= 4; ++step) {
    const proto::StepResult a = host.Run(plan_for(host, step, step == 1, last_host));
    const proto::StepResult b = picking.Run(plan_for(picking, step, step == 1, last_picking));
    ASSERT_EQ(a.error(), "");
    ASSERT_EQ(b.error(), "");
    ASSERT_EQ(a.tokens_size(), 3);
    ASSERT_EQ(b.tokens_size(), 3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(a.tokens(i).token_id(), b.tokens(i).token_id()) << "step " << step << " seq " << i;
      EXPECT_EQ(a.tokens(i).logprob(), b.tokens(i).logprob());
      ASSERT_EQ(a.tokens(i).top_logprobs_size(), b.tokens(i).top_logprobs_size());
      for (int j = 0; j < a.tokens(i).top_logprobs_size(); ++j) {
        EXPECT_EQ(a.tokens(i).top_logprobs(j).token_id(), b.tokens(i).top_logprobs(j).token_id());
        EXPECT_EQ(a.tokens(i).top_logprobs(j).logprob(), b.tokens(i).top_logprobs(j).logprob());
      }
      last_host[i] = a.tokens(i).token_id();
      last_picking[i] = b.tokens(i).token_id();
    }
  }
  // Per step: seq 1 greedy (0 logprobs), seq 2 greedy (3), seq 3 sampled (-1).
  const std::vector<int32_t> per_step = {0, 3, -1};
  std::vector<int32_t> expected;
  for (int step = 0; step < 4; ++step) expected.insert(expected.end(), per_step.begin(), per_step.end());
  EXPECT_EQ(picking.picking()->seen(), expected);
}

}  // namespace
}  // namespace headway
