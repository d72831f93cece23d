// Step plans for tests that drive a StepExecutor without a coordinator: a
// trivial allocator that gives every slot of a sequence fresh block ids as
// its positions grow (ids count up from 0 and are never reused).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "proto/control.pb.h"

namespace headway::testing {

class BlockGranter {
 public:
  // `num_slots`: slots of the model on this rank (DecoderModel::num_slots);
  // `block_size`: positions per block of the executor's pool.
  BlockGranter(int num_slots, int block_size) : num_slots_(num_slots), block_size_(block_size) {}

  // Where slot `slot`'s next block id comes from, for pools whose ids count
  // per dtype (common/kv_arena.h); unset: one counter for every slot.
  using IdSource = std::function<int32_t(int slot)>;
  void set_id_source(IdSource source) { id_source_ = std::move(source); }

  // Appends a step for `tokens` of `seq_id` at `start_pos` to `plan`, with
  // deltas giving every slot the blocks that positions
  // [0, start_pos + tokens.size()) need beyond those granted before.
  proto::SequenceStep* AddStep(proto::StepPlan* plan, uint64_t seq_id,
                               const std::vector<int32_t>& tokens, uint32_t start_pos,
                               bool is_new, bool sample) {
    proto::SequenceStep* step = plan->add_seqs();
    step->set_seq_id(seq_id);
    step->set_is_new(is_new);
    step->set_start_pos(start_pos);
    step->set_sample(sample);
    for (int32_t t : tokens) step->add_token_ids(t);
    int& have = blocks_[seq_id];
    const int need = int((start_pos + tokens.size() + block_size_ - 1) / block_size_);
    if (need > have) {
      for (int slot = 0; slot < num_slots_; ++slot) {
        proto::SlotDelta* d = step->add_deltas();
        d->set_slot(slot);
        d->set_first_logical(have);
        for (int i = have; i < need; ++i) {
          d->add_appended(id_source_ ? id_source_(slot) : next_block_++);
        }
      }
      have = need;
    }
    return step;
  }

 private:
  const int num_slots_;
  const int block_size_;
  std::map<uint64_t, int> blocks_;  // seq_id -> blocks granted per slot
  int next_block_ = 0;
  IdSource id_source_;
};

}  // namespace headway::testing
