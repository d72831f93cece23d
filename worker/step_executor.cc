#include "worker/step_executor.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <unordered_set>

#include "comm/status_proto.h"
#include "common/step_limits.h"
#include "kernels/sampling.h"
#include "kernels/threads.h"

namespace headway {
namespace {

uint64_t RandomSeedBase() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

std::string SeqName(uint64_t seq_id) { return "seq " + std::to_string(seq_id); }

SamplingConfig ToSamplingConfig(const proto::SamplingParams& p) {
  SamplingConfig c;
  c.temperature = p.temperature();
  c.top_k = p.top_k();
  // proto3 leaves an unset top_p at 0: treat it (and 1) as "off".
  c.top_p = (p.top_p() <= 0.0f || p.top_p() >= 1.0f) ? 1.0f : p.top_p();
  c.min_p = p.min_p();
  return c;
}

// The per-step processors of `p` (with the kept ones: ProcessorsOf).
LogitProcessors ToLogitProcessors(const proto::SamplingParams& p) {
  LogitProcessors l;
  l.banned.assign(p.banned_token_ids().begin(), p.banned_token_ids().end());
  l.allowed_bitmask = p.allowed_token_bitmask();
  // proto3 leaves an unset repetition penalty at 0: read it as 1 (off).
  l.repetition_penalty = p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
  l.frequency_penalty = p.frequency_penalty();
  l.presence_penalty = p.presence_penalty();
  return l;
}

// InvalidArgument naming the first of `ids` outside [0, vocab): "<name>
// <what> <id> out of [0, <vocab>)".
Status CheckTokenIds(const std::string& name, const char* what,
                     const google::protobuf::RepeatedField<int32_t>& ids, int vocab) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      return Status::InvalidArgument(name + " " + what + " " + std::to_string(id) +
                                     " out of [0, " + std::to_string(vocab) + ")");
    }
  }
  return Status::Ok();
}

// InvalidArgument when a structured-output mask is longer than the
// vocabulary needs or allows no token of it (sampling needs one).
Status CheckBitmask(const std::string& name, const std::string& mask, int vocab) {
  if (mask.empty()) return Status::Ok();
  if (mask.size() > (size_t(vocab) + 7) / 8) {
    return Status::InvalidArgument(name + " allowed_token_bitmask of " +
                                   std::to_string(mask.size()) + " bytes for a vocabulary of " +
                                   std::to_string(vocab));
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    const unsigned bits = static_cast<unsigned char>(mask[i]);
    const size_t valid = std::min<size_t>(8, size_t(vocab) - i * 8);
    if (bits & ((1u << valid) - 1)) return Status::Ok();
  }
  return Status::InvalidArgument(name + " allowed_token_bitmask allows no token");
}

// The processors of one sampled row: `p`'s per-step ones and what the
// sequence keeps (`kept`, may be null).
LogitProcessors ProcessorsOf(const SequenceSampling* kept, const proto::SamplingParams& p) {
  LogitProcessors l = ToLogitProcessors(p);
  if (kept != nullptr) {
    l.logit_bias = kept->logit_bias;
    l.allowed = kept->allowed;
  }
  return l;
}

// ProcessorsOf(kept, p).Active(), without copying the kept lists.
bool HasProcessors(const SequenceSampling* kept, const proto::SamplingParams& p) {
  if (ToLogitProcessors(p).Active()) return true;
  return kept != nullptr && (!kept->logit_bias.empty() || !kept->allowed.empty());
}

SequenceSampling ToSequenceSampling(const proto::SequenceStep& step) {
  SequenceSampling s;
  for (const proto::LogitBias& b : step.processors().logit_bias()) {
    s.logit_bias.emplace_back(b.token_id(), b.bias());
  }
  s.allowed.assign(step.processors().allowed_token_ids().begin(),
                   step.processors().allowed_token_ids().end());
  s.counts = step.has_history();
  const proto::TokenHistory& h = step.history();
  s.history.prompt_ids.assign(h.prompt_token_ids().begin(), h.prompt_token_ids().end());
  for (int32_t id : h.output_token_ids()) ++s.history.output_counts[id];
  return s;
}

}  // namespace

