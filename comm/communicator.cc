// CreateCommunicator (backend dispatch) and the two small stores: in-memory
// and socket-forwarded.
#include "comm/communicator.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "comm/gloo_communicator.h"
#include "comm/shm_communicator.h"
#ifdef HEADWAY_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace headway {
namespace {

class InMemoryStore final : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    bool found = cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; });
    if (!found) {
      return Status::Unavailable("timed out waiting for key " + key + " after " +
                                 std::to_string(timeout.count()) + " ms");
    }
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;  // guarded by mu_
};

// Wire format of the socket store, all integers little-endian host order
// (both ends are one host):
//   request:  u8 op ('S' or 'G') | u32 key_len | key | then
//             'S': u32 value_len | value      'G': i64 timeout_ms
//   response: u8 code (StatusCode) | u32 len | value (OK) or message
Status WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t rv = ::send(fd, p, n, MSG_NOSIGNAL);
    if (rv < 0 && errno == EINTR) continue;
    if (rv <= 0) return Status::Unavailable(std::string("store socket write: ") + strerror(errno));
    p += rv;
    n -= static_cast<size_t>(rv);
  }
  return Status::Ok();
}

// Reads exactly n bytes. `*closed` is set when the peer closed before the
// first byte (a clean end of the conversation).
Status ReadAll(int fd, void* data, size_t n, bool* closed = nullptr) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    ssize_t rv = ::recv(fd, p + got, n - got, 0);
    if (rv < 0 && errno == EINTR) continue;
    if (rv == 0 && got == 0 && closed != nullptr) {
      *closed = true;
      return Status::Ok();
    }
    if (rv <= 0) {
      return Status::Unavailable(rv == 0 ? std::string("store socket closed by peer")
                                         : std::string("store socket read: ") + strerror(errno));
    }
    got += static_cast<size_t>(rv);
  }
  return Status::Ok();
}

Status WriteString(int fd, const std::string& s) {
  uint32_t len = static_cast<uint32_t>(s.size());
  HW_RETURN_IF_ERROR(WriteAll(fd, &len, sizeof(len)));
  return WriteAll(fd, s.data(), s.size());
}

Result<std::string> ReadString(int fd) {
  uint32_t len = 0;
  HW_RETURN_IF_ERROR(ReadAll(fd, &len, sizeof(len)));
  std::string s(len, '\0');
  HW_RETURN_IF_ERROR(ReadAll(fd, s.data(), len));
  return s;
}

class SocketStoreClient final : public RendezvousStore {
 public:
  explicit SocketStoreClient(int fd) : fd_(fd) {}
  ~SocketStoreClient() override { ::close(fd_); }

  Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t op = 'S';
    HW_RETURN_IF_ERROR(WriteAll(fd_, &op, 1));
    HW_RETURN_IF_ERROR(WriteString(fd_, key));
    HW_RETURN_IF_ERROR(WriteString(fd_, value));
    return ReadResponse().status();
  }

  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t op = 'G';
    int64_t timeout_ms = timeout.count();
    HW_RETURN_IF_ERROR(WriteAll(fd_, &op, 1));
    HW_RETURN_IF_ERROR(WriteString(fd_, key));
    HW_RETURN_IF_ERROR(WriteAll(fd_, &timeout_ms, sizeof(timeout_ms)));
    return ReadResponse();
  }

 private:
  Result<std::string> ReadResponse() {
    uint8_t code = 0;
    HW_RETURN_IF_ERROR(ReadAll(fd_, &code, 1));
    HW_ASSIGN_OR_RETURN(std::string payload, ReadString(fd_));
    switch (static_cast<StatusCode>(code)) {
      case StatusCode::kOk:
        return payload;
      case StatusCode::kInvalidArgument:
        return Status::InvalidArgument(payload);
      default:
        return Status::Unavailable(payload);
    }
  }

  std::mutex mu_;
  const int fd_;  // owned
};

}  // namespace

std::unique_ptr<RendezvousStore> NewInMemoryStore() { return std::make_unique<InMemoryStore>(); }

std::unique_ptr<RendezvousStore> NewSocketStoreClient(int fd) {
  return std::make_unique<SocketStoreClient>(fd);
}

Status ServeRendezvousStore(RendezvousStore& store, int fd) {
  for (;;) {
    uint8_t op = 0;
    bool closed = false;
    HW_RETURN_IF_ERROR(ReadAll(fd, &op, 1, &closed));
    if (closed) return Status::Ok();
    HW_ASSIGN_OR_RETURN(std::string key, ReadString(fd));
    Status status;
    std::string value;
    if (op == 'S') {
      HW_ASSIGN_OR_RETURN(value, ReadString(fd));
      status = store.Set(key, value);
      value.clear();
    } else if (op == 'G') {
      int64_t timeout_ms = 0;
      HW_RETURN_IF_ERROR(ReadAll(fd, &timeout_ms, sizeof(timeout_ms)));
      Result<std::string> got = store.Get(key, std::chrono::milliseconds(timeout_ms));
      if (got.ok()) {
        value = std::move(got).value();
      } else {
        status = got.status();
      }
    } else {
      return Status::Unavailable("store socket: unknown request " + std::to_string(op));
    }
    uint8_t code = static_cast<uint8_t>(status.code());
    HW_RETURN_IF_ERROR(WriteAll(fd, &code, 1));
    HW_RETURN_IF_ERROR(WriteString(fd, status.ok() ? value : status.message()));
  }
}

Result<std::unique_ptr<Communicator>> CreateCommunicator(const CommunicatorOptions& options,
                                                         RendezvousStore& store) {
  if (options.size < 1) {
    return Status::InvalidArgument("communicator: size must be >= 1, got " +
                                   std::to_string(options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("communicator: rank " + std::to_string(options.rank) +
                                   " outside [0, " + std::to_string(options.size) + ")");
  }
  if (options.timeout.count() <= 0 || options.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("communicator: timeout and connect_timeout must be positive");
  }
  if (options.backend == "gloo") return CreateGlooCommunicator(options, store);
  if (options.backend == "shm") return CreateShmCommunicator(options, store);
  if (options.backend == "nccl") {
#ifdef HEADWAY_HAVE_NCCL
    return CreateNcclCommunicator(options, store);
#else
    return Status::Unimplemented("communicator: backend \"nccl\" needs a build with CUDA and NCCL");
#endif
  }
  return Status::InvalidArgument("communicator: unknown backend \"" + options.backend +
                                 "\" (expected gloo, shm or nccl)");
}

}  // namespace headway
