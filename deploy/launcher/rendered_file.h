// What `headway-launch render` writes, and what its renderers share.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "common/status.h"

namespace headway::launcher {

// A rendered file: its name in the output directory and its text.
struct RenderedFile {
  std::string file_name;
  std::string text;
  bool executable = false;  // written with mode 0755 (a script)
  bool secret = false;      // holds key material: written with mode 0600
};

// The port of coordinator.control_address when it is tcp://HOST:PORT.
// Errors: InvalidArgument naming the key and the value; `why` says why TCP
// is needed ("Kubernetes pods reach the coordinator over TCP").
inline Result<int> ControlPortOf(const std::string& address, const std::string& why) {
  const std::string prefix = "tcp://";
  const size_t colon = address.rfind(':');
  if (address.rfind(prefix, 0) != 0 || colon == std::string::npos || colon < prefix.size()) {
    return Status::InvalidArgument("`coordinator.control_address` = \"" + address + "\": " + why +
                                   "; use tcp://HOST:PORT");
  }
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return Status::InvalidArgument("`coordinator.control_address` = \"" + address +
                                   "\": the port must be a number in [1, 65535]");
  }
  return std::stoi(port);
}

// `config_yaml` (a config file's text) as a tree whose coordinator listens
// on every interface of its machine: http_host 0.0.0.0, control_bind
// tcp://0.0.0.0:`control_port`, and control_address `control_address`
// (what workers elsewhere dial). Every other key stays as written.
// Errors: InvalidArgument when the text does not parse.
Result<YAML::Node> ConfigServingEverywhere(const std::string& config_yaml,
                                           const std::string& control_address, int control_port);

}  // namespace headway::launcher
