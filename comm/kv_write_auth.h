// Authorization of KV block writes (README "KV transfer authorization").
//
// Threat model: an off-path attacker who can reach a worker's UCX port but
// cannot read the control channel (CurveZMQ, or loopback). UCX has no
// authentication, so without this anyone who reaches the port could write
// any block of a decode worker's pool. An on-path attacker can already read
// (and alter) the unencrypted KV bytes: the UCX ports belong on a private
// network whatever this check does.
//
// Each receiving agent draws a random 32-byte write key when it starts
// (KvTransferAgent::write_key) and tells only the coordinator, at
// registration, over the control channel. For each transfer the coordinator
// gives the sending rank a KvWriteGrant per receiver: the transfer id, a
// lifetime, and for each run of consecutive destination blocks a tag
//   BLAKE2b-128 keyed with the receiver's write key (libsodium
//   crypto_generichash, RFC 7693) over
//   "headway-kv-write-v1" || transfer_id (u64) || lifetime_ms (u32) ||
//   first_block (u32) || num_blocks (u32), little-endian.
// Every block message carries the transfer id, the lifetime, its run and
// the run's tag in its header; the receiver recomputes the tag, checks that
// the message's bytes lie inside the run, and that the transfer is fresh
// (KvTransferWindow), before it copies anything. The MAC covers the small
// header, not the data: one BLAKE2b compression (a 39-byte input fits its
// one 128-byte block) per message of up to 256 KiB. The grant travels with
// the write instruction and the message it authorizes, so there is no race
// between an "announce" on the control channel and the write on UCX.
//
// Replay: a grant names its transfer id, which the coordinator never
// reuses (ids increase; a restarted coordinator meets restarted workers
// with new keys). KvTransferWindow admits a transfer for lifetime_ms from
// its first message, and once a transfer's lifetime has passed it refuses
// that id and every lower one, so an old grant cannot write into blocks
// that have been reused since. Within its lifetime a grant admits any bytes
// to its blocks: someone who reads the UCX traffic sees the header and could
// write to those blocks until the transfer expires (the on-path attacker
// above).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace headway {

inline constexpr size_t kKvWriteKeyBytes = 32;
inline constexpr size_t kKvWriteTagBytes = 16;
using KvWriteTag = std::array<uint8_t, kKvWriteTagBytes>;

// Consecutive destination blocks [first_block, first_block + num_blocks) of
// one transfer to one receiver, and their tag.
struct KvWriteRange {
  uint32_t first_block = 0;
  uint32_t num_blocks = 0;
  KvWriteTag tag{};
};

// What a sender needs to write into one receiver for one transfer.
struct KvWriteGrant {
  uint64_t transfer_id = 0;
  uint32_t lifetime_ms = 0;  // from the receiver's first message of the transfer
  std::vector<KvWriteRange> ranges;
};

// A fresh random write key (kKvWriteKeyBytes bytes, libsodium's
// randombytes_buf). Errors: Unavailable when libsodium cannot initialise.
Result<std::string> NewKvWriteKey();

// The tag of one range. REQUIRES: key.size() == kKvWriteKeyBytes (checked).
KvWriteTag KvWriteRangeTag(const std::string& key, uint64_t transfer_id, uint32_t lifetime_ms,
                           uint32_t first_block, uint32_t num_blocks);

// A grant covering `dst_blocks` (destination block ids, in copy order): one
// range per run of ids that step by one. Errors: InvalidArgument for a key
// that is not kKvWriteKeyBytes bytes or a zero lifetime.
Result<KvWriteGrant> GrantKvWrites(const std::string& key, uint64_t transfer_id,
                                   uint32_t lifetime_ms, const std::vector<uint32_t>& dst_blocks);

// Whether `tag` is the range's tag under `key` (compared in constant time;
// false for a key of the wrong size).
bool VerifyKvWriteRange(const std::string& key, uint64_t transfer_id, uint32_t lifetime_ms,
                        uint32_t first_block, uint32_t num_blocks, const KvWriteTag& tag);

// A receiver's record of the transfers it has admitted, for replay
// protection (see above). Memory: one entry per transfer admitted within
// the last lifetime. Not thread-safe.
class KvTransferWindow {
 public:
  using Clock = std::chrono::steady_clock;

  // Whether a message of `transfer_id` (whose grant verified, with
  // `lifetime_ms`) may be written at `now`: true for a transfer first seen
  // within the last lifetime_ms (a new id above the floor is recorded
  // now); false for one whose lifetime has passed, or for an id at or
  // below the floor (the highest id of any transfer whose lifetime passed).
  bool Admit(uint64_t transfer_id, uint32_t lifetime_ms, Clock::time_point now);

  // Transfers currently recorded, for tests.
  size_t size() const { return first_seen_.size(); }

 private:
  struct Entry {
    Clock::time_point expires;
  };
  // Drops entries expired by `now`, raising floor_ to their ids.
  void Expire(Clock::time_point now);

  uint64_t floor_ = 0;                    // ids <= floor_ are refused
  std::map<uint64_t, Entry> first_seen_;  // admitted transfers by id
};

}  // namespace headway
