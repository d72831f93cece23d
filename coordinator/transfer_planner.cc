#include "coordinator/transfer_planner.h"

#include <map>
#include <string>
#include <utility>

namespace headway {

int FirstOwnerRank(const ModelSpec& spec, int tp_size, int kv_head) {
  if (spec.num_kv_heads >= tp_size) return kv_head / (spec.num_kv_heads / tp_size);
  return kv_head * (tp_size / spec.num_kv_heads);
}

Result<std::vector<RankBlockCopies>> PlanBlockCopies(
    const ModelSpec& spec, int src_tp_size, const std::vector<std::vector<SlotBlockDelta>>& src,
    int dst_tp_size, const std::vector<std::vector<SlotBlockDelta>>& dst, size_t first_new_block) {
  HW_RETURN_IF_ERROR(ValidateTpSize(spec, src_tp_size));
  HW_RETURN_IF_ERROR(ValidateTpSize(spec, dst_tp_size));
  if (src.size() != size_t(src_tp_size) || dst.size() != size_t(dst_tp_size)) {
    return Status::InvalidArgument(
        "transfer plan: " + std::to_string(src.size()) + " prefill and " +
        std::to_string(dst.size()) + " decode rank tables for TP sizes " +
        std::to_string(src_tp_size) + " and " + std::to_string(dst_tp_size));
  }
  const int src_local_heads = ShardForRank(spec, src_tp_size, 0).num_local_kv_heads();
  std::map<std::pair<int, int>, RankBlockCopies> pairs;
  for (int rd = 0; rd < dst_tp_size; ++rd) {
    const TpShard dst_shard = ShardForRank(spec, dst_tp_size, rd);
    const int dst_local_heads = dst_shard.num_local_kv_heads();
    for (const SlotBlockDelta& d : dst[size_t(rd)]) {
      const int layer = d.slot / dst_local_heads;
      const int head = dst_shard.kv_head_begin + d.slot % dst_local_heads;
      const int rs = FirstOwnerRank(spec, src_tp_size, head);
      const int src_slot =
          layer * src_local_heads + (head - ShardForRank(spec, src_tp_size, rs).kv_head_begin);
      const SlotBlockDelta* from = nullptr;
      for (const SlotBlockDelta& s : src[size_t(rs)]) {
        if (s.slot == src_slot) from = &s;
      }
      if (from == nullptr || from->first_logical != 0 || d.first_logical != 0 ||
          from->appended.size() < d.appended.size()) {
        return Status::InvalidArgument(
            "transfer plan: decode rank " + std::to_string(rd) + " slot " +
            std::to_string(d.slot) + " (layer " + std::to_string(layer) + ", KV head " +
            std::to_string(head) + ") has no prefill table on rank " + std::to_string(rs) +
            " slot " + std::to_string(src_slot) + " covering its " +
            std::to_string(d.appended.size()) + " blocks from logical block 0");
      }
      for (size_t i = first_new_block; i < d.appended.size(); ++i) {
        RankBlockCopies& copies = pairs[{rs, rd}];
        copies.src_rank = rs;
        copies.dst_rank = rd;
        copies.src_blocks.push_back(uint32_t(from->appended[i]));
        copies.dst_blocks.push_back(uint32_t(d.appended[i]));
      }
    }
  }
  std::vector<RankBlockCopies> out;
  out.reserve(pairs.size());
  for (auto& [key, copies] : pairs) out.push_back(std::move(copies));
  return out;
}

}  // namespace headway
