// How many Gemma 3 sequences of 4,096 positions one rank's KV pool admits
// at once (Scheduler::MaxConcurrentAt under the default admission, the
// same count the coordinator logs at startup), for recycling off and on
// and KV cache dtypes per slot kind, at one fixed pool size. Pure
// arithmetic over the real model's slot specs: deterministic, no timing.
// The figures are printed; bench/README.md quotes them.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/kv_arena.h"
#include "common/model_spec.h"
#include "coordinator/scheduling/scheduler.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

constexpr int kBlock = 16;
constexpr int64_t kPoolBytes = int64_t(296) << 20;  // bench/recycling_bench.py's gemma3 pool
constexpr int64_t kPositions = 4096;

struct Variant {
  const char* name;
  bool recycling;
  KvCacheDtypes dtypes;
};

int Admitted(const ModelSpec& spec, const Variant& v) {
  const KvArenaLayout arena = MakeKvArenaLayout(kBlock, spec.head_dim, v.dtypes, spec.slot_specs);
  KvCacheOptions options;
  options.enable_recycling = v.recycling;
  options.dtypes = v.dtypes;
  const int num_chunks = int(kPoolBytes / int64_t(arena.chunk_bytes));
  SchedulerConfig config;
  config.max_num_seqs = 1000;  // the pool, not max_num_seqs, sets the count
  Scheduler scheduler(config,
                      std::make_unique<KvCacheManager>(spec, 1, kBlock,
                                                       std::vector<int>{num_chunks}, options));
  return scheduler.MaxConcurrentAt(kPositions);
}

TEST(KvCapacityTest, Gemma3SequencesAdmittedPerDtypeAndRecycling) {
  HW_REQUIRE_MODEL(testing::Gemma3Path());
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(testing::Gemma3Path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelSpec> spec = LoadModelSpec(**file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  using D = KvCacheDtype;
  const std::vector<Variant> variants = {
      {"float32, recycling off", false, {D::kFloat32, D::kFloat32}},
      {"float32", true, {D::kFloat32, D::kFloat32}},
      {"float32 + q8_0 sliding", true, {D::kFloat32, D::kQ8_0}},
      {"float16 + q8_0 sliding", true, {D::kFloat16, D::kQ8_0}},
      {"float16", true, {D::kFloat16, D::kFloat16}},
      {"q8_0", true, {D::kQ8_0, D::kQ8_0}},
      {"q8_0 + q4_0_hadamard sliding", true, {D::kQ8_0, D::kQ4_0Hadamard}},
  };
  std::vector<int> admitted;
  for (const Variant& v : variants) admitted.push_back(Admitted(*spec, v));
  std::printf("Gemma 3 sequences of %lld positions admitted at once in %lld MiB "
              "(max_num_batched_tokens 512, prefix caching on):\n",
              static_cast<long long>(kPositions), static_cast<long long>(kPoolBytes >> 20));
  for (size_t i = 0; i < variants.size(); ++i) {
    std::printf("  %-30s %3d  (%.2fx)\n", variants[i].name, admitted[i],
                double(admitted[i]) / double(admitted[0]));
  }
  ASSERT_GT(admitted[0], 0);
  // Smaller blocks never admit fewer sequences, and recycling never hurts.
  EXPECT_GE(admitted[1], admitted[0]);
  EXPECT_GE(admitted[2], admitted[1]);
  EXPECT_GE(admitted[3], admitted[2]);
  EXPECT_GE(admitted[5], admitted[4]);
}

}  // namespace
}  // namespace headway
