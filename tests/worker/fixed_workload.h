// A fixed batch for comparing forward passes (TP sizes, devices): two
// prompts of different lengths prefilled together, then decoded together
// for kDecodeSteps steps with given tokens, through ForwardModel::Forward
// directly (no executor), with every slot's blocks laid out ahead.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

#include "common/status.h"
#include "kernels/kv_cache.h"
#include "worker/forward_model.h"
#include "worker/kv_pool.h"

namespace headway::testing {

inline constexpr int kWorkloadDecodeSteps = 6;
inline const std::vector<std::vector<int32_t>> kWorkloadPrompts = {
    {1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 2, 1, 40, 41, 42, 43, 44},
    {1, 300, 17, 250, 9}};

// Logits of rank 0 per step: [step][row * vocab + v] (one row per prompt).
using StepLogits = std::vector<std::vector<float>>;

// Blocks the workload needs on one rank: every (prompt, layer, local KV
// head) gets `max_blocks` of them.
inline int WorkloadBlocks(const ForwardModel& model, int max_blocks) {
  return int(kWorkloadPrompts.size()) * model.spec().num_layers * model.num_local_kv_heads() *
         max_blocks;
}

// Runs the prefill and then decode step s with decode_tokens[s][prompt],
// appending rank 0's logits of every step to `out`. Block ids of the
// (prompt, layer, head) rows are scattered over the pool (id = 7 * index mod
// num_blocks, a permutation as long as 7 does not divide num_blocks).
// REQUIRES: pool->num_blocks() == WorkloadBlocks(*model, max_blocks);
// max_blocks * block_size covers the longest prompt plus kWorkloadDecodeSteps.
inline Status RunWorkload(ForwardModel* model, KvPool* pool, int max_blocks,
                          const std::vector<std::vector<int32_t>>& decode_tokens, StepLogits* out) {
  if (pool->num_blocks() != WorkloadBlocks(*model, max_blocks) || pool->num_blocks() % 7 == 0) {
    return Status::InvalidArgument(
        "the workload needs a pool of WorkloadBlocks() blocks, not a "
        "multiple of 7");
  }
  const int num_seqs = int(kWorkloadPrompts.size());
  const int n_kv = model->num_local_kv_heads();
  const int num_layers = model->spec().num_layers;
  const size_t per_layer = size_t(num_seqs) * n_kv * max_blocks;
  std::vector<std::vector<int32_t>> ids(num_layers);
  std::vector<LayerBlockTable> tables(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    ids[l].resize(per_layer);
    for (size_t i = 0; i < per_layer; ++i) {
      ids[l][i] = int32_t((7 * (size_t(l) * per_layer + i)) % size_t(pool->num_blocks()));
    }
    tables[l] = LayerBlockTable{ids[l].data(), n_kv, max_blocks};
  }
  std::vector<int32_t> lengths(num_seqs, 0);
  for (int step = 0; step <= kWorkloadDecodeSteps; ++step) {
    std::vector<int32_t> tokens, positions, query_start{0}, start_pos, rows;
    for (int s = 0; s < num_seqs; ++s) {
      const std::vector<int32_t> chunk =
          step == 0 ? kWorkloadPrompts[s] : std::vector<int32_t>{decode_tokens[step - 1][s]};
      start_pos.push_back(lengths[s]);
      for (size_t i = 0; i < chunk.size(); ++i) {
        tokens.push_back(chunk[i]);
        positions.push_back(lengths[s] + int32_t(i));
      }
      lengths[s] += int32_t(chunk.size());
      query_start.push_back(int32_t(tokens.size()));
      rows.push_back(int32_t(tokens.size()) - 1);
    }
    ForwardBatch batch;
    batch.token_ids = tokens.data();
    batch.positions = positions.data();
    batch.layout = BatchLayout{num_seqs, query_start.data(), start_pos.data()};
    batch.tables = tables.data();
    batch.logit_rows = rows.data();
    batch.num_logit_rows = int(rows.size());
    std::vector<float> logits;
    HW_RETURN_IF_ERROR(model->Forward(batch, pool, &logits));
    if (model->shard().tp_rank == 0) {
      out->push_back(std::move(logits));
    } else if (!logits.empty()) {
      return Status::Internal("rank " + std::to_string(model->shard().tp_rank) +
                              " returned logits");
    }
  }
  return Status::Ok();
}

// The argmax of every row of every step: [step][prompt].
inline std::vector<std::vector<int32_t>> GreedyTokens(const StepLogits& logits, int vocab) {
  std::vector<std::vector<int32_t>> tokens;
  for (const std::vector<float>& step : logits) {
    std::vector<int32_t> per_seq;
    for (size_t row = 0; row * vocab < step.size(); ++row) {
      auto begin = step.begin() + row * vocab;
      per_seq.push_back(int32_t(std::max_element(begin, begin + vocab) - begin));
    }
    tokens.push_back(per_seq);
  }
  return tokens;
}

// Runs ranks 0 .. tp_size - 1 of one TP group as threads of this process,
// each calling run_rank(rank, communicator, &its logits): the communicator
// comes from `options` with rank, size and device (options.device + rank)
// set per thread, through one in-memory store; none at tp_size 1. Records a
// test failure for every rank that fails; returns rank 0's logits.
inline StepLogits RunRanksAsThreads(
    int tp_size, CommunicatorOptions options,
    const std::function<Status(int rank, Communicator* comm, StepLogits* out)>& run_rank) {
  std::unique_ptr<RendezvousStore> store = NewInMemoryStore();
  std::vector<Status> status(tp_size);
  std::vector<StepLogits> logits(tp_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp_size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      if (tp_size > 1) {
        CommunicatorOptions rank_options = options;
        rank_options.rank = r;
        rank_options.size = tp_size;
        rank_options.device = options.device + r;
        Result<std::unique_ptr<Communicator>> c = CreateCommunicator(rank_options, *store);
        if (!c.ok()) {
          status[r] = c.status();
          return;
        }
        comm = std::move(*c);
      }
      status[r] = run_rank(r, comm.get(), &logits[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp_size; ++r) {
    EXPECT_TRUE(status[r].ok()) << "TP " << tp_size << " rank " << r << ": "
                                << status[r].ToString();
  }
  return logits[0];
}

// Tokens to feed before any run decided them: token 3 everywhere.
inline std::vector<std::vector<int32_t>> PlaceholderDecodeTokens() {
  return std::vector<std::vector<int32_t>>(kWorkloadDecodeSteps,
                                           std::vector<int32_t>(kWorkloadPrompts.size(), 3));
}

}  // namespace headway::testing