StepExecutor::StepExecutor(ForwardModel* model, KvPool* pool, const StepExecutorOptions& options)
    : model_(model),
      pool_(pool),
      options_(options),
      seed_base_(options.seed_base ? *options.seed_base : RandomSeedBase()) {
  for (int s = 0; s < model_->num_slots(); ++s) slot_specs_.push_back(model_->slot_spec(s));
  table_ids_.resize(model_->spec().num_layers);
  tables_.resize(model_->spec().num_layers);
}

const SequenceState* StepExecutor::FindSequence(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? nullptr : &it->second;
}

Status StepExecutor::StageSequence(const proto::SequenceStep& step, SequenceState* next) const {
  const std::string name = SeqName(step.seq_id());
  auto it = sequences_.find(step.seq_id());
  if (step.is_new()) {
    if (it != sequences_.end()) {
      return Status::FailedPrecondition(name + " is_new but already exists on this worker");
    }
    next->seq_id = step.seq_id();
    next->rng_seed = SplitMix64(seed_base_ ^ SplitMix64(step.seq_id()));
    // A new sequence may start past 0: its prefix is already in the blocks
    // its deltas name (prefix cache hit, or a snapshot moved from prefill).
    next->num_computed = step.start_pos();
    next->block_rows.assign(model_->num_slots(), {});
  } else {
    if (it == sequences_.end()) {
      return Status::NotFound(name + " is unknown on this worker and not is_new");
    }
    *next = it->second;
  }
  if (step.token_ids_size() == 0) {
    return Status::InvalidArgument(name + " has no tokens to compute");
  }
  if (int64_t(step.start_pos()) != next->num_computed) {
    return Status::FailedPrecondition(name + " start_pos " + std::to_string(step.start_pos()) +
                                      " != positions computed " +
                                      std::to_string(next->num_computed));
  }
  const int64_t end = int64_t(step.start_pos()) + step.token_ids_size();
  if (end > model_->spec().context_length) {
    return Status::OutOfRange(name + " reaches position " + std::to_string(end) +
                              ", past the model's context length " +
                              std::to_string(model_->spec().context_length));
  }
  const int vocab = model_->vocab_size();
  HW_RETURN_IF_ERROR(CheckTokenIds(name, "token id", step.token_ids(), vocab));
  if (step.sample()) HW_RETURN_IF_ERROR(CheckSampling(name, step.sampling()));
  HW_RETURN_IF_ERROR(
      CheckTokenIds(name, "history token id", step.history().prompt_token_ids(), vocab));
  HW_RETURN_IF_ERROR(
      CheckTokenIds(name, "history token id", step.history().output_token_ids(), vocab));
  HW_RETURN_IF_ERROR(
      CheckTokenIds(name, "allowed token id", step.processors().allowed_token_ids(), vocab));
  for (const proto::LogitBias& b : step.processors().logit_bias()) {
    if (b.token_id() < 0 || b.token_id() >= vocab || !std::isfinite(b.bias())) {
      return Status::InvalidArgument(name + " logit_bias entry (" + std::to_string(b.token_id()) +
                                     ", " + std::to_string(b.bias()) +
                                     ") needs a token id in [0, " + std::to_string(vocab) +
                                     ") and a finite bias");
    }
  }
  for (const proto::SlotDelta& d : step.deltas()) {
    // Block ids count per dtype (common/kv_arena.h): the slot's dtype bounds
    // them. ApplySlotDelta refuses a slot out of range.
    const int num_blocks =
        d.slot() < slot_specs_.size()
            ? pool_->num_blocks(pool_->arena().dtypes.For(slot_specs_[d.slot()]))
            : 0;
    HW_RETURN_IF_ERROR(ApplySlotDelta(d, num_blocks, next));
  }
  HW_RETURN_IF_ERROR(CheckBlocksCover(*next, slot_specs_, pool_->layout().block_size,
                                      step.start_pos(), end));
  next->num_computed = end;
  return Status::Ok();
}

