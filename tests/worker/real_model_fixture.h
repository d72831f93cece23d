// A step executor over a real model loaded from its GGUF, for tests that
// compare the forward pass with reference data (tests/data/reference/).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/gguf.h"
#include "common/kv_arena.h"
#include "common/model_spec.h"
#include "kernels/matmul.h"
#include "kernels/reference/quant_matmul_8bit_act.h"
#include "tests/support/test_env.h"
#include "tests/worker/block_granter.h"
#include "worker/decoder_model.h"
#include "worker/linear.h"
#include "worker/step_executor.h"

namespace headway::testing {

inline nlohmann::json ReadJson(const std::string& relative) {
  std::ifstream in(TestDataPath(relative));
  EXPECT_TRUE(in.good()) << "cannot read " << TestDataPath(relative);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The TP-1 model of the GGUF at `path`; nullptr when the file is absent, or
// (with a test failure recorded) when it does not load.
// The TP-1 weights and spec of the GGUF at `path`; nullptr (with a test
// failure recorded) when it does not load.
inline std::unique_ptr<ModelWeights> LoadRealWeights(const std::string& path, ModelSpec* spec) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return nullptr;
  auto loaded_spec = LoadModelSpec(**file);
  EXPECT_TRUE(loaded_spec.ok()) << loaded_spec.status().ToString();
  if (!loaded_spec.ok()) return nullptr;
  *spec = *loaded_spec;
  auto weights = ModelWeights::Load(**file, *spec, ShardForRank(*spec, 1, 0));
  EXPECT_TRUE(weights.ok()) << weights.status().ToString();
  return weights.ok() ? std::move(weights).value() : nullptr;
}

inline std::unique_ptr<DecoderModel> LoadRealModel(const std::string& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  ModelSpec spec;
  std::unique_ptr<ModelWeights> weights = LoadRealWeights(path, &spec);
  if (weights == nullptr) return nullptr;
  auto model = DecoderModel::Create(spec, std::move(weights));
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return nullptr;
  return std::move(model).value();
}

inline std::vector<int32_t> Ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// Max |logits[id] - ref| over the reference's first `n` (id, logit) pairs.
inline float MaxDiff(const std::vector<float>& logits, const nlohmann::json& ids,
                     const nlohmann::json& ref, int n) {
  float max_diff = 0.0f;
  for (int i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(logits[ids[i].get<int>()] - ref[i].get<float>()));
  }
  return max_diff;
}

// Expects the reference's top-10 tokens among ours, except those within
// `slack` of the reference's 11th logit (near-equal logits may swap there).
inline void ExpectTop10(const std::vector<float>& logits, const nlohmann::json& ids,
                        const nlohmann::json& ref, float slack) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 10, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  const std::set<int32_t> ours(order.begin(), order.begin() + 10);
  for (int i = 0; i < 10; ++i) {
    if (ref[i].get<float>() - ref[10].get<float>() > slack) {
      EXPECT_TRUE(ours.count(ids[i].get<int>())) << "reference #" << i << " token " << ids[i];
    }
  }
  if (ref[0].get<float>() - ref[1].get<float>() > slack) {
    EXPECT_EQ(order[0], ids[0].get<int>());
  }
}

// Lends the chunks of an arena (common/kv_arena.h) to its block classes in
// the order they run out, from the lowest chunk up or the highest down, and
// hands out each class's ids of its chunks in turn: the coordinator's
// allocator may place a class's blocks in any chunk, so where they land must
// not change a result.
class ChunkLender {
 public:
  ChunkLender(const KvArenaLayout& arena, int num_chunks, bool from_top)
      : arena_(arena), num_chunks_(num_chunks), from_top_(from_top) {}

  // The next block id of `dtype`; -1 (and a test failure) once every chunk
  // is lent.
  int32_t Next(KvCacheDtype dtype) {
    Class& c = classes_[dtype];
    if (c.left == 0) {
      EXPECT_LT(lent_, num_chunks_) << "the arena's chunks are all lent";
      if (lent_ >= num_chunks_) return -1;
      const int chunk = from_top_ ? num_chunks_ - 1 - lent_ : lent_;
      ++lent_;
      c.left = arena_.BlocksPerChunk(dtype);
      c.next = int32_t(chunk * c.left);
    }
    --c.left;
    return c.next++;
  }

