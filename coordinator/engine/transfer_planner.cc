#include "coordinator/engine/transfer_planner.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace headway {

Result<std::vector<RankBlockCopies>> PlanBlockCopies(const ModelSpec& spec, int src_tp_size,
                                                     const std::vector<RankRows>& src,
                                                     int dst_tp_size,
                                                     const std::vector<RankRows>& dst,
                                                     size_t first_new_block,
                                                     const KvCacheDtypes& dtypes) {
  HW_RETURN_IF_ERROR(ValidateTpSize(spec, src_tp_size));
  HW_RETURN_IF_ERROR(ValidateTpSize(spec, dst_tp_size));
  if (src.size() != size_t(src_tp_size) || dst.size() != size_t(dst_tp_size)) {
    return Status::InvalidArgument(
        "transfer plan: " + std::to_string(src.size()) + " prefill and " +
        std::to_string(dst.size()) + " decode rank tables for TP sizes " +
        std::to_string(src_tp_size) + " and " + std::to_string(dst_tp_size));
  }
  const int src_local_heads = ShardForRank(spec, src_tp_size, 0).num_local_kv_heads();
  const std::vector<KvCacheDtype> classes = KvBlockClasses(dtypes, spec.slot_specs);
  std::map<std::tuple<int, int, int>, RankBlockCopies> pairs;
  for (int rd = 0; rd < dst_tp_size; ++rd) {
    const TpShard dst_shard = ShardForRank(spec, dst_tp_size, rd);
    const int dst_local_heads = dst_shard.num_local_kv_heads();
    for (size_t slot = 0; slot < dst[size_t(rd)].size(); ++slot) {
      const std::vector<int32_t>& to = dst[size_t(rd)][slot];
      const int layer = int(slot) / dst_local_heads;
      const int head = dst_shard.kv_head_begin + int(slot) % dst_local_heads;
      const int rs = FirstRankHoldingKvHead(spec, src_tp_size, head);
      const size_t src_slot = size_t(layer) * src_local_heads +
                              size_t(head - ShardForRank(spec, src_tp_size, rs).kv_head_begin);
      const std::vector<int32_t>* from =
          src_slot < src[size_t(rs)].size() ? &src[size_t(rs)][src_slot] : nullptr;
      for (size_t i = first_new_block; i < to.size(); ++i) {
        if (to[i] < 0) continue;
        if (from == nullptr || i >= from->size() || (*from)[i] < 0) {
          return Status::InvalidArgument(
              "transfer plan: decode rank " + std::to_string(rd) + " slot " +
              std::to_string(slot) + " (layer " + std::to_string(layer) + ", KV head " +
              std::to_string(head) + ") wants logical block " + std::to_string(i) +
              ", which prefill rank " + std::to_string(rs) + " slot " + std::to_string(src_slot) +
              " does not hold");
        }
        const int cls = KvBlockClassOf(classes, dtypes, spec.slot_specs,
                                       size_t(layer) * spec.num_kv_heads + head);
        RankBlockCopies& copies = pairs[{rs, rd, cls}];
        copies.src_rank = rs;
        copies.dst_rank = rd;
        copies.block_class = cls;
        copies.src_blocks.push_back(uint32_t((*from)[i]));
        copies.dst_blocks.push_back(uint32_t(to[i]));
      }
    }
  }
  std::vector<RankBlockCopies> out;
  out.reserve(pairs.size());
  for (auto& [key, copies] : pairs) out.push_back(std::move(copies));
  return out;
}

}  // namespace headway