Status StepExecutor::CheckPromptLogprobs(const proto::SequenceStep& step) const {
  const std::string name = SeqName(step.seq_id());
  const int64_t rows = step.prompt_logprob_token_ids_size();
  if (int64_t(step.prompt_logprobs_first_row()) + rows > step.token_ids_size()) {
    return Status::InvalidArgument(name + " prompt logprob rows [" +
                                   std::to_string(step.prompt_logprobs_first_row()) + ", +" +
                                   std::to_string(rows) + ") outside its " +
                                   std::to_string(step.token_ids_size()) + " tokens");
  }
  if (step.num_prompt_top_logprobs() < 0 ||
      step.num_prompt_top_logprobs() > options_.max_num_logprobs) {
    return Status::InvalidArgument(name + " num_prompt_top_logprobs " +
                                   std::to_string(step.num_prompt_top_logprobs()) +
                                   " out of [0, " + std::to_string(options_.max_num_logprobs) +
                                   "]");
  }
  return CheckTokenIds(name, "prompt logprob token id", step.prompt_logprob_token_ids(),
                       model_->vocab_size());
}

Status StepExecutor::CheckSampling(const std::string& name,
                                   const proto::SamplingParams& p) const {
  const auto bad = [&](const std::string& what, float value, const char* allowed) {
    return Status::InvalidArgument(name + " " + what + " " + std::to_string(value) + " must " +
                                   allowed);
  };
  if (!std::isfinite(p.temperature()) || p.temperature() < 0.0f) {
    return bad("temperature", p.temperature(), "be >= 0");
  }
  if (!std::isfinite(p.top_p()) || p.top_p() < 0.0f || p.top_p() > 1.0f) {
    return bad("top_p", p.top_p(), "lie in (0, 1]");
  }
  if (!(p.min_p() >= 0.0f && p.min_p() <= 1.0f)) return bad("min_p", p.min_p(), "lie in [0, 1]");
  if (!std::isfinite(p.repetition_penalty()) || p.repetition_penalty() < 0.0f) {
    return bad("repetition_penalty", p.repetition_penalty(), "be > 0 (0: off)");
  }
  for (const auto& [what, v] : {std::pair{"frequency_penalty", p.frequency_penalty()},
                                std::pair{"presence_penalty", p.presence_penalty()}}) {
    if (!(v >= -2.0f && v <= 2.0f)) return bad(what, v, "lie in [-2, 2]");
  }
  HW_RETURN_IF_ERROR(
      CheckTokenIds(name, "banned token id", p.banned_token_ids(), model_->vocab_size()));
  HW_RETURN_IF_ERROR(CheckBitmask(name, p.allowed_token_bitmask(), model_->vocab_size()));
  if (p.num_logprobs() < 0 || p.num_logprobs() > options_.max_num_logprobs) {
    return Status::InvalidArgument(name + " num_logprobs " + std::to_string(p.num_logprobs()) +
                                   " out of [0, " + std::to_string(options_.max_num_logprobs) +
                                   "]");
  }
  if (p.num_logprobs() > 0 && !p.logprobs()) {
    return Status::InvalidArgument(name + " num_logprobs " + std::to_string(p.num_logprobs()) +
                                   " without logprobs");
  }
  return Status::Ok();
}

const SequenceSampling* StepExecutor::FindSampling(const StagedStep& staged,
                                                   uint64_t seq_id) const {
  if (auto it = staged.new_sampling.find(seq_id); it != staged.new_sampling.end()) {
    return &it->second;
  }
  auto it = sampling_.find(seq_id);
  return it == sampling_.end() ? nullptr : &it->second;
}

