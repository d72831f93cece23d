#include "comm/shm_communicator.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kShmMagic = 0x4857534852454431ull;  // "HWSHRED1"
constexpr auto kLivenessPeriod = std::chrono::milliseconds(5);
// Longest single futex sleep: bounds how late a dead peer or the timeout is
// noticed when nobody wakes us.
constexpr long kFutexSleepNs = 5'000'000;

// Segment layout, each part 64-byte aligned so ranks never share a line:
//   ShmHeader                       magic, geometry, shared counters
//   ShmRank[size]                   per rank: pid, last step it arrived at
//   slots[2][size][slot_floats]     f32; a collective step s uses set s % 2
// Counters only grow (mod 2^32); a barrier at step s is complete when
// `arrived` reaches s * size.
struct alignas(64) ShmHeader {
  uint64_t magic;
  uint32_t size;
  uint32_t slot_floats;
  alignas(64) uint32_t attached;  // ranks that mapped the segment; futex word
  alignas(64) uint32_t arrived;   // barrier arrivals so far; futex word
  uint32_t sleepers;              // ranks inside a futex wait
  uint32_t aborted;               // nonzero once any rank's collective failed
};

struct alignas(64) ShmRank {
  int32_t pid;
  uint32_t step;
};

size_t SlotsOffset(int size) { return sizeof(ShmHeader) + sizeof(ShmRank) * size; }

size_t SegmentBytes(int size, size_t slot_floats) {
  return SlotsOffset(size) + 2 * static_cast<size_t>(size) * slot_floats * sizeof(float);
}

template <typename T>
std::atomic_ref<T> Atomic(T& value) {
  return std::atomic_ref<T>(value);
}

void FutexWait(uint32_t* word, uint32_t expected, long timeout_ns) {
  timespec ts{timeout_ns / 1'000'000'000, timeout_ns % 1'000'000'000};
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

// False once `pid` has exited, including as an unreaped zombie (kill(2)
// still succeeds for those).
bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return errno != ENOENT;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr || close[1] == '\0' || close[2] == '\0') return true;
  return close[2] != 'Z' && close[2] != 'X';
}

std::string SegmentName(const std::string& key_prefix) {
  std::string clean;
  for (char c : key_prefix.substr(0, 64)) {
    clean += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  }
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "%d-%08x", static_cast<int>(getpid()), rd());
  return "/headway-" + clean + "-" + suffix;
}

