#include "common/deployment_check.h"

#include <algorithm>
#include <cstddef>
#include <string>

namespace headway {
namespace {

std::string DtypeKeys(const KvCacheDtypes& dtypes) {
  return std::string("`cache.kv_cache_dtype` = ") + KvCacheDtypeName(dtypes.full) +
         " and `cache.kv_cache_dtype_sliding` = " + KvCacheDtypeName(dtypes.sliding);
}

// What an arena of two block sizes cannot serve yet.
Status CheckMixedArena(const Config& config, const ModelSpec& spec, const KvArenaLayout& arena) {
  // The CPU attention kernel reads a layer's KV heads with one block layout.
  if (spec.num_kv_heads > 0 &&
      spec.slot_specs.size() == size_t(spec.num_layers) * size_t(spec.num_kv_heads)) {
    for (int l = 0; l < spec.num_layers; ++l) {
      const auto first = spec.slot_specs.begin() + ptrdiff_t(l) * spec.num_kv_heads;
      const bool sliding = first->IsSliding();
      const auto odd = std::find_if(first, first + spec.num_kv_heads,
                                    [&](const SlotSpec& s) { return s.IsSliding() != sliding; });
      if (odd != first + spec.num_kv_heads) {
        return Status::Unimplemented(
            DtypeKeys(arena.dtypes) + ": layer " + std::to_string(l) +
            " has both full and sliding KV heads (KV head " + std::to_string(odd - first) +
            " is " + (sliding ? "full" : "sliding") +
            ", KV head 0 is not; model.head_pattern makes heads stream one by one), but the "
            "attention kernel reads one layer's KV heads in one dtype; use one dtype for "
            "both, or a pattern whose layers stream all or none of their heads");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckConfigAgainstModel(const Config& config, const ModelSpec& spec) {
  for (size_t p = 0; p < config.pools.size(); ++p) {
    const PoolConfig& pool = config.pools[p];
    for (size_t i = 0; i < pool.instances.size(); ++i) {
      Status tp = ValidateTpSize(spec, pool.instances[i].tp_size);
      if (!tp.ok()) {
        return Status::InvalidArgument("`pools[" + std::to_string(p) + "].instances[" +
                                       std::to_string(i) + "].tp_size` = " +
                                       std::to_string(pool.instances[i].tp_size) + ": " +
                                       tp.message());
      }
    }
  }
  HW_ASSIGN_OR_RETURN(const KvArenaLayout arena, KvArenaOf(config, spec));
  if (arena.mixed()) HW_RETURN_IF_ERROR(CheckMixedArena(config, spec, arena));
  if (spec.context_length > 0 && config.max_model_len > spec.context_length) {
    return Status::InvalidArgument(
        "`scheduler.max_model_len` = " + std::to_string(config.max_model_len) + ": model '" +
        spec.name + "' was trained for " + std::to_string(spec.context_length) +
        " positions; use at most that");
  }
  return Status::Ok();
}

Result<KvArenaLayout> KvArenaOf(const Config& config, const ModelSpec& spec) {
  const KvCacheDtypes dtypes = config.kv_cache_dtypes();
  if (std::string why = KvCacheLayout{config.block_size, spec.head_dim, dtypes.full}.Check();
      !why.empty()) {
    return Status::InvalidArgument("`cache.kv_cache_dtype` = " +
                                   std::string(KvCacheDtypeName(dtypes.full)) + ": " + why);
  }
  // A model without sliding slots never uses the sliding dtype.
  const bool any_sliding = std::any_of(spec.slot_specs.begin(), spec.slot_specs.end(),
                                       [](const SlotSpec& s) { return s.IsSliding(); });
  if (any_sliding &&
      !KvCacheLayout{config.block_size, spec.head_dim, dtypes.sliding}.Check().empty()) {
    // Check()'s text names cache.kv_cache_dtype; this is the other key. The
    // full dtype's check passed, so only the grouping can fail.
    const int group = KvCacheDtypeGroup(dtypes.sliding);
    return Status::InvalidArgument(
        std::string("`cache.kv_cache_dtype_sliding` = ") + KvCacheDtypeName(dtypes.sliding) +
        ": it stores groups of " + std::to_string(group) + " values, but the model's head_dim " +
        std::to_string(spec.head_dim) + " is not a multiple of " + std::to_string(group) +
        "; use float32 or float16");
  }
  return MakeKvArenaLayout(config.block_size, spec.head_dim, dtypes, spec.slot_specs);
}

bool BuiltWithCuda() {
#if HEADWAY_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Status CheckSupported(const Config& config) { return CheckSupported(config, BuiltWithCuda()); }

Status CheckSupported(const Config& config, bool cuda_built) {
  if (cuda_built) return Status::Ok();
  for (size_t p = 0; p < config.pools.size(); ++p) {
    const PoolConfig& pool = config.pools[p];
    for (size_t i = 0; i < pool.instances.size(); ++i) {
      if (pool.instances[i].device != "cpu") {
        return Status::Unimplemented("`pools[" + std::to_string(p) + "].instances[" +
                                     std::to_string(i) + "].device` = " +
                                     pool.instances[i].device +
                                     ": this build has no CUDA backend (the CUDA toolkit was not found "
                                     "when it was built); rebuild where nvcc is found, or use "
                                     "device: cpu");
      }
    }
  }
  return Status::Ok();
}

}  // namespace headway
