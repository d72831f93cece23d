#include "common/deployment_check.h"

#include <string>

namespace headway {

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
  if (std::string why = KvCacheLayout{config.block_size, spec.head_dim, config.kv_cache_dtype}.Check();
      !why.empty()) {
    return Status::InvalidArgument("`cache.kv_cache_dtype` = " +
                                   std::string(KvCacheDtypeName(config.kv_cache_dtype)) + ": " + why);
  }
  if (spec.context_length > 0 && config.max_model_len > spec.context_length) {
    return Status::InvalidArgument(
        "`scheduler.max_model_len` = " + std::to_string(config.max_model_len) + ": model '" +
        spec.name + "' was trained for " + std::to_string(spec.context_length) +
        " positions; use at most that");
  }
  return Status::Ok();
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