class ShmCommunicator final : public Communicator {
 public:
  // `base` is a mapping of SegmentBytes(size, slot_floats) bytes (owned,
  // unmapped on destruction), or null for size 1.
  ShmCommunicator(int rank, int size, std::chrono::milliseconds timeout, void* base,
                  size_t mapped_bytes, size_t slot_floats)
      : Communicator(rank, size),
        timeout_(timeout),
        base_(base),
        mapped_bytes_(mapped_bytes),
        slot_floats_(slot_floats),
        header_(static_cast<ShmHeader*>(base)),
        ranks_(base ? reinterpret_cast<ShmRank*>(static_cast<char*>(base) + sizeof(ShmHeader))
                    : nullptr),
        slots_(base ? reinterpret_cast<float*>(static_cast<char*>(base) + SlotsOffset(size))
                    : nullptr),
        self_pid_(getpid()),
        // More ranks than cores: a spinning rank steals the core a peer
        // needs, so go to sleep almost at once.
        spin_ns_(static_cast<unsigned>(size) > std::thread::hardware_concurrency() ? 2'000
                                                                                  : 50'000) {}

  ~ShmCommunicator() override {
    if (base_ != nullptr) munmap(base_, mapped_bytes_);
  }

  const char* backend() const override { return "shm"; }

  Status AllReduceSum(float* data, size_t count) override {
    if (!broken_.ok()) return broken_;
    if (count == 0 || size() == 1) return Status::Ok();
    if (data == nullptr) return Status::InvalidArgument("shm all-reduce: data is null");
    for (size_t begin = 0; begin < count; begin += slot_floats_) {
      const size_t n = std::min(slot_floats_, count - begin);
      const int set = static_cast<int>(step_ & 1);
      std::memcpy(Slot(set, rank()), data + begin, n * sizeof(float));
      HW_RETURN_IF_ERROR(Fail(Arrive("all-reduce")));
      SumInRankOrder(set, n, data + begin);
    }
    return Status::Ok();
  }

  Status Gather(const float* in, size_t count, float* out, int root) override {
    if (root < 0 || root >= size()) {
      return Status::InvalidArgument("shm gather: root " + std::to_string(root) + " outside [0, " +
                                     std::to_string(size()) + ")");
    }
    if (count > 0 && in == nullptr) return Status::InvalidArgument("shm gather: in is null");
    if (count > 0 && rank() == root && out == nullptr) {
      return Status::InvalidArgument("shm gather: out is null on the root");
    }
    if (!broken_.ok()) return broken_;
    if (count == 0) return Status::Ok();
    if (size() == 1) {
      std::memmove(out, in, count * sizeof(float));
      return Status::Ok();
    }
    for (size_t begin = 0; begin < count; begin += slot_floats_) {
      const size_t n = std::min(slot_floats_, count - begin);
      const int set = static_cast<int>(step_ & 1);
      std::memcpy(Slot(set, rank()), in + begin, n * sizeof(float));
      HW_RETURN_IF_ERROR(Fail(Arrive("gather")));
      if (rank() != root) continue;
      for (int r = 0; r < size(); ++r) {
        std::memcpy(out + r * count + begin, Slot(set, r), n * sizeof(float));
      }
    }
    return Status::Ok();
  }

  Status Barrier() override {
    if (!broken_.ok()) return broken_;
    if (size() == 1) return Status::Ok();
    return Fail(Arrive("barrier"));
  }

  // Connection: publishes this rank's pid, counts it as attached and waits
  // until all ranks are.
  Status Attach(Clock::time_point deadline) {
    // Claim this rank's place: a second process started with the same rank
    // must not count as a member (the group would form without the real one).
    int32_t unclaimed = 0;
    if (!Atomic(ranks_[rank()].pid).compare_exchange_strong(unclaimed, self_pid_,
                                                             std::memory_order_acq_rel)) {
      return Status::Unavailable("shm connect: rank " + std::to_string(rank()) +
                                 " is already taken by pid " + std::to_string(unclaimed));
    }
    Atomic(header_->attached).fetch_add(1, std::memory_order_seq_cst);
    Wake(&header_->attached);
    return Fail(WaitUntil(&header_->attached, static_cast<uint32_t>(size()), deadline, "connect"));
  }

 private:
  float* Slot(int set, int r) const {
    return slots_ + (static_cast<size_t>(set) * size() + r) * slot_floats_;
  }

  // out[i] = ((s0[i] + s1[i]) + s2[i]) + ...: one order on every rank, so the
  // results are bit-identical. Blocked so each block of `out` stays in L1.
  void SumInRankOrder(int set, size_t n, float* __restrict out) const {
    constexpr size_t kBlock = 2048;
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t e = std::min(n, b + kBlock);
      const float* __restrict s0 = Slot(set, 0);
      const float* __restrict s1 = Slot(set, 1);
      for (size_t i = b; i < e; ++i) out[i] = s0[i] + s1[i];
      for (int r = 2; r < size(); ++r) {
        const float* __restrict sr = Slot(set, r);
        for (size_t i = b; i < e; ++i) out[i] += sr[i];
      }
    }
  }

  // The barrier of one collective step: returns once every rank arrived.
  Status Arrive(const char* op) {
    ++step_;
    Atomic(ranks_[rank()].step).store(step_, std::memory_order_relaxed);
    const uint32_t target = step_ * static_cast<uint32_t>(size());
    const uint32_t now = Atomic(header_->arrived).fetch_add(1, std::memory_order_seq_cst) + 1;
    if (now == target) {
      Wake(&header_->arrived);
      return Status::Ok();
    }
    return WaitUntil(&header_->arrived, target, Clock::now() + timeout_, op);
  }

  void Wake(uint32_t* word) {
    // Pairs with the sleepers increment in WaitUntil (both seq_cst): either
    // we see the sleeper, or it sees our increment before sleeping.
    if (Atomic(header_->sleepers).load(std::memory_order_seq_cst) > 0) FutexWakeAll(word);
  }

