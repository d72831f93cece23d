// Collectives among the TP ranks of one instance (DESIGN.md "TP"). One
// interface, three backends:
//   "gloo"  Gloo over TCP: CPU ranks on any hosts.
//   "shm"   a same-host shared-memory all-reduce for CPU ranks (lower latency
//           than TCP loopback for the small decode-step tensors).
//   "nccl"  NCCL for CUDA ranks (device pointers; built when the CUDA
//           toolkit is found).
// Ranks meet through a RendezvousStore (the coordinator's key-value store
// in serving; an in-memory one in tests), never through a shared file.
//
// Every collective must be called by all ranks in the same order with the
// same counts. A collective that does not finish within the timeout, or
// whose peer died, returns an error; the communicator is then broken and the
// caller must not use it again (the worker exits, the coordinator marks the
// instance down).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace headway {

// Key-value store the ranks of one group use to find each other. Keys are
// plain strings scoped to the group by the store's owner; values are bytes.
// Implementations are thread-safe.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  // Publishes `value` under `key` (overwrites). Unavailable if the store
  // cannot be reached.
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists and returns its value. DeadlineExceeded-like
  // Unavailable ("timed out waiting for key ...") after `timeout`.
  virtual Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// An in-process store (std::map under a mutex), for tests and benchmarks
// that run every rank as a thread of one process.
std::unique_ptr<RendezvousStore> NewInMemoryStore();

// A store for ranks that are processes forked by one parent (tests,
// benchmarks): each call is forwarded over `fd`, a connected stream socket
// (one end of a socketpair), to ServeRendezvousStore running in the parent
// on the other end. Takes ownership of `fd` (closed on destruction).
// Thread-safe (calls are serialised). Errors: Unavailable when the socket
// fails or the server closed it; otherwise the served store's error.
std::unique_ptr<RendezvousStore> NewSocketStoreClient(int fd);

// Answers the requests of one NewSocketStoreClient arriving on `fd` from
// `store`, until the client closes its end (returns OK) or the socket fails
// (Unavailable). Blocks: run it on its own thread. Does not close `fd`.
Status ServeRendezvousStore(RendezvousStore& store, int fd);

struct CommunicatorOptions {
  std::string backend = "gloo";  // "gloo", "shm" or "nccl"
  int rank = 0;                  // in [0, size)
  int size = 1;
  // A collective that takes longer fails.
  std::chrono::milliseconds timeout{30000};
  // Joining the group (every rank must have started and loaded its weights)
  // fails after this long.
  std::chrono::milliseconds connect_timeout{120000};
  // gloo: the address other ranks dial to reach this rank (an IP, or a
  // name resolved here with getaddrinfo; "127.0.0.1" for a single host).
  // Never a wildcard.
  std::string advertise_host = "127.0.0.1";
  // gloo: where this rank listens: "" or a wildcard (0.0.0.0, ::) =
  // advertise_host; otherwise it must resolve to advertise_host's address
  // (Gloo binds what it publishes; comm/gloo_communicator.h).
  std::string bind_host;
  // Prefix for every key this communicator puts in the store, so that several
  // groups (or a restarted group) can share one store.
  std::string key_prefix = "tp";
  // nccl: the CUDA device ordinal of this rank.
  int device = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "gloo", "shm" or "nccl".
  virtual const char* backend() const = 0;

  // In place: data[i] = sum over ranks of data[i], for i in [0, count), f32.
  // Every rank ends with bit-identical values (each element is reduced once,
  // in one order, and the result shared). Host memory for gloo/shm, device
  // memory for nccl. Errors: Unavailable naming the backend and the cause
  // (peer closed the connection, timeout after timeout ms).
  virtual Status AllReduceSum(float* data, size_t count) = 0;

  // Rank `root` receives every rank's `count` floats of `in`, concatenated in
  // rank order into out[size() * count]; `out` is ignored on other ranks (may
  // be nullptr). Errors as AllReduceSum.
  virtual Status Gather(const float* in, size_t count, float* out, int root) = 0;

  // Returns once every rank has called it. Errors as AllReduceSum.
  virtual Status Barrier() = 0;

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}

 private:
  const int rank_;
  const int size_;
};

// Connects rank options.rank of a group of options.size through `store`;
// blocks until all ranks have joined or options.timeout passes. A group of
// size 1 needs no peers (collectives are no-ops / copies). Errors:
// InvalidArgument for a bad backend name, rank or size; Unimplemented for
// "nccl" in a build without CUDA; Unavailable when peers do not join in time
// or the transport fails.
Result<std::unique_ptr<Communicator>> CreateCommunicator(const CommunicatorOptions& options,
                                                         RendezvousStore& store);

}  // namespace headway
