// Checks a worker's RegisterRequest against the deployment config and the
// model, before the coordinator accepts it.
#pragma once

#include <string>

#include "common/config.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "proto/control.pb.h"

namespace headway {

// OK if `request`, received from routing identity `peer`, names an instance
// of `config` (Config::Instances order) and a rank below its tp_size, its
// tp_size, block_size, layers, local KV heads (ShardForRank), head_dim and
// vocabulary match, its KV cache dtypes are the config's (kv_cache_dtype,
// kv_cache_dtype_sliding: Config::kv_cache_dtypes), its chunk_bytes is the
// deployment's KV arena's (KvArenaOf in common/deployment_check.h), it has
// at least one chunk and one block, num_blocks counts the arena's first
// class's blocks in its chunks, and `peer` equals PeerName(instance_id,
// tp_rank). Otherwise InvalidArgument naming the field, the value sent and
// the value expected.
// REQUIRES: every instance's tp_size is valid for `spec` (ValidateTpSize).
Status ValidateRegisterRequest(const proto::RegisterRequest& request, const std::string& peer,
                               const Config& config, const ModelSpec& spec);

}  // namespace headway