  // Waits until the counter `*word` reaches `target` (mod 2^32).
  Status WaitUntil(uint32_t* word, uint32_t target, Clock::time_point deadline, const char* op) {
    auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
    const auto spin_until = Clock::now() + std::chrono::nanoseconds(spin_ns_);
    for (;;) {
      for (int i = 0; i < 32; ++i) {
        if (reached(Atomic(*word).load(std::memory_order_acquire))) return Status::Ok();
        _mm_pause();
      }
      if (Clock::now() >= spin_until) break;
    }
    Atomic(header_->sleepers).fetch_add(1, std::memory_order_seq_cst);
    auto next_check = Clock::now() + kLivenessPeriod;
    Status status;
    for (;;) {
      const uint32_t v = Atomic(*word).load(std::memory_order_seq_cst);
      if (reached(v)) break;
      if (Atomic(header_->aborted).load(std::memory_order_acquire) != 0) {
        status = Status::Unavailable(std::string("shm ") + op + ": another rank's collective failed");
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        status = TimeoutError(op);
        break;
      }
      if (now >= next_check) {
        status = CheckPeers(op);
        if (!status.ok()) break;
        next_check = now + kLivenessPeriod;
      }
      FutexWait(word, v, kFutexSleepNs);
    }
    Atomic(header_->sleepers).fetch_sub(1, std::memory_order_seq_cst);
    return status;
  }

  Status CheckPeers(const char* op) const {
    for (int r = 0; r < size(); ++r) {
      const int32_t pid = Atomic(ranks_[r].pid).load(std::memory_order_acquire);
      if (r == rank() || pid <= 0 || pid == self_pid_) continue;
      if (!ProcessAlive(pid)) {
        return Status::Unavailable("shm " + std::string(op) + ": rank " + std::to_string(r) +
                                   " (pid " + std::to_string(pid) + ") died");
      }
    }
    return Status::Ok();
  }

  Status TimeoutError(const char* op) const {
    std::string missing;
    for (int r = 0; r < size(); ++r) {
      const bool joined = std::string(op) == "connect"
                              ? Atomic(ranks_[r].pid).load(std::memory_order_acquire) > 0
                              : static_cast<int32_t>(
                                    Atomic(ranks_[r].step).load(std::memory_order_relaxed) -
                                    step_) >= 0;
      if (joined) continue;
      if (!missing.empty()) missing += ',';
      missing += std::to_string(r);
    }
    return Status::Unavailable("shm " + std::string(op) + ": timed out after " +
                               std::to_string(timeout_.count()) + " ms waiting for rank(s) " +
                               missing);
  }

  // Records the first failure, tells the other ranks and returns it.
  Status Fail(Status status) {
    if (status.ok()) return status;
    broken_ = status;
    Atomic(header_->aborted).store(1, std::memory_order_release);
    FutexWakeAll(&header_->arrived);
    FutexWakeAll(&header_->attached);
    return status;
  }

  // Constant after construction.
  const std::chrono::milliseconds timeout_;
  void* const base_;
  const size_t mapped_bytes_;
  const size_t slot_floats_;
  ShmHeader* const header_;
  ShmRank* const ranks_;   // [size]
  float* const slots_;     // [2][size][slot_floats]
  const int32_t self_pid_;
  const long spin_ns_;

  uint32_t step_ = 0;  // collective steps this rank has entered
  Status broken_;      // the first failure; every later call returns it
};

// Maps the open segment `fd` of `bytes` bytes.
Result<void*> MapSegment(int fd, size_t bytes, const std::string& name) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return Status::Unavailable("shm connect: mmap " + name + ": " + strerror(errno));
  }
  return base;
}

}  // namespace