Result<StepExecutor::StagedStep> StepExecutor::Stage(const proto::StepPlan& plan) const {
  if (last_step_id_ && plan.step_id() <= *last_step_id_) {
    return Status::FailedPrecondition("step_id " + std::to_string(plan.step_id()) +
                                      " is not greater than the last step " +
                                      std::to_string(*last_step_id_));
  }
  std::unordered_set<uint64_t> released(plan.released_seq_ids().begin(),
                                        plan.released_seq_ids().end());
  std::unordered_set<uint64_t> seen;
  int64_t n_tokens = 0;
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (!seen.insert(step.seq_id()).second) {
      return Status::InvalidArgument(SeqName(step.seq_id()) + " appears twice in step " +
                                     std::to_string(plan.step_id()));
    }
    if (released.count(step.seq_id())) {
      return Status::InvalidArgument(SeqName(step.seq_id()) + " is both stepped and released");
    }
    n_tokens += step.token_ids_size();
  }
  if (n_tokens > options_.max_tokens_per_step) {
    return Status::InvalidArgument("step " + std::to_string(plan.step_id()) + " has " +
                                   std::to_string(n_tokens) + " tokens, more than " +
                                   std::to_string(options_.max_tokens_per_step));
  }
  StagedStep staged;
  staged.states.resize(plan.seqs_size());
  staged.query_start.push_back(0);
  for (int i = 0; i < plan.seqs_size(); ++i) {
    const proto::SequenceStep& step = plan.seqs(i);
    HW_RETURN_IF_ERROR(StageSequence(step, &staged.states[i]));
    if (step.is_new() && (step.has_processors() || step.has_history())) {
      staged.new_sampling[step.seq_id()] = ToSequenceSampling(step);
    }
    for (int j = 0; j < step.token_ids_size(); ++j) {
      staged.token_ids.push_back(step.token_ids(j));
      staged.positions.push_back(int32_t(step.start_pos() + j));
    }
    staged.start_pos.push_back(int32_t(step.start_pos()));
    staged.query_start.push_back(int32_t(staged.token_ids.size()));
    if (step.sample()) {
      staged.logit_rows.push_back(int32_t(staged.token_ids.size()) - 1);
      staged.sampled_seqs.push_back(i);
    }
  }
  // Prompt rows after every sampled row, so that sampled row r stays logit row r.
  int num_prompt_rows = 0;
  for (int i = 0; i < plan.seqs_size(); ++i) {
    const proto::SequenceStep& step = plan.seqs(i);
    if (step.prompt_logprob_token_ids_size() == 0) continue;
    HW_RETURN_IF_ERROR(CheckPromptLogprobs(step));
    num_prompt_rows += step.prompt_logprob_token_ids_size();
    const int32_t first = staged.query_start[size_t(i)] + int32_t(step.prompt_logprobs_first_row());
    for (int j = 0; j < step.prompt_logprob_token_ids_size(); ++j) {
      staged.logit_rows.push_back(first + j);
    }
    staged.prompt_seqs.push_back(i);
  }
  const int max_prompt_rows = options_.max_prompt_logprob_rows > 0
                                  ? options_.max_prompt_logprob_rows
                                  : MaxPromptLogprobRowsPerStep(model_->vocab_size());
  if (num_prompt_rows > max_prompt_rows) {
    return Status::InvalidArgument("step " + std::to_string(plan.step_id()) + " has " +
                                   std::to_string(num_prompt_rows) +
                                   " prompt logprob rows, more than " +
                                   std::to_string(max_prompt_rows));
  }
  if (int64_t(staged.logit_rows.size()) > model_->max_logit_rows()) {
    return Status::InvalidArgument(
        "step " + std::to_string(plan.step_id()) + " needs the logits of " +
        std::to_string(staged.logit_rows.size()) + " rows; this worker's model computes at most " +
        std::to_string(model_->max_logit_rows()) +
        " (prompt logprobs are not supported on CUDA workers yet)");
  }
  return staged;
}

void StepExecutor::BuildTables(const StagedStep& staged) {
  const int n_kv = model_->num_local_kv_heads();
  const int num_seqs = int(staged.states.size());
  size_t max_blocks = 1;
  for (const SequenceState& s : staged.states) {
    for (const auto& row : s.block_rows) max_blocks = std::max(max_blocks, row.size());
  }
  for (int l = 0; l < model_->spec().num_layers; ++l) {
    std::vector<int32_t>& ids = table_ids_[l];
    ids.assign(size_t(num_seqs) * n_kv * max_blocks, -1);
    for (int s = 0; s < num_seqs; ++s) {
      for (int h = 0; h < n_kv; ++h) {
        const std::vector<int32_t>& row = staged.states[s].block_rows[size_t(l) * n_kv + h];
        std::copy(row.begin(), row.end(), ids.begin() + (size_t(s) * n_kv + h) * max_blocks);
      }
    }
    tables_[l] = LayerBlockTable{ids.data(), n_kv, int(max_blocks)};
  }
}

