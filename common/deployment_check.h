// Checks of a deployment config against the model it serves, shared by the
// launcher (before any process starts) and the coordinator.
#pragma once

#include "common/config.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace headway {

// OK if every instance's tp_size follows the TP sharding rule for `spec` and
// scheduler.max_model_len fits the model's context length. Errors:
// InvalidArgument naming the dotted key (`pools[0].instances[0].tp_size`),
// then ValidateTpSize's message (model, field, value, valid TP sizes).
Status CheckConfigAgainstModel(const Config& config, const ModelSpec& spec);

// OK if this build can serve the config: `device: cuda:N` needs a build
// with the CUDA toolkit (`cuda_built`; by default whether this one has it).
// Errors: Unimplemented naming the key and value. Refusing them beats
// serving them as something else.
Status CheckSupported(const Config& config, bool cuda_built);
Status CheckSupported(const Config& config);

// True when this build includes the CUDA worker (CMake found the toolkit).
bool BuiltWithCuda();

}  // namespace headway
