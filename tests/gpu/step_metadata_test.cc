// The host half of the CUDA forward pass: packing a step's metadata for its
// one copy to the device. Runs without a GPU.
#include "worker/cuda/step_metadata.h"

#include <gtest/gtest.h>

#include <vector>

namespace headway::cuda {
namespace {

TEST(StepMetadataTest, PacksEveryArrayAtItsOffset) {
  // Two sequences: a 3-token prefill chunk over 5 cached positions, and a
  // decode token at position 9; two layers, 2 KV heads, 3 blocks per row.
  const std::vector<int32_t> tokens = {11, 12, 13, 14};
  const std::vector<int32_t> positions = {5, 6, 7, 9};
  const std::vector<int32_t> query_start = {0, 3, 4};
  const std::vector<int32_t> start_pos = {5, 9};
  const std::vector<int32_t> logit_rows = {2, 3};
  std::vector<std::vector<int32_t>> ids(2);
  std::vector<LayerBlockTable> tables;
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < 2 * 2 * 3; ++i) ids[l].push_back(100 * (l + 1) + i);
    tables.push_back(LayerBlockTable{ids[l].data(), 2, 3});
  }
  ForwardBatch batch;
  batch.token_ids = tokens.data();
  batch.positions = positions.data();
  batch.layout = BatchLayout{2, query_start.data(), start_pos.data()};
  batch.tables = tables.data();
  batch.logit_rows = logit_rows.data();
  batch.num_logit_rows = 2;

  const size_t total = StepMetadataInts(batch, 2);
  EXPECT_EQ(total, size_t(3 * 4 + 3 + 2 + 2 + 2 * 12));
  std::vector<int32_t> host(total + 1, -7);  // one guard value past the end
  const StepMetadataLayout m = PackStepMetadata(batch, 2, host.data());
  EXPECT_EQ(m.total, total);
  EXPECT_EQ(host[total], -7);
  auto at = [&](size_t offset, size_t count) {
    return std::vector<int32_t>(host.begin() + offset, host.begin() + offset + count);
  };
  EXPECT_EQ(at(m.token_ids, 4), tokens);
  EXPECT_EQ(at(m.positions, 4), positions);
  EXPECT_EQ(at(m.token_seq, 4), (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(at(m.query_start, 3), query_start);
  EXPECT_EQ(at(m.start_pos, 2), start_pos);
  EXPECT_EQ(at(m.logit_rows, 2), logit_rows);
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(at(m.tables[0], 12), ids[0]);
  EXPECT_EQ(at(m.tables[1], 12), ids[1]);
  EXPECT_EQ(m.max_query_len, 3);
  EXPECT_EQ(m.max_context_len, 10);
}

TEST(StepMetadataTest, NoLogitRowsPacksNothingForThem) {
  const std::vector<int32_t> tokens = {1}, positions = {0}, query_start = {0, 1}, start_pos = {0};
  std::vector<int32_t> ids = {4};
  LayerBlockTable table{ids.data(), 1, 1};
  ForwardBatch batch;
  batch.token_ids = tokens.data();
  batch.positions = positions.data();
  batch.layout = BatchLayout{1, query_start.data(), start_pos.data()};
  batch.tables = &table;
  std::vector<int32_t> host(StepMetadataInts(batch, 1));
  const StepMetadataLayout m = PackStepMetadata(batch, 1, host.data());
  EXPECT_EQ(m.total, host.size());
  EXPECT_EQ(m.logit_rows, m.tables[0]);
  EXPECT_EQ(host[m.tables[0]], 4);
}

}  // namespace
}  // namespace headway::cuda