 private:
  struct Class {
    int32_t next = 0;
    int left = 0;
  };
  const KvArenaLayout arena_;
  const int num_chunks_;
  const bool from_top_;
  int lent_ = 0;
  std::map<KvCacheDtype, Class> classes_;
};

// Runs plans on one model through a StepExecutor with its own pool, giving
// each sequence's slots fresh blocks as its positions grow.
// The arithmetic paths the reference tests compare (worker/linear.h).
enum class MatmulPath {
  kQuantisedF32Act,   // stored blocks, f32 activations: ApplyLinear (serving)
  kQuantised8BitAct,  // stored blocks, activations rounded to 8 bits (llama.cpp)
  kF32,               // weights dequantised to f32, sgemm: ApplyLinearDequantised's
                      // arithmetic, each matrix dequantised once (ApplyLinearF32Cached)
};

// llama.cpp's arithmetic where the matrix is held quantised, else serving's.
inline void ApplyLinear8BitAct(const LinearWeight& w, const float* x, int m, float* y) {
  if (!w.has_quant()) return ApplyLinear(w, x, m, y);
  reference::QuantMatmulTransB8BitAct(x, w.quant.data(), w.quant_type, m, w.rows, w.cols, y);
}

// The f32 copies of the quantised matrices that ApplyLinearF32Cached has
// used, keyed by the LinearWeight's address (the models are loaded once per
// test process and never change). Each copy is the matrix's whole
// dequantisation, 4 bytes per weight: the copies live only while a test
// runs the kF32 path (SetMatmulPath drops them), never on the serving path.
struct F32WeightCache {
  std::mutex mu;
  std::unordered_map<const LinearWeight*, std::vector<float>> copies;  // guarded by mu

  static F32WeightCache& Get() {
    static F32WeightCache cache;
    return cache;
  }
  // [w.rows, w.cols]: dequantised on the first call for `w`.
  const std::vector<float>& Of(const LinearWeight& w) {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, inserted] = copies.try_emplace(&w);
    if (inserted) it->second = w.ToF32();
    return it->second;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu);
    copies.clear();
  }
};

// ApplyLinearDequantised's arithmetic (sgemm on the dequantised matrix) with
// each matrix dequantised once per test instead of tile by tile on every
// call, which made the f32 reference tests ten times slower.
inline void ApplyLinearF32Cached(const LinearWeight& w, const float* x, int m, float* y) {
  if (!w.has_quant() || m <= 0 || w.rows <= 0) return ApplyLinear(w, x, m, y);
  cpu::MatmulTransB(x, F32WeightCache::Get().Of(w).data(), m, w.rows, w.cols, y);
}

inline LinearFn LinearFnOf(MatmulPath path) {
  switch (path) {
    case MatmulPath::kQuantised8BitAct: return &ApplyLinear8BitAct;
    case MatmulPath::kF32: return &ApplyLinearF32Cached;
    default: return &ApplyLinear;
  }
}

class RealModelFixture : public ::testing::Test {
 protected:
  static constexpr int kBlockSize = 16;

  // Starts a fresh pool and executor on the TP-1 model of the GGUF at
  // `path`, loaded once per test process and shared by every test in it
  // (loading takes seconds; the executors never change the weights). Fails
  // the test when the model does not load; call through
  // ASSERT_NO_FATAL_FAILURE.
  void StartExecutorOnModel(const std::string& path, int64_t pool_bytes) {
    static std::map<std::string, std::unique_ptr<DecoderModel>> loaded;
    std::unique_ptr<DecoderModel>& model = loaded[path];
    if (model == nullptr) model = LoadRealModel(path);
    ASSERT_NE(model, nullptr) << "cannot load " << path;
    StartExecutor(model.get(), pool_bytes);
  }

  // REQUIRES: `model` outlives the executor's use of it.
  void StartExecutor(ForwardModel* model, int64_t pool_bytes) {
    StartExecutor(model,
                  std::move(KvPool::Create({kBlockSize, model->spec().head_dim}, pool_bytes))
                      .value());
  }

