#include "coordinator/engine/step_plan.h"

#include <gtest/gtest.h>

#include "coordinator/structured/grammar_compiler.h"
#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

constexpr int kBlockSize = 4;

std::unique_ptr<Scheduler> MakeScheduler(int tp_size) {
  auto kv = std::make_unique<KvCacheManager>(testing::FakeLlamaSpec(2), tp_size, kBlockSize,
                                             std::vector<int>(size_t(tp_size), 64));
  return std::make_unique<Scheduler>(SchedulerConfig{8, 64}, std::move(kv));
}

std::unique_ptr<Sequence> MakeSeq(uint64_t id, std::vector<int32_t> prompt) {
  SamplingOptions sampling;
  sampling.temperature = 0.5f;
  sampling.top_p = 0.9f;
  sampling.top_k = 20;
  sampling.seed = 1234;
  sampling.logprobs = true;
  sampling.num_top_logprobs = 3;
  StopConditions stop;
  stop.max_tokens = 4;
  return std::make_unique<Sequence>(id, std::move(prompt), sampling, stop, Clock::now());
}

// guided_choice ["ab", "b"] over ids 0 "<eos>" (special), 1 "a", 2 "b",
// 3 "ab", 4..9 "x".
std::shared_ptr<structured::TokenAutomaton> ChoiceGrammar() {
  std::vector<std::string> tokens = {"<eos>", "a", "b", "ab", "x", "x", "x", "x", "x", "x"};
  auto vocabulary =
      std::make_shared<const structured::TokenVocabulary>(tokens, std::vector<int32_t>{0});
  structured::GrammarCompiler compiler(vocabulary);
  auto grammar = compiler.Compile(
      {structured::StructuredOutputSpec::Kind::kChoice, R"(["ab", "b"])", "", "guided_choice"});
  EXPECT_TRUE(grammar.ok()) << grammar.status().ToString();
  return *grammar;
}

std::vector<int32_t> Allowed(const std::string& bitmask) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < int32_t(bitmask.size()) * 8; ++id) {
    if ((static_cast<unsigned char>(bitmask[size_t(id) / 8]) >> (id % 8)) & 1) ids.push_back(id);
  }
  return ids;
}

TEST(StepPlanTest, StructuredOutputSendsEachStepsMaskWithStopTokensOnceComplete) {
  std::unique_ptr<Scheduler> s = MakeScheduler(1);
  SamplingOptions sampling;
  sampling.grammar = ChoiceGrammar();
  StopConditions stop;
  stop.max_tokens = 4;
  stop.eos_id = 0;
  auto owned = std::make_unique<Sequence>(7, std::vector<int32_t>{10, 11}, sampling, stop,
                                          Clock::now());
  Sequence* seq = owned.get();
  ASSERT_TRUE(s->Add(std::move(owned)).ok());
  ScheduledBatch batch = s->Schedule();
  std::vector<proto::StepPlan> plans = BuildStepPlans(1, batch, *s, 1);
  const std::string& mask = plans[0].seqs(0).sampling().allowed_token_bitmask();
  EXPECT_EQ(mask.size(), 2u);  // 10 tokens
  EXPECT_EQ(Allowed(mask), (std::vector<int32_t>{1, 2, 3}));
  // "a": only "b" may follow; "ab" is whole, so the answer is complete.
  ASSERT_TRUE(seq->AdvanceGrammar(1).ok());
  EXPECT_FALSE(seq->GrammarComplete());
  std::vector<int32_t> words;
  for (int32_t id = 0; id < 10; ++id) {
    if (structured::MaskAllows(*seq->GrammarMask(), id)) words.push_back(id);
  }
  EXPECT_EQ(words, std::vector<int32_t>{2});
  ASSERT_TRUE(seq->AdvanceGrammar(2).ok());
  EXPECT_TRUE(seq->GrammarComplete());
  EXPECT_EQ((*seq->GrammarMask())[0], 1u);  // EOS alone
  // A token the grammar does not allow is an internal error, not a crash.
  Status bad = seq->AdvanceGrammar(4);
  EXPECT_EQ(bad.code(), StatusCode::kInternal);
}