void StepExecutor::Sample(const proto::StepPlan& plan, const StagedStep& staged,
                          proto::StepResult* result) const {
  const int vocab = model_->vocab_size();
  const int num_rows = int(staged.sampled_seqs.size());
  const std::vector<SampleResult>* picks = model_->device_picks();
  std::vector<SampleResult> sampled(static_cast<size_t>(num_rows));
  // Rows are independent and each is a few passes over the vocabulary (its
  // log-partition alone, computed only when logprobs are wanted, is
  // vocab_size exps): 32 rows took ~7 ms on one thread. Each row's result
  // does not depend on which thread samples it.
  cpu::ParallelFor(num_rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const proto::SequenceStep& step = plan.seqs(staged.sampled_seqs[size_t(r)]);
      const SequenceState& state = staged.states[staged.sampled_seqs[size_t(r)]];
      const proto::SamplingParams& p = step.sampling();
      const bool picked = picks != nullptr && size_t(r) < picks->size() &&
                          (*picks)[size_t(r)].token_id >= 0 && greedy_picks_[size_t(r)] >= 0;
      if (picked) {
        sampled[size_t(r)] = (*picks)[size_t(r)];
        // The device reports a logprob for every pick; host sampling
        // reports none where the request wants none, and the two agree.
        if (!p.logprobs()) sampled[size_t(r)].logprob = 0.0f;
        continue;
      }
      const uint64_t seed = p.has_seed() ? p.seed() : state.rng_seed;
      const double uniform = SeededUniform(seed, step.num_generated());
      const float* logits = logits_.data() + size_t(r) * vocab;
      const SequenceSampling* kept = FindSampling(staged, step.seq_id());
      const LogitProcessors processors = ProcessorsOf(kept, p);
      // No log softmax over the vocabulary unless the request wants logprobs.
      const int num_logprobs = p.logprobs() ? p.num_logprobs() : cpu::kNoLogprobs;
      if (!processors.Active()) {
        sampled[size_t(r)] =
            cpu::Sample(logits, vocab, ToSamplingConfig(p), uniform, num_logprobs);
        continue;
      }
      // Sampled from the processed logits; the logprobs returned are the
      // raw ones, as vLLM returns by default.
      thread_local std::vector<float> processed;
      processed.assign(logits, logits + vocab);
      static const SequenceSampling kNothingKept;
      cpu::ApplyLogitProcessors(processed.data(), vocab, processors,
                                (kept ? kept : &kNothingKept)->history);
      sampled[size_t(r)] =
          cpu::Sample(processed.data(), vocab, ToSamplingConfig(p), uniform, cpu::kNoLogprobs);
      if (p.logprobs()) cpu::FillLogprobs(logits, vocab, p.num_logprobs(), &sampled[size_t(r)]);
    }
  });
  for (int r = 0; r < num_rows; ++r) {
    const SampleResult& s = sampled[size_t(r)];
    proto::SampledToken* t = result->add_tokens();
    t->set_seq_id(plan.seqs(staged.sampled_seqs[size_t(r)]).seq_id());
    t->set_token_id(s.token_id);
    t->set_logprob(s.logprob);
    for (const auto& [id, lp] : s.top_logprobs) {
      proto::TopLogprob* top = t->add_top_logprobs();
      top->set_token_id(id);
      top->set_logprob(lp);
    }
  }
}