  // As above, on a pool of `pool_bytes` laid out as `arena` (made for the
  // model's slots, block size kBlockSize), its chunks lent by a ChunkLender
  // (`from_top`).
  void StartExecutorOnArena(ForwardModel* model, const KvArenaLayout& arena, int64_t pool_bytes,
                            bool from_top) {
    Result<std::unique_ptr<KvPool>> pool = KvPool::CreateArena(arena, pool_bytes);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    StartExecutor(model, std::move(pool).value());
    auto lender = std::make_shared<ChunkLender>(arena, pool_->num_chunks(), from_top);
    granter_->set_id_source([lender, arena, model](int slot) {
      return lender->Next(arena.dtypes.For(model->slot_spec(slot)));
    });
  }

  // As above, on a pool made elsewhere (a CUDA device's), with block_size
  // kBlockSize.
  void StartExecutor(ForwardModel* model, std::unique_ptr<KvPool> pool) {
    model_ = model;
    pool_ = std::move(pool);
    StepExecutorOptions options;
    options.seed_base = 1;
    executor_ = std::make_unique<StepExecutor>(model_, pool_.get(), options);
    granter_.emplace(model_->num_slots(), kBlockSize);
  }

  // Adds `tokens` of `seq_id` at `start_pos` (a new sequence at 0), giving
  // every slot the blocks the new positions need.
  proto::SequenceStep* Add(proto::StepPlan* plan, uint64_t seq_id,
                           const std::vector<int32_t>& tokens, uint32_t start_pos, bool sample) {
    proto::SequenceStep* step =
        granter_->AddStep(plan, seq_id, tokens, start_pos, start_pos == 0, sample);
    step->mutable_sampling()->set_logprobs(true);
    step->mutable_sampling()->set_num_logprobs(5);
    return step;
  }

