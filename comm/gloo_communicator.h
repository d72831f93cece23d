// The "gloo" backend of Communicator (comm/communicator.h): Gloo's TCP
// transport, for CPU ranks on any hosts. Internal to comm/; keeps Gloo's
// headers out of communicator.h.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace headway {

// Connects a full mesh of TCP pairs among options.size ranks: each rank
// listens on options.host (port chosen by the OS) and publishes its address
// in `store` under "<key_prefix>/gloo/<rank>". `store` is only used during
// this call. Size 1 opens no sockets.
//
// AllReduceSum uses Gloo's ring all-reduce (reduce-scatter, then all-gather):
// every element is summed once, on one rank, and the sum is copied to the
// others, so all ranks end bit-identical; the order of the summands differs
// between elements, so the result may differ from a rank-ordered sum in the
// last bits.
//
// Gloo writes to its sockets with writev(2): a process using this backend
// must ignore SIGPIPE (in main), or a peer that dies kills it.
//
// Not thread-safe: one thread calls the collectives. Errors: Unavailable
// naming "gloo", the operation and Gloo's message.
Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommunicatorOptions& options,
                                                             RendezvousStore& store);

}  // namespace headway
