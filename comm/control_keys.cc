#include "comm/control_keys.h"

#include "comm/curve_keys.h"

namespace headway {

Result<std::optional<ControlServerKeys>> LoadControlServerKeys(const SecurityConfig& security) {
  if (!security.HasKeys()) return std::optional<ControlServerKeys>();
  Result<CurveKeyPair> own = ReadCurveSecretKeyFile(security.coordinator_key);
  if (!own.ok()) return own.status().WithContext("security.coordinator_key");
  Result<std::vector<std::string>> clients = ReadAuthorizedKeys(security.authorized_keys);
  if (!clients.ok()) return clients.status().WithContext("security.authorized_keys");
  return std::optional<ControlServerKeys>(ControlServerKeys{own->secret_key, std::move(*clients)});
}

Result<std::optional<ControlClientKeys>> LoadControlClientKeys(const SecurityConfig& security) {
  if (!security.HasKeys()) return std::optional<ControlClientKeys>();
  Result<std::string> server = ReadCurvePublicKeyFile(security.coordinator_public_key);
  if (!server.ok()) return server.status().WithContext("security.coordinator_public_key");
  Result<CurveKeyPair> own = ReadCurveSecretKeyFile(security.client_key);
  if (!own.ok()) return own.status().WithContext("security.client_key");
  return std::optional<ControlClientKeys>(
      ControlClientKeys{*server, own->public_key, own->secret_key});
}

}  // namespace headway
