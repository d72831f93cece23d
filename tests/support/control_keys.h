// CurveZMQ keys for test deployments whose control port is reachable from
// other (network-namespace) hosts, made with the real headway-keygen.
#pragma once

#include <string>

namespace headway::testing {

// Runs headway-keygen for the coordinator and for the workers in
// `dir`/keys (once: a second call reuses them), puts the workers' public key into `dir`/keys/authorized, and
// returns the config's `security:` section naming them (absolute paths, so
// every host that shares the file system reads the same files). "" and
// *error set when a key cannot be made.
std::string ControlPlaneKeysYaml(const std::string& dir, std::string* error);

}  // namespace headway::testing