TEST(StepPlanTest, EveryRankGetsTheBatchWithItsOwnDeltas) {
  std::unique_ptr<Scheduler> s = MakeScheduler(3);
  ASSERT_TRUE(s->Add(MakeSeq(5, {10, 11, 12, 13, 14, 15})).ok());
  ScheduledBatch batch = s->Schedule();
  ASSERT_EQ(batch.seqs.size(), 1u);
  std::vector<proto::StepPlan> plans = BuildStepPlans(42, batch, *s, 3);
  ASSERT_EQ(plans.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    const proto::StepPlan& plan = plans[size_t(rank)];
    EXPECT_EQ(plan.step_id(), 42u);
    ASSERT_EQ(plan.seqs_size(), 1);
    const proto::SequenceStep& step = plan.seqs(0);
    EXPECT_EQ(step.seq_id(), 5u);
    EXPECT_TRUE(step.is_new());
    EXPECT_TRUE(step.sample());
    EXPECT_EQ(step.start_pos(), 0u);
    EXPECT_EQ(std::vector<int32_t>(step.token_ids().begin(), step.token_ids().end()),
              (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
    EXPECT_FLOAT_EQ(step.sampling().temperature(), 0.5f);
    EXPECT_FLOAT_EQ(step.sampling().top_p(), 0.9f);
    EXPECT_EQ(step.sampling().top_k(), 20);
    EXPECT_TRUE(step.sampling().has_seed());
    EXPECT_EQ(step.sampling().seed(), 1234u);
    EXPECT_EQ(step.sampling().num_logprobs(), 3);
    EXPECT_TRUE(step.sampling().logprobs());
    EXPECT_EQ(step.num_generated(), 0u);
    // 2 layers x 1 local KV head at TP 3: two slots of 2 blocks each.
    const std::vector<SlotBlockDelta>& deltas = batch.seqs[0].deltas[size_t(rank)];
    ASSERT_EQ(step.deltas_size(), int(deltas.size()));
    ASSERT_EQ(deltas.size(), 2u);
    for (size_t d = 0; d < deltas.size(); ++d) {
      EXPECT_EQ(step.deltas(int(d)).slot(), uint32_t(deltas[d].slot));
      EXPECT_EQ(step.deltas(int(d)).first_logical(), uint32_t(deltas[d].first_logical));
      EXPECT_EQ(std::vector<int32_t>(step.deltas(int(d)).appended().begin(),
                                     step.deltas(int(d)).appended().end()),
                deltas[d].appended);
      EXPECT_EQ(deltas[d].appended.size(), 2u);
    }
  }
}

// Each prompt row names the prompt token it scores, on every rank.
TEST(StepPlanTest, PromptLogprobRowsNameTheNextPromptToken) {
  std::unique_ptr<Scheduler> s = MakeScheduler(3);
  SamplingOptions sampling;
  sampling.prompt_logprobs = 4;
  ASSERT_TRUE(
      s->Add(std::make_unique<Sequence>(5, std::vector<int32_t>{10, 11, 12, 13}, sampling,
                                        StopConditions{}, Clock::now()))
          .ok());
  ASSERT_TRUE(s->Add(MakeSeq(6, {20, 21})).ok());
  ScheduledBatch batch = s->Schedule();
  std::vector<proto::StepPlan> plans = BuildStepPlans(1, batch, *s, 3);
  for (const proto::StepPlan& plan : plans) {
    ASSERT_EQ(plan.seqs_size(), 2);
    const proto::SequenceStep& step = plan.seqs(0);
    EXPECT_EQ(step.prompt_logprobs_first_row(), 0u);
    EXPECT_EQ(std::vector<int32_t>(step.prompt_logprob_token_ids().begin(),
                                   step.prompt_logprob_token_ids().end()),
              (std::vector<int32_t>{11, 12, 13}));
    EXPECT_EQ(step.num_prompt_top_logprobs(), 4);
    EXPECT_EQ(plan.seqs(1).prompt_logprob_token_ids_size(), 0);
  }
}

TEST(StepPlanTest, ADecodeStepSendsTheLastTokenAndTheReleasedSequences) {
  std::unique_ptr<Scheduler> s = MakeScheduler(1);
  ASSERT_TRUE(s->Add(MakeSeq(1, {10, 11, 12})).ok());
  ASSERT_TRUE(s->Add(MakeSeq(2, {20, 21, 22})).ok());
  ScheduledBatch first = s->Schedule();
  s->OnStepComputed(first);
  s->Find(1)->AppendToken(99, Clock::now());
  s->Find(2)->AppendToken(98, Clock::now());
  (void)s->Remove(2);
  ScheduledBatch batch = s->Schedule();
  std::vector<proto::StepPlan> plans = BuildStepPlans(2, batch, *s, 1);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(std::vector<uint64_t>(plans[0].released_seq_ids().begin(),
                                  plans[0].released_seq_ids().end()),
            (std::vector<uint64_t>{2}));
  ASSERT_EQ(plans[0].seqs_size(), 1);
  const proto::SequenceStep& step = plans[0].seqs(0);
  EXPECT_FALSE(step.is_new());
  EXPECT_EQ(step.start_pos(), 3u);
  ASSERT_EQ(step.token_ids_size(), 1);
  EXPECT_EQ(step.token_ids(0), 99);
  EXPECT_EQ(step.num_generated(), 1u);
}

TEST(StepPlanTest, LogitProcessorsHistoryAndTheMinTokensBan) {
  std::unique_ptr<Scheduler> s = MakeScheduler(1);
  SamplingOptions sampling;
  sampling.min_p = 0.1f;
  sampling.repetition_penalty = 1.3f;
  sampling.frequency_penalty = 0.5f;
  sampling.presence_penalty = -0.5f;
  sampling.logit_bias = {{4, 2.0f}};
  sampling.allowed_token_ids = {5, 6, 9};
  sampling.bad_words_ids = {{9}, {5, 6, 3}, {6, 8}};
  StopConditions stop;
  stop.max_tokens = 8;
  stop.min_tokens = 2;
  stop.eos_id = 0;
  stop.stop_token_ids = {7};
  ASSERT_TRUE(s->Add(std::make_unique<Sequence>(1, std::vector<int32_t>{12, 10, 12}, sampling,
                                                stop, Clock::now()))
                  .ok());
  ScheduledBatch batch = s->Schedule();
  // TP 2: what is kept for the sequence's life goes to rank 0 alone.
  const std::vector<proto::StepPlan> plans = BuildStepPlans(1, batch, *s, 2);
  EXPECT_FALSE(plans[1].seqs(0).has_processors());
  EXPECT_FALSE(plans[1].seqs(0).has_history());
  proto::SequenceStep step = plans[0].seqs(0);
  EXPECT_TRUE(step.is_new());
  EXPECT_FLOAT_EQ(step.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(step.sampling().repetition_penalty(), 1.3f);
  EXPECT_FLOAT_EQ(step.sampling().frequency_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(step.sampling().presence_penalty(), -0.5f);
  ASSERT_EQ(step.processors().logit_bias_size(), 1);
  EXPECT_EQ(step.processors().logit_bias(0).token_id(), 4);
  EXPECT_FLOAT_EQ(step.processors().logit_bias(0).bias(), 2.0f);
  // Met for the first time: the distinct prompt ids, no output yet; EOS
  // and the stop token are banned until 2 tokens are out.
  EXPECT_EQ(std::vector<int32_t>(step.history().prompt_token_ids().begin(),
                                 step.history().prompt_token_ids().end()),
            (std::vector<int32_t>{10, 12}));
  EXPECT_EQ(step.history().output_token_ids_size(), 0);
  EXPECT_EQ(std::vector<int32_t>(step.processors().allowed_token_ids().begin(),
                                 step.processors().allowed_token_ids().end()),
            (std::vector<int32_t>{5, 6, 9}));
  // The one-token bad word is always banned.
  EXPECT_EQ(std::vector<int32_t>(step.sampling().banned_token_ids().begin(),
                                 step.sampling().banned_token_ids().end()),
            (std::vector<int32_t>{0, 7, 9}));
  s->OnStepComputed(batch);
  s->Find(1)->AppendToken(5, Clock::now());
  batch = s->Schedule();
  step = BuildStepPlans(2, batch, *s, 1)[0].seqs(0);
  EXPECT_FALSE(step.is_new());
  EXPECT_FALSE(step.has_history());  // the worker counts what it samples
  EXPECT_FALSE(step.has_processors());
  EXPECT_EQ(step.sampling().banned_token_ids_size(), 3);
  s->OnStepComputed(batch);
  s->Find(1)->AppendToken(6, Clock::now());
  batch = s->Schedule();
  // Two tokens out: min_tokens is met; the output ends with 5 6 and with 6.
  step = BuildStepPlans(3, batch, *s, 1)[0].seqs(0);
  EXPECT_EQ(std::vector<int32_t>(step.sampling().banned_token_ids().begin(),
                                 step.sampling().banned_token_ids().end()),
            (std::vector<int32_t>{9, 3, 8}));
}

TEST(StepPlanTest, APrefillOnlySequenceNeverSamples) {
  std::unique_ptr<Scheduler> s = MakeScheduler(1);
  ASSERT_TRUE(s->Add(std::make_unique<Sequence>(3, std::vector<int32_t>{1, 2, 3, 4},
                                                SamplingOptions{}, StopConditions{}, Clock::now(),
                                                SequenceKind::kPrefillOnly))
                  .ok());
  ScheduledBatch batch = s->Schedule();
  std::vector<proto::StepPlan> plans = BuildStepPlans(1, batch, *s, 1);
  ASSERT_EQ(plans[0].seqs_size(), 1);
  EXPECT_FALSE(plans[0].seqs(0).sample());
  EXPECT_EQ(plans[0].seqs(0).token_ids_size(), 4);
  s->OnStepComputed(batch);
  EXPECT_TRUE(s->Find(3)->IsPrefillDone());
  EXPECT_FALSE(s->Schedule().seqs.size() > 0);  // nothing left to compute
}

proto::StepResult Result(uint64_t step_id, const std::string& error = "") {
  proto::StepResult r;
  r.set_step_id(step_id);
  r.set_error(error);
  return r;
}

TEST(InFlightStepTest, DoneOnceEveryRankAnswered) {
  InFlightStep step(0, 7, ScheduledBatch{}, 3);
  proto::StepResult rank0 = Result(7);
  proto::SampledToken* t = rank0.add_tokens();
  t->set_seq_id(1);
  t->set_token_id(5);
  EXPECT_EQ(step.OnResult(1, Result(7)), InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(0, rank0), InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(2, Result(7)), InFlightStep::Progress::kDone);
  ASSERT_EQ(step.tokens().size(), 1u);
  EXPECT_EQ(step.tokens()[0].token_id(), 5);
  EXPECT_TRUE(step.status().ok());
}

// What FindStragglers reads: when the first result came (rejected ones do
// not count) and which rank is still missing.
TEST(InFlightStepTest, RecordsTheFirstAnswerAndTheFirstRankMissing) {
  InFlightStep step(0, 7, ScheduledBatch{}, 3);
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(step.first_answer_at().has_value());
  EXPECT_EQ(step.FirstUnanswered(), 0);
  EXPECT_EQ(step.OnResult(0, Result(6), t0), InFlightStep::Progress::kRejected);
  EXPECT_FALSE(step.first_answer_at().has_value());
  EXPECT_EQ(step.OnResult(0, Result(7), t0 + std::chrono::seconds(1)),
            InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(2, Result(7), t0 + std::chrono::seconds(2)),
            InFlightStep::Progress::kWaiting);
  ASSERT_TRUE(step.first_answer_at().has_value());
  EXPECT_EQ(*step.first_answer_at(), t0 + std::chrono::seconds(1));
  EXPECT_EQ(step.FirstUnanswered(), 1);
  EXPECT_EQ(step.OnResult(1, Result(7)), InFlightStep::Progress::kDone);
  EXPECT_EQ(step.FirstUnanswered(), -1);
}

// headway:step_worker_seconds takes the slowest rank's own time; a rejected
// result (another step's) does not count.
TEST(InFlightStepTest, WorkerSecondsIsTheSlowestAcceptedRank) {
  const Clock::time_point sent = Clock::now();
  InFlightStep step(0, 7, ScheduledBatch{}, 3, sent);
  EXPECT_EQ(step.sent_at(), sent);
  auto timed = [](uint64_t step_id, double seconds) {
    proto::StepResult r = Result(step_id);
    r.set_seconds(seconds);
    return r;
  };
  EXPECT_EQ(step.OnResult(0, timed(6, 9.0)), InFlightStep::Progress::kRejected);
  EXPECT_EQ(step.OnResult(0, timed(7, 0.004)), InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(2, timed(7, 0.006)), InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(1, timed(7, 0.005)), InFlightStep::Progress::kDone);
  EXPECT_EQ(step.worker_seconds(), 0.006);
}

TEST(InFlightStepTest, RejectsOtherStepsAndDuplicates) {
  InFlightStep step(0, 7, ScheduledBatch{}, 2);
  EXPECT_EQ(step.OnResult(0, Result(6)), InFlightStep::Progress::kRejected);
  EXPECT_EQ(step.OnResult(0, Result(7)), InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(0, Result(7)), InFlightStep::Progress::kRejected);
  EXPECT_EQ(step.OnResult(1, Result(7)), InFlightStep::Progress::kDone);
}

TEST(InFlightStepTest, KeepsTheFirstRankErrorNamingInstanceRankAndStep) {
  InFlightStep step(4, 9, ScheduledBatch{}, 2);
  EXPECT_EQ(step.OnResult(1, Result(9, "out of memory")), InFlightStep::Progress::kWaiting);
  EXPECT_EQ(step.OnResult(0, Result(9, "later error")), InFlightStep::Progress::kDone);
  EXPECT_EQ(step.status().code(), StatusCode::kInternal);
  EXPECT_EQ(step.status().message(), "instance 4 rank 1 failed step 9: out of memory");
}

}  // namespace
}  // namespace headway
