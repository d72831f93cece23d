// Whole-buffer reads and writes on a file descriptor, and a KvPeerInfo sent
// over one: for processes that set up KV transfer between themselves through
// a pipe or socketpair (tests, benchmarks); serving exchanges KvEndpoint
// protos through the coordinator instead.
#pragma once

#include <cstddef>
#include <string>

#include "comm/kv_transfer.h"

namespace headway {

// Writes / reads exactly `n` bytes, retrying short transfers. False when the
// descriptor fails or (read) reaches end of file first.
bool WriteAll(int fd, const void* data, size_t n);
bool ReadAll(int fd, void* data, size_t n);

// A receiver's KvPeerInfo and its write key (KvTransferAgent::write_key),
// for the process that grants writes to it (as the coordinator does in
// serving). Encoding: u32 length, worker_address; u64 block_bytes; u32
// num_blocks; kKvWriteKeyBytes bytes of key, in host byte order (both ends
// on one host). ReceivePeerInfo refuses an address over 1 MiB. False on I/O
// failure or a key of the wrong size.
bool SendPeerInfo(int fd, const KvPeerInfo& info, const std::string& write_key);
bool ReceivePeerInfo(int fd, KvPeerInfo* info, std::string* write_key);

}  // namespace headway
