#include "deploy/launcher/rendered_file.h"

namespace headway::launcher {

Result<YAML::Node> ConfigServingEverywhere(const std::string& config_yaml,
                                           const std::string& control_address, int control_port) {
  YAML::Node root;
  try {
    root = YAML::Load(config_yaml);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string("config does not parse: ") + e.what());
  }
  root["coordinator"]["http_host"] = "0.0.0.0";
  root["coordinator"]["control_address"] = control_address;
  root["coordinator"]["control_bind"] = "tcp://0.0.0.0:" + std::to_string(control_port);
  return root;
}

}  // namespace headway::launcher
