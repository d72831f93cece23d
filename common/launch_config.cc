#include "common/launch_config.h"

#include <yaml-cpp/yaml.h>

#include "common/yaml_fields.h"

namespace headway {

Status ParseLaunchSection(const YAML::Node& node, LaunchConfig* launch) {
  HW_RETURN_IF_ERROR(yaml::RequireMap(node, "launch"));
  HW_RETURN_IF_ERROR(yaml::CheckKeys(node, "launch",
                                     {"user", "port", "key", "known_hosts", "connect_timeout_s",
                                      "bin_dir", "model_dir"}));
  LaunchConfig out;
  if (node["user"]) HW_RETURN_IF_ERROR(yaml::ReadString(node["user"], "launch.user", out.ssh_user));
  if (node["port"]) HW_RETURN_IF_ERROR(yaml::ReadInt(node["port"], "launch.port", out.ssh_port));
  if (node["key"]) HW_RETURN_IF_ERROR(yaml::ReadString(node["key"], "launch.key", out.ssh_key));
  if (node["known_hosts"]) {
    HW_RETURN_IF_ERROR(
        yaml::ReadString(node["known_hosts"], "launch.known_hosts", out.ssh_known_hosts));
  }
  if (node["connect_timeout_s"]) {
    HW_RETURN_IF_ERROR(yaml::ReadInt(node["connect_timeout_s"], "launch.connect_timeout_s",
                                     out.connect_timeout_s));
  }
  if (node["bin_dir"]) {
    HW_RETURN_IF_ERROR(yaml::ReadString(node["bin_dir"], "launch.bin_dir", out.bin_dir));
  }
  if (node["model_dir"]) {
    HW_RETURN_IF_ERROR(yaml::ReadString(node["model_dir"], "launch.model_dir", out.model_dir));
  }
  if (out.ssh_port < 1 || out.ssh_port > 65535) {
    return yaml::BadValue("launch.port", std::to_string(out.ssh_port), "a TCP port, 1 to 65535");
  }
  // The launcher adds its own margin to it (an int of seconds).
  HW_RETURN_IF_ERROR(
      yaml::CheckRange("launch.connect_timeout_s", out.connect_timeout_s, 1, 3600, "(seconds)"));
  // Passed to ssh as `-l USER`: a leading '-' would be read as an option.
  if (!out.ssh_user.empty() && out.ssh_user[0] == '-') {
    return yaml::BadValue("launch.user", "\"" + out.ssh_user + "\"", "a login name");
  }
  const std::pair<const char*, const std::string*> paths[] = {
      {"launch.key", &out.ssh_key},
      {"launch.known_hosts", &out.ssh_known_hosts},
      {"launch.bin_dir", &out.bin_dir},
      {"launch.model_dir", &out.model_dir}};
  for (const auto& [key, value] : paths) {
    if (!value->empty() && (*value)[0] != '/') {
      return yaml::BadValue(key, "\"" + *value + "\"", "an absolute path");
    }
  }
  *launch = std::move(out);
  return Status::Ok();
}

}  // namespace headway
