#include "coordinator/http/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <strings.h>

namespace headway {

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) digests_.push_back(Sha256(key));
}

ApiKeys::Digest ApiKeys::Sha256(std::string_view text) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

bool ApiKeys::Admits(std::string_view authorization) const {
  if (digests_.empty()) return true;
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() < kScheme.size() ||
      strncasecmp(authorization.data(), kScheme.data(), kScheme.size()) != 0) {
    return false;
  }
  // Equal-length digests make the comparison's time independent of the
  // presented token; every key is compared so the matching one's position
  // does not show either.
  const Digest presented = Sha256(authorization.substr(kScheme.size()));
  int matches = 0;
  for (const Digest& d : digests_) {
    matches |= CRYPTO_memcmp(presented.data(), d.data(), d.size()) == 0;
  }
  return matches != 0;
}

}  // namespace headway
