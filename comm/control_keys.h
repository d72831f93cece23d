// The control plane's CurveZMQ keys, read from the files a config's
// `security` section names (common/security_config.h).
#pragma once

#include <optional>

#include "comm/control_channel.h"
#include "common/security_config.h"
#include "common/status.h"

namespace headway {

// The coordinator's keys: its secret key file and the authorized client
// keys. nullopt when `security` names no keys (an unauthenticated control
// plane; CheckControlPlaneSecurity says whether that is allowed). Errors:
// those of comm/curve_keys.h's readers, prefixed with the config key.
Result<std::optional<ControlServerKeys>> LoadControlServerKeys(const SecurityConfig& security);

// A worker's keys: the coordinator's public key and its own pair. nullopt
// as above. Errors: as LoadControlServerKeys.
Result<std::optional<ControlClientKeys>> LoadControlClientKeys(const SecurityConfig& security);

}  // namespace headway
