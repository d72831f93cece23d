// The optional `launch:` section of a deployment config: how headway-launch
// reaches the hosts that are not this machine (deploy/launcher/ssh_launch.h).
// Only the launcher reads it; the coordinator, agents and workers ignore it.
//
//   launch:
//     user: headway                 # ssh login; default: ssh's own (the local user)
//     port: 22                      # sshd's port on every remote host
//     key: /home/me/.ssh/headway    # identity file; default: ssh's own
//     known_hosts: /etc/headway/known_hosts   # default: ssh's own (~/.ssh/known_hosts)
//     connect_timeout_s: 10         # an sshd that does not answer this fast is unreachable
//     bin_dir: /opt/headway/bin     # on remote hosts; default: the launcher's --bin-dir
//     model_dir: /data/models       # on remote hosts; default: each agent's own default
//                                   # ($HEADWAY_MODEL_DIR there, else ~/.cache/headway/models)
#pragma once

#include <string>

#include "common/status.h"

namespace YAML {
class Node;
}

namespace headway {

struct LaunchConfig {
  std::string ssh_user;         // "" = ssh's default
  int ssh_port = 22;
  std::string ssh_key;          // "" = ssh's default identities
  std::string ssh_known_hosts;  // "" = ssh's default files
  int connect_timeout_s = 10;
  std::string bin_dir;          // "" = the launcher's own --bin-dir, same path on every host
  std::string model_dir;        // "" = the remote agent's default
};

// Reads the `launch` mapping into *launch. Unknown keys are errors.
// Errors: InvalidArgument naming the dotted key (`launch.port`), the value
// and what is allowed: port in [1, 65535], connect_timeout_s >= 1, paths
// absolute (they are read on other machines or by ssh, not against a
// working directory).
Status ParseLaunchSection(const YAML::Node& node, LaunchConfig* launch);

}  // namespace headway