namespace {

// Unlinks /dev/shm segments of this prefix whose creating rank 0 (the pid in
// the name) is gone: a rank 0 killed before every rank attached leaves its
// segment behind, and no one else knows to remove it.
void RemoveStaleSegments(const std::string& key_prefix) {
  const std::string prefix = SegmentName(key_prefix).substr(1);  // "headway-<clean>-<pid>-<rand>"
  const std::string stem = prefix.substr(0, prefix.rfind('-', prefix.rfind('-') - 1) + 1);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(stem, 0) != 0) continue;
    // The rest must be exactly "<pid>-<8 hex digits>" (another prefix may
    // share the stem).
    const std::string rest = file.substr(stem.size());
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || rest.size() != dash + 9) continue;
    if (!std::all_of(rest.begin(), rest.begin() + long(dash), ::isdigit)) continue;
    if (!std::all_of(rest.begin() + long(dash) + 1, rest.end(), ::isxdigit)) continue;
    const int pid = std::atoi(rest.c_str());
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) shm_unlink(("/" + file).c_str());
  }
}

// A non-zero rank opens the segment rank 0 published. The key may still name
// the segment of an earlier rank 0 that died (the store outlives it), so a
// missing segment means "ask again" until the deadline.
Result<int> OpenPublishedSegment(RendezvousStore& store, const std::string& key,
                                 Clock::time_point deadline, std::string* name) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    HW_ASSIGN_OR_RETURN(*name, store.Get(key, std::max(left, std::chrono::milliseconds(1))));
    const int fd = shm_open(name->c_str(), O_RDWR, 0);
    if (fd >= 0) return fd;
    if (errno != ENOENT) {
      return Status::Unavailable("shm connect: shm_open " + *name + ": " + strerror(errno));
    }
    if (Clock::now() >= deadline) {
      return Status::Unavailable("shm connect: the group's segment " + *name +
                                 " is gone: the group formed without this rank (is this rank "
                                 "already running?) or its rank 0 died");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

Result<std::unique_ptr<Communicator>> CreateShmCommunicator(const CommunicatorOptions& options,
                                                            RendezvousStore& store) {
  if (options.size == 1) {
    return std::unique_ptr<Communicator>(
        new ShmCommunicator(0, 1, options.timeout, nullptr, 0, kShmSlotFloats));
  }
  const auto deadline = Clock::now() + options.connect_timeout;
  const size_t bytes = SegmentBytes(options.size, kShmSlotFloats);
  const std::string key = options.key_prefix + "/shm/segment";
  std::string name;
  int fd = -1;
  if (options.rank == 0) {
    RemoveStaleSegments(options.key_prefix);
    name = SegmentName(options.key_prefix);
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return Status::Unavailable("shm connect: shm_open " + name + ": " + strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      Status status = Status::Unavailable("shm connect: ftruncate " + name + " to " +
                                          std::to_string(bytes) + " bytes: " + strerror(errno));
      close(fd);
      shm_unlink(name.c_str());
      return status;
    }
  } else {
    HW_ASSIGN_OR_RETURN(fd, OpenPublishedSegment(store, key, deadline, &name));
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      return Status::Unavailable("shm connect: segment " + name +
                                 " has the wrong size (do all ranks agree on size " +
                                 std::to_string(options.size) + "?)");
    }
  }
  Result<void*> mapped = MapSegment(fd, bytes, name);
  close(fd);
  if (!mapped.ok()) {
    if (options.rank == 0) shm_unlink(name.c_str());
    return mapped.status();
  }
  auto* header = static_cast<ShmHeader*>(*mapped);
  if (options.rank == 0) {
    // Fresh pages are zero: only the geometry needs writing.
    header->magic = kShmMagic;
    header->size = static_cast<uint32_t>(options.size);
    header->slot_floats = static_cast<uint32_t>(kShmSlotFloats);
  } else if (header->magic != kShmMagic || header->size != static_cast<uint32_t>(options.size)) {
    munmap(*mapped, bytes);
    return Status::Unavailable("shm connect: segment " + name + " is not a group of size " +
                               std::to_string(options.size));
  }
  auto comm = std::make_unique<ShmCommunicator>(options.rank, options.size, options.timeout,
                                                *mapped, bytes, kShmSlotFloats);
  Status status;
  if (options.rank == 0) status = store.Set(key, name);
  if (status.ok()) status = comm->Attach(deadline);
  // Every rank has the segment mapped (or the group failed): the name is no
  // longer needed.
  if (options.rank == 0) shm_unlink(name.c_str());
  if (!status.ok()) return status;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace headway
