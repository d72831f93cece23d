#include "comm/kv_write_auth.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

namespace headway {

namespace {

// Domain separation: these tags mean nothing to any other use of a key.
constexpr char kContext[] = "headway-kv-write-v1";

// The MAC's input: kContext (without its NUL), then the fields written
// little-endian whatever the host's order, so that the coordinator and a
// worker on another architecture compute the same tag.
struct TagInput {
  char context[sizeof(kContext) - 1];
  uint8_t transfer_id[8];
  uint8_t lifetime_ms[4];
  uint8_t first_block[4];
  uint8_t num_blocks[4];
};
static_assert(sizeof(TagInput) == 39);

template <typename T>
void PutLe(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = uint8_t(value >> (8 * i));
}

}  // namespace

Result<std::string> NewKvWriteKey() {
  if (sodium_init() < 0) return Status::Unavailable("KV transfer: libsodium cannot initialise");
  std::string key(kKvWriteKeyBytes, '\0');
  randombytes_buf(key.data(), key.size());
  return key;
}

KvWriteTag KvWriteRangeTag(const std::string& key, uint64_t transfer_id, uint32_t lifetime_ms,
                           uint32_t first_block, uint32_t num_blocks) {
  HW_CHECK(key.size() == kKvWriteKeyBytes);
  static_assert(kKvWriteKeyBytes >= crypto_generichash_KEYBYTES_MIN &&
                kKvWriteKeyBytes <= crypto_generichash_KEYBYTES_MAX);
  static_assert(kKvWriteTagBytes >= crypto_generichash_BYTES_MIN);
  TagInput input;
  std::memcpy(input.context, kContext, sizeof(input.context));
  PutLe(input.transfer_id, transfer_id);
  PutLe(input.lifetime_ms, lifetime_ms);
  PutLe(input.first_block, first_block);
  PutLe(input.num_blocks, num_blocks);
  KvWriteTag tag{};
  crypto_generichash(tag.data(), tag.size(), reinterpret_cast<const uint8_t*>(&input),
                     sizeof(input), reinterpret_cast<const uint8_t*>(key.data()), key.size());
  return tag;
}

Result<KvWriteGrant> GrantKvWrites(const std::string& key, uint64_t transfer_id,
                                   uint32_t lifetime_ms, const std::vector<uint32_t>& dst_blocks) {
  if (key.size() != kKvWriteKeyBytes) {
    return Status::InvalidArgument("KV write grant: the receiver's write key has " +
                                   std::to_string(key.size()) + " bytes, must have " +
                                   std::to_string(kKvWriteKeyBytes));
  }
  if (lifetime_ms == 0) return Status::InvalidArgument("KV write grant: lifetime_ms must be > 0");
  KvWriteGrant grant;
  grant.transfer_id = transfer_id;
  grant.lifetime_ms = lifetime_ms;
  for (size_t i = 0; i < dst_blocks.size();) {
    size_t run = 1;
    while (i + run < dst_blocks.size() && dst_blocks[i + run] == dst_blocks[i] + run) ++run;
    KvWriteRange range;
    range.first_block = dst_blocks[i];
    range.num_blocks = uint32_t(run);
    range.tag = KvWriteRangeTag(key, transfer_id, lifetime_ms, range.first_block, range.num_blocks);
    grant.ranges.push_back(range);
    i += run;
  }
  return grant;
}

bool VerifyKvWriteRange(const std::string& key, uint64_t transfer_id, uint32_t lifetime_ms,
                        uint32_t first_block, uint32_t num_blocks, const KvWriteTag& tag) {
  if (key.size() != kKvWriteKeyBytes) return false;
  const KvWriteTag want = KvWriteRangeTag(key, transfer_id, lifetime_ms, first_block, num_blocks);
  return sodium_memcmp(want.data(), tag.data(), tag.size()) == 0;
}

void KvTransferWindow::Expire(Clock::time_point now) {
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    if (it->second.expires <= now) {
      floor_ = std::max(floor_, it->first);
      it = first_seen_.erase(it);
    } else {
      ++it;
    }
  }
}

bool KvTransferWindow::Admit(uint64_t transfer_id, uint32_t lifetime_ms, Clock::time_point now) {
  Expire(now);
  if (transfer_id <= floor_) return false;
  auto it = first_seen_.find(transfer_id);
  if (it != first_seen_.end()) return true;  // not expired: Expire kept it
  first_seen_[transfer_id] = Entry{now + std::chrono::milliseconds(lifetime_ms)};
  return true;
}

}  // namespace headway
