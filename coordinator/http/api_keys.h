// The API keys that admit requests to the HTTP API (`Authorization: Bearer
// KEY`), from coordinator.api_key, coordinator.api_key_file and --api-key.
//
// Keys are kept as SHA-256 digests and a presented token is hashed and
// compared with every digest by CRYPTO_memcmp, without stopping at the
// first match: the time taken depends on neither the keys' lengths nor
// how many leading bytes match, so it reveals nothing about a key.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace headway {

class ApiKeys {
 public:
  // `keys` may be empty: then every request is admitted. Duplicates are
  // harmless. Thread-compatible: const after construction.
  explicit ApiKeys(const std::vector<std::string>& keys);

  bool empty() const { return digests_.empty(); }
  size_t size() const { return digests_.size(); }

  // True when `authorization` (the Authorization header's value, "" when
  // absent) is "Bearer " followed by one of the keys, or when there are no
  // keys. The scheme name is matched case-insensitively (RFC 9110 11.1).
  bool Admits(std::string_view authorization) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  static Digest Sha256(std::string_view text);
  std::vector<Digest> digests_;
};

}  // namespace headway
