// The "nccl" backend of Communicator (comm/communicator.h): NCCL among CUDA
// ranks. Built only when the CUDA toolkit and NCCL are found; internal to
// comm/ (keeps CUDA and NCCL headers out of communicator.h).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace headway {

// Selects CUDA device options.device, then rank 0 creates the NCCL unique id
// and publishes its bytes in `store` under "<key_prefix>/nccl/id"; all ranks
// initialise a non-blocking NCCL communicator and wait for it until
// options.timeout (then abort it). Collectives take DEVICE pointers, run on
// one stream owned by the communicator and return once that stream is done;
// a collective still running after the timeout is aborted
// (ncclCommAbort) and the communicator is broken.
//
// AllReduceSum is NCCL's all-reduce, whose ring and tree algorithms share
// each reduced chunk with every rank, so all ranks end bit-identical.
//
// Errors: Unavailable("nccl: no CUDA device ...") without a usable GPU;
// InvalidArgument for a device ordinal out of range; Unavailable naming
// "nccl", the operation and NCCL's or CUDA's message otherwise.
// Not thread-safe: one thread calls the collectives.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommunicatorOptions& options,
                                                             RendezvousStore& store);

}  // namespace headway
