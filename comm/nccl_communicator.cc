#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

// How often a wait polls the stream and NCCL's asynchronous error.
constexpr auto kPollPeriod = std::chrono::microseconds(20);

Status CudaError(const std::string& what, cudaError_t err) {
  return Status::Unavailable("nccl " + what + ": CUDA error: " + cudaGetErrorString(err));
}

Status NcclError(const std::string& what, ncclResult_t res, ncclComm_t comm) {
  std::string msg = "nccl " + what + ": " + ncclGetErrorString(res);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  }
  return Status::Unavailable(msg);
}

// Polls a non-blocking communicator until its pending call completed
// (ncclSuccess), failed, or the deadline passed.
Status WaitComm(ncclComm_t comm, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(comm, &state);
    if (res != ncclSuccess) return NcclError(what, res, comm);
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) return NcclError(what, state, comm);
    if (Clock::now() >= deadline) return Status::Unavailable("nccl " + what + ": timed out");
    std::this_thread::sleep_for(kPollPeriod);
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, std::chrono::milliseconds timeout, int device,
                   ncclComm_t comm, cudaStream_t stream, float* scratch)
      : Communicator(rank, size),
        timeout_(timeout),
        device_(device),
        comm_(comm),
        stream_(stream),
        scratch_(scratch) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (!comm_aborted_) {
      bool destroyed = false;
      ncclResult_t res = ncclCommFinalize(comm_);
      if ((res == ncclSuccess || res == ncclInProgress) &&
          WaitComm(comm_, Clock::now() + timeout_, "finalize").ok()) {
        destroyed = ncclCommDestroy(comm_) == ncclSuccess;
      }
      if (!destroyed) ncclCommAbort(comm_);
    }
    cudaStreamDestroy(stream_);
    cudaFree(scratch_);
  }

  const char* backend() const override { return "nccl"; }

  Status AllReduceSum(float* data, size_t count) override {
    if (!broken_.ok()) return broken_;
    if (count == 0) return Status::Ok();
    if (data == nullptr) return Status::InvalidArgument("nccl all-reduce: data is null");
    return Run("all-reduce", [&] {
      return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_);
    });
  }

  Status Gather(const float* in, size_t count, float* out, int root) override {
    if (root < 0 || root >= size()) {
      return Status::InvalidArgument("nccl gather: root " + std::to_string(root) +
                                     " outside [0, " + std::to_string(size()) + ")");
    }
    if (count > 0 && in == nullptr) return Status::InvalidArgument("nccl gather: in is null");
    if (count > 0 && rank() == root && out == nullptr) {
      return Status::InvalidArgument("nccl gather: out is null on the root");
    }
    if (!broken_.ok()) return broken_;
    if (count == 0) return Status::Ok();
    return Run("gather", [&]() -> ncclResult_t {
      if (rank() == root) {
        cudaError_t err = cudaMemcpyAsync(out + root * count, in, count * sizeof(float),
                                          cudaMemcpyDeviceToDevice, stream_);
        if (err != cudaSuccess) return ncclUnhandledCudaError;
      }
      ncclResult_t res = ncclGroupStart();
      if (res != ncclSuccess) return res;
      if (rank() == root) {
        for (int r = 0; r < size(); ++r) {
          if (r == root) continue;
          res = ncclRecv(out + r * count, count, ncclFloat, r, comm_, stream_);
          if (res != ncclSuccess && res != ncclInProgress) break;
        }
      } else {
        res = ncclSend(in, count, ncclFloat, root, comm_, stream_);
      }
      ncclResult_t end = ncclGroupEnd();
      return (res != ncclSuccess && res != ncclInProgress) ? res : end;
    });
  }

  Status Barrier() override {
    if (!broken_.ok()) return broken_;
    return Run("barrier", [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_);
    });
  }

 private:
  // Enqueues with `enqueue`, then waits for the stream until the timeout;
  // any failure breaks the communicator (and aborts NCCL on a timeout).
  template <typename Enqueue>
  Status Run(const char* op, Enqueue enqueue) {
    const auto deadline = Clock::now() + timeout_;
    broken_ = RunUntil(op, enqueue, deadline);
    if (!broken_.ok()) {
      ncclCommAbort(comm_);
      comm_aborted_ = true;
    }
    return broken_;
  }

  template <typename Enqueue>
  Status RunUntil(const char* op, Enqueue enqueue, Clock::time_point deadline) {
    cudaError_t err = cudaSetDevice(device_);
    if (err != cudaSuccess) return CudaError(op, err);
    ncclResult_t res = enqueue();
    if (res != ncclSuccess && res != ncclInProgress) return NcclError(op, res, comm_);
    HW_RETURN_IF_ERROR(WaitComm(comm_, deadline, op));
    for (;;) {
      err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return Status::Ok();
      if (err != cudaErrorNotReady) return CudaError(op, err);
      ncclResult_t state = ncclSuccess;
      res = ncclCommGetAsyncError(comm_, &state);
      if (res != ncclSuccess) return NcclError(op, res, comm_);
      if (state != ncclSuccess && state != ncclInProgress) return NcclError(op, state, comm_);
      if (Clock::now() >= deadline) {
        return Status::Unavailable(std::string("nccl ") + op + ": timed out after " +
                                   std::to_string(timeout_.count()) + " ms");
      }
      std::this_thread::sleep_for(kPollPeriod);
    }
  }

  // Constant after construction.
  const std::chrono::milliseconds timeout_;
  const int device_;
  ncclComm_t const comm_;
  cudaStream_t const stream_;
  float* const scratch_;  // one device float for Barrier

  bool comm_aborted_ = false;
  Status broken_;  // the first failure; every later call returns it
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommunicatorOptions& options,
                                                             RendezvousStore& store) {
  const auto deadline = Clock::now() + options.connect_timeout;
  int num_devices = 0;
  cudaError_t err = cudaGetDeviceCount(&num_devices);
  if (err != cudaSuccess || num_devices == 0) {
    return Status::Unavailable(std::string("nccl: no CUDA device (cudaGetDeviceCount: ") +
                               (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")");
  }
  if (options.device < 0 || options.device >= num_devices) {
    return Status::InvalidArgument("nccl: device " + std::to_string(options.device) +
                                   " outside [0, " + std::to_string(num_devices) + ")");
  }
  err = cudaSetDevice(options.device);
  if (err != cudaSuccess) return CudaError("connect", err);

  const std::string key = options.key_prefix + "/nccl/id";
  ncclUniqueId id;
  if (options.rank == 0) {
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) return NcclError("connect: ncclGetUniqueId", res, nullptr);
    HW_RETURN_IF_ERROR(store.Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    HW_ASSIGN_OR_RETURN(std::string bytes, store.Get(key, options.connect_timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return Status::Unavailable("nccl connect: unique id under " + key + " has " +
                                 std::to_string(bytes.size()) + " bytes, expected " +
                                 std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  // Non-blocking so that a rank that never joins costs a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclError("connect: ncclCommInitRankConfig", res, nullptr);
  }
  Status status = WaitComm(comm, deadline, "connect");
  if (!status.ok()) {
    ncclCommAbort(comm);
    return status;
  }
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    ncclCommAbort(comm);
    return CudaError("connect: stream", err);
  }
  float* scratch = nullptr;
  err = cudaMalloc(&scratch, sizeof(float));
  if (err != cudaSuccess) {
    cudaStreamDestroy(stream);
    ncclCommAbort(comm);
    return CudaError("connect: scratch", err);
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      options.rank, options.size, options.timeout, options.device, comm, stream, scratch));
}

}  // namespace headway
