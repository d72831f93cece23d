// Checks of a deployment config against the model it serves, shared by the
// launcher (before any process starts) and the coordinator.
#pragma once

#include "common/config.h"
#include "common/kv_arena.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace headway {

// OK if every instance's tp_size follows the TP sharding rule for `spec`,
// the KV cache dtypes can store the model's head_dim and
// scheduler.max_model_len fits the model's context length. Errors:
// InvalidArgument naming the dotted key (`pools[0].instances[0].tp_size`),
// then ValidateTpSize's message (model, field, value, valid TP sizes), or
// naming cache.kv_cache_dtype or cache.kv_cache_dtype_sliding and the
// dtype. When the model has sliding slots and cache.kv_cache_dtype_sliding
// differs from cache.kv_cache_dtype (blocks of two sizes, a mixed
// KvArenaLayout): Unimplemented naming both keys and values if some layer
// has both full and sliding KV heads (a head pattern), which the CPU
// attention kernel cannot read in two dtypes. `spec` is the model with its head pattern applied.
Status CheckConfigAgainstModel(const Config& config, const ModelSpec& spec);

// The KV arena every rank of the deployment uses (common/kv_arena.h):
// MakeKvArenaLayout of cache.block_size, the model's head_dim,
// Config::kv_cache_dtypes() and the model's slot specs (head pattern
// applied). Errors: InvalidArgument naming `cache.kv_cache_dtype` (always
// checked) or `cache.kv_cache_dtype_sliding` (when the model has sliding
// slots), its dtype and head_dim, when that dtype cannot store the model's
// head vectors.
Result<KvArenaLayout> KvArenaOf(const Config& config, const ModelSpec& spec);

// OK if this build can serve the config: `device: cuda:N` needs a build
// with the CUDA toolkit (`cuda_built`; by default whether this one has it).
// Errors: Unimplemented naming the key and value. Refusing them beats
// serving them as something else.
Status CheckSupported(const Config& config, bool cuda_built);
Status CheckSupported(const Config& config);

// True when this build includes the CUDA worker (CMake found the toolkit).
bool BuiltWithCuda();

}  // namespace headway
