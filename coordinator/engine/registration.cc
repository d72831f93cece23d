#include "coordinator/engine/registration.h"

#include "comm/control_channel.h"
#include "comm/kv_write_auth.h"
#include "common/deployment_check.h"
#include "common/kv_arena.h"
#include "common/kv_layout.h"

namespace headway {
namespace {

Status Mismatch(const char* field, uint64_t sent, uint64_t expected) {
  return Status::InvalidArgument(std::string(field) + " is " + std::to_string(sent) +
                                 " but the coordinator expects " + std::to_string(expected));
}

// The instance and rank the worker claims, and the routing identity they
// require.
Status CheckIdentity(const proto::RegisterRequest& request, const std::string& peer,
                     const std::vector<const InstanceConfig*>& instances) {
  if (request.instance_id() >= instances.size()) {
    return Status::InvalidArgument("instance_id " + std::to_string(request.instance_id()) +
                                   " is not in the config (it has " +
                                   std::to_string(instances.size()) + " instances)");
  }
  const InstanceConfig& instance = *instances[request.instance_id()];
  if (request.tp_size() != uint32_t(instance.tp_size)) {
    return Mismatch("tp_size", request.tp_size(), instance.tp_size);
  }
  if (request.tp_rank() >= uint32_t(instance.tp_size)) {
    return Status::InvalidArgument("tp_rank " + std::to_string(request.tp_rank()) +
                                   " is not below tp_size " + std::to_string(instance.tp_size));
  }
  std::string expected_peer = PeerName(int(request.instance_id()), int(request.tp_rank()));
  if (peer != expected_peer) {
    return Status::InvalidArgument("routing identity is `" + peer + "` but instance " +
                                   std::to_string(request.instance_id()) + " rank " +
                                   std::to_string(request.tp_rank()) + " must connect as `" +
                                   expected_peer + "`");
  }
  return Status::Ok();
}

// The KV cache dtypes and arena geometry of the worker's pool: what the
// chunk allocator lends and block ids address (common/kv_arena.h).
Status CheckKvArena(const proto::RegisterRequest& request, const KvArenaLayout& arena) {
  const std::string sliding = KvCacheDtypeName(arena.dtypes.sliding);
  if (request.kv_cache_dtype_sliding() != sliding) {
    return Status::InvalidArgument("kv_cache_dtype_sliding is `" +
                                   request.kv_cache_dtype_sliding() +
                                   "` but the deployment's cache.kv_cache_dtype_sliding is `" +
                                   sliding + "`");
  }
  if (request.chunk_bytes() != arena.chunk_bytes) {
    return Mismatch("chunk_bytes", request.chunk_bytes(), arena.chunk_bytes);
  }
  if (request.num_chunks() == 0) {
    return Status::InvalidArgument(
        "num_chunks is 0: the worker has no KV pool (raise cache.kv_memory_mb)");
  }
  // num_blocks counts the first class's blocks of the same chunks.
  const uint64_t blocks = uint64_t(request.num_chunks()) *
                          uint64_t(arena.BlocksPerChunk(arena.classes.front()));
  if (request.num_blocks() != 0 && request.num_blocks() != blocks) {
    return Status::InvalidArgument(
        "num_blocks is " + std::to_string(request.num_blocks()) + " but num_chunks " +
        std::to_string(request.num_chunks()) + " of " + std::to_string(arena.chunk_bytes) +
        " bytes hold " + std::to_string(blocks) + " " +
        KvCacheDtypeName(arena.classes.front()) + " blocks");
  }
  return Status::Ok();
}

// The model and block size the worker loaded, as its TP shard sees them.
Status CheckModelShape(const proto::RegisterRequest& request, const Config& config,
                       const ModelSpec& spec, const TpShard& shard) {
  if (!request.model_name().empty() && request.model_name() != spec.name) {
    return Status::InvalidArgument("model_name is `" + request.model_name() +
                                   "` but the coordinator serves `" + spec.name + "`");
  }
  if (request.block_size() != uint32_t(config.block_size)) {
    return Mismatch("block_size", request.block_size(), config.block_size);
  }
  const std::string dtype = KvCacheDtypeName(config.kv_cache_dtype);
  if (request.kv_cache_dtype() != dtype) {
    // A worker started with another config: its blocks would be misread by
    // every peer it sends to or receives from.
    return Status::InvalidArgument("kv_cache_dtype is `" + request.kv_cache_dtype() +
                                   "` but the deployment's cache.kv_cache_dtype is `" + dtype +
                                   "`");
  }
  if (request.num_layers() != uint32_t(spec.num_layers)) {
    return Mismatch("num_layers", request.num_layers(), spec.num_layers);
  }
  if (request.num_local_kv_heads() != uint32_t(shard.num_local_kv_heads())) {
    return Mismatch("num_local_kv_heads", request.num_local_kv_heads(), shard.num_local_kv_heads());
  }
  if (request.head_dim() != uint32_t(spec.head_dim)) {
    return Mismatch("head_dim", request.head_dim(), spec.head_dim);
  }
  if (request.vocab_size() != uint32_t(spec.vocab_size) &&
      request.vocab_size() != uint32_t(shard.padded_vocab_size)) {
    return Mismatch("vocab_size", request.vocab_size(), spec.vocab_size);
  }
  return Status::Ok();
}

// The KV endpoint a worker must publish with kv_transfer on: the block
// layout version and dtypes senders assume, the arena's granule size and
// count (common/kv_arena.h: a granule is a block with one dtype), the KV
// heads of its shard, and a UCX address. `pool_bytes` is the arena's size.
Status CheckKvEndpoint(const proto::KvEndpoint& e, uint64_t pool_bytes,
                       const KvArenaLayout& arena, const TpShard& shard) {
  if (e.layout_version() != kKvBlockLayoutVersion) {
    return Mismatch("kv_endpoint.layout_version", e.layout_version(), kKvBlockLayoutVersion);
  }
  const KvCacheDtype pool_dtype = arena.classes.front();
  const std::string dtype = KvCacheDtypeName(pool_dtype);
  if (e.dtype() != dtype) {
    return Status::InvalidArgument(
        "kv_endpoint.dtype is `" + e.dtype() + "` but the deployment's " +
        (pool_dtype == arena.dtypes.full ? "cache.kv_cache_dtype" : "cache.kv_cache_dtype_sliding") +
        " is `" + dtype + "`");
  }
  const std::string sliding = KvCacheDtypeName(arena.dtypes.sliding);
  if (arena.mixed() && e.dtype_sliding() != sliding) {
    return Status::InvalidArgument("kv_endpoint.dtype_sliding is `" + e.dtype_sliding() +
                                   "` but the deployment's cache.kv_cache_dtype_sliding is `" +
                                   sliding + "`");
  }
  // Senders address the pool in granules (a block with one dtype).
  if (e.block_bytes() != arena.granule_bytes) {
    return Mismatch("kv_endpoint.block_bytes", e.block_bytes(), arena.granule_bytes);
  }
  if (e.num_blocks() != pool_bytes / arena.granule_bytes) {
    return Mismatch("kv_endpoint.num_blocks", e.num_blocks(), pool_bytes / arena.granule_bytes);
  }
  if (e.kv_heads_size() != shard.num_local_kv_heads()) {
    return Mismatch("kv_endpoint.kv_heads count", uint64_t(e.kv_heads_size()),
                    uint64_t(shard.num_local_kv_heads()));
  }
  for (int h = 0; h < e.kv_heads_size(); ++h) {
    if (e.kv_heads(h) != uint32_t(shard.kv_head_begin + h)) {
      return Mismatch(("kv_endpoint.kv_heads[" + std::to_string(h) + "]").c_str(),
                      e.kv_heads(h), uint64_t(shard.kv_head_begin + h));
    }
  }
  if (e.worker_address().empty()) {
    return Status::InvalidArgument("kv_endpoint has no UCX worker address");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateRegisterRequest(const proto::RegisterRequest& request, const std::string& peer,
                               const Config& config, const ModelSpec& spec) {
  std::vector<const InstanceConfig*> instances = config.Instances();
  HW_RETURN_IF_ERROR(CheckIdentity(request, peer, instances));
  const int tp_size = instances[request.instance_id()]->tp_size;
  const TpShard shard = ShardForRank(spec, tp_size, int(request.tp_rank()));
  HW_RETURN_IF_ERROR(CheckModelShape(request, config, spec, shard));
  // CheckConfigAgainstModel passed when the coordinator started, so this
  // fails only for a config it never checked.
  Result<KvArenaLayout> arena = KvArenaOf(config, spec);
  if (!arena.ok()) return arena.status().WithContext("the deployment's KV arena");
  HW_RETURN_IF_ERROR(CheckKvArena(request, *arena));
  if (config.KvTransferEnabled()) {
    if (!request.has_kv_endpoint()) {
      return Status::InvalidArgument("kv_transfer is enabled but the worker sent no KV endpoint");
    }
    HW_RETURN_IF_ERROR(
        CheckKvEndpoint(request.kv_endpoint(), uint64_t(request.num_chunks()) * arena->chunk_bytes,
                        *arena, shard));
    if (request.kv_write_key().size() != kKvWriteKeyBytes) {
      return Mismatch("kv_write_key bytes", request.kv_write_key().size(), kKvWriteKeyBytes);
    }
  }
  if (request.num_blocks() == 0) {
    return Status::InvalidArgument("num_blocks is 0: the worker has no KV pool (raise cache.kv_memory_mb)");
  }
  return Status::Ok();
}

}  // namespace headway
