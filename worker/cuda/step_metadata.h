// A step's metadata packed for one host-to-device copy: the CUDA forward
// pass sends token ids, positions, the row -> sequence map, the batch
// layout, the logit rows and every layer's block table as one int32 array.
// Host code only (tested without a GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/forward_model.h"

namespace headway::cuda {

// Offsets (in int32s) of each array in the packed buffer, and what the
// attention kernels need to size their grids.
struct StepMetadataLayout {
  size_t token_ids = 0;    // [n_tokens]
  size_t positions = 0;    // [n_tokens]
  size_t token_seq = 0;    // [n_tokens]: sequence index of each row
  size_t query_start = 0;  // [num_seqs + 1]
  size_t start_pos = 0;    // [num_seqs]
  size_t logit_rows = 0;   // [num_logit_rows]
  std::vector<size_t> tables;  // per layer: [num_seqs, num_kv_heads, max_blocks]
  size_t total = 0;            // int32s used
  int max_query_len = 0;       // longest chunk of the step
  int max_context_len = 0;     // longest start_pos + chunk
};

// int32s PackStepMetadata writes for `batch` over `num_layers` layers.
// REQUIRES: batch.tables has num_layers entries, all with one max_blocks.
size_t StepMetadataInts(const ForwardBatch& batch, int num_layers);

// Writes the arrays into host[0, StepMetadataInts(batch, num_layers)) in the
// order of StepMetadataLayout's fields and returns their offsets.
// REQUIRES: as StepMetadataInts; every layer's table has the same
// num_kv_heads and max_blocks (checked: HW_CHECK).
StepMetadataLayout PackStepMetadata(const ForwardBatch& batch, int num_layers, int32_t* host);

}  // namespace headway::cuda