  // Greedy continuations of `prompts` run together in one batch, each
  // prefilled in chunks of `chunk` tokens; returns `n` tokens per prompt.
  std::vector<std::vector<int32_t>> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                             int n, int chunk) {
    std::vector<std::vector<int32_t>> out(prompts.size());
    std::vector<uint32_t> pos(prompts.size(), 0);
    bool done = false;
    while (!done) {
      proto::StepPlan plan;
      plan.set_step_id(++step_id_);
      for (size_t i = 0; i < prompts.size(); ++i) {
        const uint64_t seq = seq_base_ + i;
        if (pos[i] < prompts[i].size()) {
          const size_t len = std::min<size_t>(chunk, prompts[i].size() - pos[i]);
          std::vector<int32_t> part(prompts[i].begin() + pos[i],
                                    prompts[i].begin() + pos[i] + len);
          Add(&plan, seq, part, pos[i], pos[i] + len == prompts[i].size());
          pos[i] += uint32_t(len);
        } else if (int(out[i].size()) < n) {
          Add(&plan, seq, {out[i].back()}, pos[i], true)->set_num_generated(out[i].size());
          pos[i] += 1;
        }
      }
      proto::StepResult r = executor_->Execute(plan);
      EXPECT_EQ(r.error(), "");
      if (!r.error().empty()) break;
      for (const proto::SampledToken& t : r.tokens()) {
        out[t.seq_id() - seq_base_].push_back(t.token_id());
      }
      done = true;
      for (const auto& o : out) done = done && int(o.size()) >= n;
    }
    seq_base_ += 1000;
    return out;
  }

  // How Headway's greedy tokens compared with one reference case's.
  struct GreedyAgreement {
    int compared = 0;         // steps where llama.cpp's top-2 margin >= tie_margin
    int agreed = 0;           // of those, steps where the tokens are equal
    int first_mismatch = -1;  // first step (any margin) where they differ; -1: none
  };

  // Decodes each reference case's llama.cpp greedy continuation ("greedy_ids")
  // token by token for `horizon` steps, all cases in one batch (teacher
  // forcing through the decode path, so one near-tie does not end the
  // comparison), and expects Headway's greedy token to be llama.cpp's at
  // every step where llama.cpp's top-2 margin ("greedy_margins") is at least
  // `tie_margin`. Prints and returns the per-case agreement; empty (with a
  // failure recorded) when a step fails.
  std::vector<GreedyAgreement> TeacherForcedGreedy(const nlohmann::json& ref, int horizon,
                                                   float tie_margin) {
    const nlohmann::json& cases = ref["cases"];
    const size_t num = cases.size();
    std::vector<GreedyAgreement> result(num);
    std::vector<uint32_t> pos(num);
    for (int step = 0; step < horizon; ++step) {
      proto::StepPlan plan;
      plan.set_step_id(++step_id_);
      for (size_t i = 0; i < num; ++i) {
        const std::vector<int32_t> input =
            step == 0 ? Ids(cases[i]["prompt_ids"])
                      : std::vector<int32_t>{cases[i]["greedy_ids"][step - 1].get<int32_t>()};
        Add(&plan, seq_base_ + i, input, pos[i], true)->set_num_generated(step);
        pos[i] += uint32_t(input.size());
      }
      proto::StepResult r = executor_->Execute(plan);
      EXPECT_EQ(r.error(), "");
      EXPECT_EQ(r.tokens_size(), int(num));
      if (!r.error().empty() || r.tokens_size() != int(num)) return {};
      for (size_t i = 0; i < num; ++i) {
        const int32_t expected = cases[i]["greedy_ids"][step].get<int32_t>();
        const float margin = cases[i]["greedy_margins"][step].get<float>();
        GreedyAgreement& a = result[i];
        const bool same = r.tokens(i).token_id() == expected;
        if (!same && a.first_mismatch < 0) a.first_mismatch = step;
        if (margin < tie_margin) continue;
        ++a.compared;
        a.agreed += same;
        EXPECT_TRUE(same) << cases[i]["name"] << " step " << step << ": Headway "
                          << r.tokens(i).token_id() << ", llama.cpp " << expected
                          << " (llama.cpp margin " << margin << ")";
      }
    }
    seq_base_ += 1000;
    for (size_t i = 0; i < num; ++i) {
      std::printf("[ measured ] %s: %d/%d non-tie steps agree; first disagreement (any "
                  "margin) at step %d\n",
                  cases[i]["name"].get<std::string>().c_str(), result[i].agreed,
                  result[i].compared, result[i].first_mismatch);
    }
    return result;
  }

  // Switches the CPU model's matmul path (worker/linear.h).
  void SetMatmulPath(MatmulPath path) {
    auto* cpu_model = dynamic_cast<DecoderModel*>(model_);
    ASSERT_NE(cpu_model, nullptr) << "not a CPU model";
    cpu_model->TEST_set_linear(LinearFnOf(path));
    if (path != MatmulPath::kF32) F32WeightCache::Get().Clear();
  }

  // Steps compared over all cases.
  static int TotalCompared(const std::vector<GreedyAgreement>& cases) {
    int total = 0;
    for (const GreedyAgreement& a : cases) total += a.compared;
    return total;
  }

  // Prefills every reference prompt in one batch and returns the logits of
  // each prompt's last position, [num_cases][vocab].
  std::vector<std::vector<float>> LastPromptLogits(const nlohmann::json& ref) {
    proto::StepPlan plan;
    plan.set_step_id(++step_id_);
    for (const nlohmann::json& c : ref["cases"]) {
      Add(&plan, seq_base_++, Ids(c["prompt_ids"]), 0, true);
    }
    EXPECT_EQ(executor_->Execute(plan).error(), "");
    const size_t vocab = size_t(model_->vocab_size());
    std::vector<std::vector<float>> out;
    const std::vector<float>& all = executor_->TEST_last_logits();
    EXPECT_EQ(all.size(), vocab * ref["cases"].size());
    for (size_t i = 0; i * vocab < all.size(); ++i) {
      out.emplace_back(all.begin() + i * vocab, all.begin() + (i + 1) * vocab);
    }
    return out;
  }

  ForwardModel* model_ = nullptr;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<StepExecutor> executor_;
  std::optional<BlockGranter> granter_;  // set by StartExecutor
  uint64_t step_id_ = 0;
  uint64_t seq_base_ = 100;
};

}  // namespace headway::testing
