#include "common/security_config.h"

#include <arpa/inet.h>
#include <yaml-cpp/yaml.h>

#include "common/config.h"
#include "common/net_address.h"
#include "common/yaml_fields.h"

namespace headway {

Status ParseSecuritySection(const YAML::Node& node, SecurityConfig* security) {
  HW_RETURN_IF_ERROR(yaml::RequireMap(node, "security"));
  HW_RETURN_IF_ERROR(yaml::CheckKeys(node, "security",
                                     {"coordinator_key", "coordinator_public_key", "client_key",
                                      "authorized_keys", "insecure"}));
  SecurityConfig out;
  const std::pair<const char*, std::string*> files[] = {
      {"coordinator_key", &out.coordinator_key},
      {"coordinator_public_key", &out.coordinator_public_key},
      {"client_key", &out.client_key},
      {"authorized_keys", &out.authorized_keys}};
  int num_named = 0;
  for (const auto& [name, value] : files) {
    const std::string key = std::string("security.") + name;
    if (!node[name]) continue;
    HW_RETURN_IF_ERROR(yaml::ReadString(node[name], key, *value));
    if (value->empty()) return yaml::BadValue(key, "\"\"", "a file path");
    ++num_named;
  }
  if (node["insecure"]) HW_RETURN_IF_ERROR(yaml::ReadBool(node["insecure"], "security.insecure", out.insecure));
  if (num_named > 0 && num_named < 4) {
    for (const auto& [name, value] : files) {
      if (value->empty()) {
        return Status::InvalidArgument(
            std::string("missing key `security.") + name +
            "`: the control plane's keys come together (coordinator_key, "
            "coordinator_public_key, client_key, authorized_keys; one config serves the "
            "coordinator and the workers)");
      }
    }
  }
  if (num_named > 0 && out.insecure) {
    return yaml::BadValue("security.insecure", "true",
                          "false (or absent) when key files are named: keys authenticate the "
                          "control plane, insecure turns that off");
  }
  *security = std::move(out);
  return Status::Ok();
}

bool IsLocalControlEndpoint(const std::string& endpoint) {
  if (endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) return true;
  const std::string host = ZmqTcpHost(endpoint);
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

Status CheckControlPlaneSecurity(const Config& config) {
  if (config.security.HasKeys() || config.security.insecure) return Status::Ok();
  const std::pair<const char*, const std::string*> endpoints[] = {
      {"coordinator.control_bind", &config.ControlBindAddress()},
      {"coordinator.control_address", &config.control_address}};
  for (const auto& [key, endpoint] : endpoints) {
    // An empty control_bind means control_address: name the key written.
    if (config.control_bind.empty() && std::string(key) == "coordinator.control_bind") continue;
    if (IsLocalControlEndpoint(*endpoint)) continue;
    return Status::InvalidArgument(
        std::string("`") + key + "` = \"" + *endpoint +
        "\" is reachable from other machines, and the control plane has no keys: anyone who "
        "reaches it could register as a worker and be sent prompts. Make keys: "
        "`headway-keygen /etc/headway/coordinator.key` on the coordinator's host and "
        "`headway-keygen /etc/headway/worker.key` for the workers, copy coordinator.key (public) "
        "to every worker host and worker.key into the coordinator's authorized_keys, and set "
        "security.coordinator_key, security.coordinator_public_key, security.client_key and "
        "security.authorized_keys (README \"Security\"); or bind the control port to "
        "127.0.0.1; or, on a network you trust, set `security.insecure: true`");
  }
  return Status::Ok();
}

}  // namespace headway
