// Instances without processes: a ControlServer that records what the
// coordinator sends, and registration requests that a fake worker would
// send, for tests of the instance registry and the disaggregation
// coordinator.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "comm/control_channel.h"
#include "comm/kv_write_auth.h"
#include "common/config.h"
#include "coordinator/engine/instance_registry.h"
#include "common/kv_layout.h"

namespace headway::testing {

class FakeControlServer : public ControlServer {
 public:
  Status Send(const std::string& peer, const proto::Envelope& envelope) override {
    sent.emplace_back(peer, envelope);
    return Status::Ok();
  }
  std::optional<Inbound> Receive(std::chrono::milliseconds) override { return std::nullopt; }

  // What was sent, oldest first; tests take what they check.
  std::deque<std::pair<std::string, proto::Envelope>> sent;

  // The TransferPlans sent since the last call, by peer.
  std::vector<std::pair<std::string, proto::TransferPlan>> TakeTransferPlans() {
    std::vector<std::pair<std::string, proto::TransferPlan>> plans;
    for (auto& [peer, env] : sent) {
      if (env.has_transfer_plan()) plans.emplace_back(peer, env.transfer_plan());
    }
    sent.clear();
    return plans;
  }
};

// A write key of the right size, different for every rank.
inline std::string FakeKvWriteKey(int instance, int rank) {
  std::string key = "key-of-" + PeerName(instance, rank);
  key.resize(kKvWriteKeyBytes, '#');
  return key;
}

// What rank `rank` of instance `instance` (tp `tp`) registers with:
// `num_blocks` blocks of `block_size` positions in `dtype` (every slot, as
// a worker of a deployment with one KV cache dtype), a KV endpoint when
// `with_kv_endpoint`.
inline proto::RegisterRequest FakeRegistration(const ModelSpec& spec, int instance, int rank,
                                               int tp, int block_size, int num_blocks,
                                               bool with_kv_endpoint,
                                               KvCacheDtype dtype = Config().kv_cache_dtype) {
  const uint64_t block_bytes = KvCacheLayout{block_size, spec.head_dim, dtype}.BlockBytes();
  proto::RegisterRequest r;
  r.set_instance_id(uint32_t(instance));
  r.set_tp_rank(uint32_t(rank));
  r.set_tp_size(uint32_t(tp));
  r.set_model_name(spec.name);
  r.set_num_layers(uint32_t(spec.num_layers));
  const TpShard shard = ShardForRank(spec, tp, rank);
  r.set_num_local_kv_heads(uint32_t(shard.num_local_kv_heads()));
  r.set_head_dim(uint32_t(spec.head_dim));
  r.set_block_size(uint32_t(block_size));
  r.set_kv_cache_dtype(KvCacheDtypeName(dtype));
  r.set_kv_cache_dtype_sliding(KvCacheDtypeName(dtype));
  r.set_num_blocks(uint32_t(num_blocks));
  // One dtype: a chunk is a block (common/kv_arena.h).
  r.set_block_bytes(block_bytes);
  r.set_chunk_bytes(block_bytes);
  r.set_num_chunks(uint32_t(num_blocks));
  r.set_vocab_size(uint32_t(spec.vocab_size));
  if (with_kv_endpoint) {
    proto::KvEndpoint* e = r.mutable_kv_endpoint();
    e->set_worker_address("ucx-address-" + PeerName(instance, rank));
    e->set_block_bytes(block_bytes);
    e->set_num_blocks(uint64_t(num_blocks));
    e->set_layout_version(kKvBlockLayoutVersion);
    e->set_dtype(KvCacheDtypeName(dtype));
    for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) e->add_kv_heads(uint32_t(h));
    r.set_kv_write_key(FakeKvWriteKey(instance, rank));
  }
  return r;
}

// Registers every rank of every instance of `registry`'s config; each
// becomes ready. Returns false if a registration was refused.
inline bool RegisterAll(InstanceRegistry& registry, const Config& config, const ModelSpec& spec,
                        int num_blocks) {
  for (Instance& inst : registry.instances()) {
    for (int r = 0; r < inst.tp_size; ++r) {
      proto::RegisterRequest req = FakeRegistration(spec, inst.id, r, inst.tp_size,
                                                    config.block_size, num_blocks,
                                                    config.KvTransferEnabled(),
                                                    config.kv_cache_dtype);
      Instance* joined = registry.CheckRegistration(PeerName(inst.id, r), req);
      if (joined == nullptr) return false;
      registry.Register(*joined, PeerName(inst.id, r), req);
    }
    if (!inst.ready()) return false;
  }
  return true;
}

}  // namespace headway::testing
