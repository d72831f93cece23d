#include "worker/cuda/step_metadata.h"

#include <algorithm>
#include <cstring>

namespace headway::cuda {

size_t StepMetadataInts(const ForwardBatch& batch, int num_layers) {
  const size_t n = size_t(batch.layout.num_tokens());
  const size_t seqs = size_t(batch.layout.num_seqs);
  const LayerBlockTable& t = batch.tables[0];
  const size_t table_ints = seqs * size_t(t.num_kv_heads) * size_t(t.max_blocks);
  return 3 * n + (seqs + 1) + seqs + size_t(batch.num_logit_rows) + table_ints * num_layers;
}

StepMetadataLayout PackStepMetadata(const ForwardBatch& batch, int num_layers, int32_t* host) {
  const int n = batch.layout.num_tokens();
  const int num_seqs = batch.layout.num_seqs;
  const int n_kv = batch.tables[0].num_kv_heads;
  const int max_blocks = batch.tables[0].max_blocks;
  StepMetadataLayout m;
  auto put = [&](const int32_t* src, size_t count) {
    if (count > 0) std::memcpy(host + m.total, src, count * sizeof(int32_t));  // src may be null at 0
    const size_t at = m.total;
    m.total += count;
    return at;
  };
  m.token_ids = put(batch.token_ids, size_t(n));
  m.positions = put(batch.positions, size_t(n));
  m.token_seq = m.total;
  for (int s = 0; s < num_seqs; ++s) {
    const int begin = batch.layout.query_start[s];
    const int end = batch.layout.query_start[s + 1];
    for (int t = begin; t < end; ++t) host[m.token_seq + t] = s;
    m.max_query_len = std::max(m.max_query_len, end - begin);
    m.max_context_len = std::max(m.max_context_len, batch.layout.start_pos[s] + end - begin);
  }
  m.total += size_t(n);
  m.query_start = put(batch.layout.query_start, size_t(num_seqs) + 1);
  m.start_pos = put(batch.layout.start_pos, size_t(num_seqs));
  m.logit_rows = put(batch.logit_rows, size_t(batch.num_logit_rows));
  const size_t table_ints = size_t(num_seqs) * n_kv * max_blocks;
  for (int l = 0; l < num_layers; ++l) {
    const LayerBlockTable& t = batch.tables[l];
    HW_CHECK(t.num_kv_heads == n_kv && t.max_blocks == max_blocks);
    m.tables.push_back(put(t.block_ids, table_ints));
  }
  return m;
}

}  // namespace headway::cuda
