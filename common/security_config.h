// The optional `security:` section of a deployment config: the CurveZMQ
// keys of the control plane (README "Security", comm/control_channel.h).
//
//   security:
//     coordinator_key: /etc/headway/coordinator.key_secret   # the coordinator's secret key file
//     coordinator_public_key: /etc/headway/coordinator.key   # what workers trust
//     client_key: /etc/headway/worker.key_secret             # a worker's own secret key file
//     authorized_keys: /etc/headway/authorized_keys          # clients the coordinator admits
//     insecure: false     # true: allow a non-loopback control address without keys
//
// headway-keygen PATH writes a pair: PATH (public) and PATH_secret (secret,
// mode 0600). Each process reads only the files it needs: the coordinator
// coordinator_key and authorized_keys (one file of `public-key` lines, or a
// directory of public key files), a worker coordinator_public_key and
// client_key. A relative path is taken against the config file's directory
// (LoadConfigFile).
#pragma once

#include <string>

#include "common/status.h"

namespace YAML {
class Node;
}

namespace headway {

struct Config;

struct SecurityConfig {
  std::string coordinator_key;         // secret key file of the coordinator
  std::string coordinator_public_key;  // public key file of the coordinator
  std::string client_key;              // secret key file of a worker
  std::string authorized_keys;         // file or directory of client public keys
  // Spelled out by whoever runs the control plane unauthenticated on a
  // network (a test bed, a private network they trust).
  bool insecure = false;

  // True when the control plane runs CurveZMQ (every key file is named).
  bool HasKeys() const { return !coordinator_key.empty(); }
};

// Reads the `security` mapping into *security. Unknown keys are errors.
// The four key files come together (a config is shared by the coordinator
// and the workers); `insecure: true` with keys is refused as contradictory.
// Errors: InvalidArgument naming the dotted key (`security.client_key`),
// the value and what is allowed.
Status ParseSecuritySection(const YAML::Node& node, SecurityConfig* security);

// True for a ZeroMQ endpoint no other machine can reach: tcp:// on
// 127.0.0.0/8, ::1 or `localhost`, and ipc:// and inproc://. Names other
// than localhost are not resolved and count as reachable.
bool IsLocalControlEndpoint(const std::string& endpoint);

// The startup check of every process of the control plane: OK when the
// config has keys, says `security.insecure: true`, or both
// coordinator.control_address and the address the coordinator binds are
// local (IsLocalControlEndpoint). Otherwise InvalidArgument naming the key
// and address, and how to make keys (headway-keygen).
Status CheckControlPlaneSecurity(const Config& config);

}  // namespace headway
