// The "shm" backend of Communicator (comm/communicator.h): all ranks on one
// host exchange data through one POSIX shared-memory segment. Internal to
// comm/.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace headway {

// Rank 0 creates the segment ("/headway-<key_prefix>-<pid>-<random>"),
// publishes its name in `store` under "<key_prefix>/shm/segment"; the others
// open it. Once every rank has attached, rank 0 unlinks the name, so no
// segment outlives the group even after a crash. Size 1 creates nothing.
//
// AllReduceSum sums every element in rank order, ((x0 + x1) + x2) + ..., on
// every rank from the same shared inputs, so all ranks end bit-identical
// and equal to a naive rank-ordered float sum. Buffers larger than one slot
// (kShmSlotFloats) go in chunks.
//
// Waiting spins briefly, then sleeps on a futex, so that more ranks than
// cores still make progress. While waiting, every few ms a rank checks that
// its peers' processes are alive (a dead or zombie pid fails the collective
// with Unavailable naming the rank and pid) and the timeout.
//
// Not thread-safe: one thread calls the collectives.
Result<std::unique_ptr<Communicator>> CreateShmCommunicator(const CommunicatorOptions& options,
                                                            RendezvousStore& store);

// Floats per rank per chunk (4 MiB).
inline constexpr size_t kShmSlotFloats = size_t{1} << 20;

}  // namespace headway
