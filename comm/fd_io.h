// Whole-buffer reads and writes on a file descriptor, and a KvPeerInfo sent
// over one: for processes that set up KV transfer between themselves through
// a pipe or socketpair (tests, benchmarks); serving exchanges KvEndpoint
// protos through the coordinator instead.
#pragma once

#include <cstddef>

#include "comm/kv_transfer.h"

namespace headway {

// Writes / reads exactly `n` bytes, retrying short transfers. False when the
// descriptor fails or (read) reaches end of file first.
bool WriteAll(int fd, const void* data, size_t n);
bool ReadAll(int fd, void* data, size_t n);

// Encoding: u32 length, worker_address; u64 block_bytes; u32 num_blocks, in
// host byte order (both ends on one host). ReceivePeerInfo refuses an
// address over 1 MiB. False on I/O failure.
bool SendPeerInfo(int fd, const KvPeerInfo& info);
bool ReceivePeerInfo(int fd, KvPeerInfo* info);

}  // namespace headway