void StepExecutor::FillPromptLogprobs(const proto::StepPlan& plan, const StagedStep& staged,
                                      proto::StepResult* result) const {
  if (staged.prompt_seqs.empty()) return;
  const int vocab = model_->vocab_size();
  // Logit row of each prompt row, and the plan step it belongs to.
  std::vector<std::pair<int, int>> rows;  // (plan index, index in its targets)
  for (int index : staged.prompt_seqs) {
    for (int j = 0; j < plan.seqs(index).prompt_logprob_token_ids_size(); ++j) {
      rows.emplace_back(index, j);
    }
  }
  const size_t first_row = staged.sampled_seqs.size();
  std::vector<SampleResult> out(rows.size());
  std::vector<int32_t> ranks(rows.size());
  cpu::ParallelFor(int64_t(rows.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const proto::SequenceStep& step = plan.seqs(rows[size_t(r)].first);
      const int32_t token = step.prompt_logprob_token_ids(rows[size_t(r)].second);
      const float* logits = logits_.data() + (first_row + size_t(r)) * vocab;
      SampleResult& s = out[size_t(r)];
      s.token_id = token;
      cpu::FillLogprobs(logits, vocab, step.num_prompt_top_logprobs(), &s);
      ranks[size_t(r)] = 1 + int32_t(std::count_if(logits, logits + vocab,
                                                   [&](float v) { return v > logits[token]; }));
    }
  });
  size_t r = 0;
  for (int index : staged.prompt_seqs) {
    proto::PromptLogprobs* p = result->add_prompt_logprobs();
    p->set_seq_id(plan.seqs(index).seq_id());
    for (int j = 0; j < plan.seqs(index).prompt_logprob_token_ids_size(); ++j, ++r) {
      proto::SampledToken* t = p->add_positions();
      t->set_seq_id(plan.seqs(index).seq_id());
      t->set_token_id(out[r].token_id);
      t->set_logprob(out[r].logprob);
      t->set_rank(ranks[r]);
      for (const auto& [id, lp] : out[r].top_logprobs) {
        proto::TopLogprob* top = t->add_top_logprobs();
        top->set_token_id(id);
        top->set_logprob(lp);
      }
    }
  }
}

proto::StepResult StepExecutor::Execute(const proto::StepPlan& plan) {
  proto::StepResult result;
  result.set_step_id(plan.step_id());
  result.set_tp_rank(uint32_t(options_.tp_rank));
  Result<StagedStep> staged = Stage(plan);
  if (!staged.ok()) {
    result.set_error(staged.status().ToString());
    result.set_code(StatusCodeToProto(staged.status().code()));
    return result;
  }
  if (!staged->token_ids.empty()) {
    BuildTables(*staged);
    ForwardBatch batch;
    batch.token_ids = staged->token_ids.data();
    batch.positions = staged->positions.data();
    batch.layout.num_seqs = int(staged->states.size());
    batch.layout.query_start = staged->query_start.data();
    batch.layout.start_pos = staged->start_pos.data();
    batch.tables = tables_.data();
    batch.logit_rows = staged->logit_rows.data();
    batch.num_logit_rows = int(staged->logit_rows.size());
    // Greedy rows may be picked where the logits are (a GPU); the others
    // are sampled here from copied logits.
    greedy_picks_.clear();
    for (int index : staged->sampled_seqs) {
      const proto::SamplingParams& p = plan.seqs(index).sampling();
      const bool greedy = ToSamplingConfig(p).temperature <= 0.0f;
      const bool processed =
          HasProcessors(FindSampling(*staged, plan.seqs(index).seq_id()), p);
      greedy_picks_.push_back(greedy && !processed ? p.num_logprobs() : -1);
    }
    greedy_picks_.resize(staged->logit_rows.size(), -1);  // prompt rows: logits on the host
    batch.greedy_picks = greedy_picks_.data();
    if (Status forward = model_->Forward(batch, pool_, &logits_); !forward.ok()) {
      // Only the collectives fail inside Forward, and they leave the TP group
      // broken: no later step can succeed on this rank.
      result.set_error(forward.ToString());
      result.set_code(StatusCodeToProto(forward.code()));
      result.set_fatal(true);
      return result;
    }
    if (options_.tp_rank == 0) {
      Sample(plan, *staged, &result);
      FillPromptLogprobs(plan, *staged, &result);
    }
    // Up to kPromptLogprobLogitBytesPerStep more than a step samples: not
    // kept for the steps after.
    if (!staged->prompt_seqs.empty()) {
      logits_.clear();
      logits_.shrink_to_fit();
    }
  }
  // Commit.
  for (SequenceState& s : staged->states) {
    const uint64_t id = s.seq_id;
    sequences_[id] = std::move(s);
  }
  for (auto& [id, kept] : staged->new_sampling) sampling_[id] = std::move(kept);
  for (const proto::SampledToken& t : result.tokens()) {
    if (auto it = sampling_.find(t.seq_id()); it != sampling_.end() && it->second.counts) {
      ++it->second.history.output_counts[t.token_id()];
    }
  }
  for (uint64_t id : plan.released_seq_ids()) {
    sequences_.erase(id);
    sampling_.erase(id);
  }
  last_step_id_ = plan.step_id();
  return result;
}

}  // namespace headway
