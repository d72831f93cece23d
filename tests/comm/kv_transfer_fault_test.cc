// KV transfer when a peer process dies or stalls in the middle of a write.
// A decode worker (receiver: it only runs the agent's progress thread) must
// outlive any prefill worker (sender) and keep serving new ones; a sender
// must get Unavailable within its timeout when the receiver dies, and must
// connect to a fresh receiver afterwards.
//
// Every agent lives in its own forked child, driven by single-byte commands
// over a socketpair, so that an abort inside UCX shows up as a failed test
// (the child's wait status), never as a crashed test runner. ChildProcess
// kills and reaps its child on every path out.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/fd_io.h"
#include "comm/kv_transfer.h"
#include "tests/comm/kv_write_grant.h"
#include "tests/comm/transport_name.h"

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// 32 MiB pools: one flood write of every block (uncoalesced, reversed) is
// 2048 block messages of 16 KiB, long enough over loopback TCP that a kill lands
// mid-write, and the sender repeats it until stopped.
constexpr uint64_t kBlockBytes = 16 * 1024;
constexpr uint32_t kNumBlocks = 2048;
constexpr uint8_t kFloodSeed = 1;
constexpr uint8_t kReceiverSeed = 2;
constexpr uint8_t kFreshSenderSeed = 3;
// How long a flood runs before the fault is injected.
constexpr Millis kFloodBeforeFault(300);
// How long a receiver must stay up after its sender died: past UCX's TCP
// keepalive probes and the agent's UCX keepalive interval, so that every
// failure detection path on the receiver has fired.
constexpr Millis kSurviveWindow(6000);
// How long a sender is stopped (SIGSTOP) before it is killed.
constexpr Millis kStallWindow(6000);
// Sender timeout for writes to a receiver that gets killed.
constexpr Millis kWriteTimeout(2000);
// Timeout of the fresh sender's write (a healthy write takes milliseconds).
constexpr Millis kFreshWriteTimeout(4000);
// Generous limit for any single reply from a child (above kFreshWriteTimeout).
constexpr Millis kReplyTimeout(8000);

// Commands (parent -> child) and replies.
constexpr char kCmdQuit = 'q';
constexpr char kCmdPing = 'p';
constexpr char kCmdVerify = 'v';   // receiver: + seed; checks FreshCopies() from that seed
constexpr char kCmdConnect = 'c';  // sender: + KvPeerInfo; replies a StatusCode byte
constexpr char kCmdWrite = 'w';    // sender: write FreshCopies(); replies a StatusCode byte
constexpr char kCmdFlood = 'f';    // sender: replies a FloodStart, then floods

uint8_t PatternByte(uint32_t block, uint64_t offset, uint8_t seed) {
  return static_cast<uint8_t>(block * 131u + offset * 7u + seed * 29u);
}

std::vector<uint8_t> MakePool(uint8_t seed) {
  std::vector<uint8_t> pool(kBlockBytes * kNumBlocks);
  for (uint32_t b = 0; b < kNumBlocks; ++b) {
    for (uint64_t i = 0; i < kBlockBytes; ++i) pool[b * kBlockBytes + i] = PatternByte(b, i, seed);
  }
  return pool;
}

// What the fresh sender writes after a fault: runs and single blocks, spread
// over the pool (the flood overwrote all of it with kFloodSeed blocks).
std::vector<BlockCopy> FreshCopies() {
  std::vector<BlockCopy> copies;
  for (uint32_t i = 0; i < 16; ++i) copies.push_back({i, 1000 + i});
  for (uint32_t i = 0; i < 8; ++i) copies.push_back({500 + i, 7 - i});
  copies.push_back({kNumBlocks - 1, 100});
  copies.push_back({3, kNumBlocks - 1});
  return copies;
}

// Every block, last to first into first to last: one message per block.
std::vector<BlockCopy> FloodCopies() {
  std::vector<BlockCopy> copies;
  for (uint32_t b = 0; b < kNumBlocks; ++b) copies.push_back({b, kNumBlocks - 1 - b});
  return copies;
}

// ---- byte I/O with deadlines ---------------------------------------------------

// Reads exactly n bytes unless `timeout` passes or the peer closes first.
bool ReadWithin(int fd, void* data, size_t n, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  auto* out = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t r = read(fd, out + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

// ---- child processes ----------------------------------------------------------

// A forked child running `body(fd)`, connected to the parent by a
// socketpair. The destructor SIGKILLs and reaps it unless Reap already did.
class ChildProcess {
 public:
  static std::unique_ptr<ChildProcess> Start(const std::function<int(int)>& body) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
    std::cout.flush();  // the child must not inherit (and repeat) buffered output
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
      close(fds[0]);
      close(fds[1]);
      return nullptr;
    }
    if (pid == 0) {
      close(fds[0]);
      _exit(body(fds[1]));
    }
    close(fds[1]);
    return std::unique_ptr<ChildProcess>(new ChildProcess(pid, fds[0]));
  }
  ~ChildProcess() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int fd() const { return fd_; }
  void Signal(int sig) const { kill(pid_, sig); }

  // True while the child has not exited (reaps it when it has).
  bool Alive() {
    if (reaped_) return false;
    if (waitpid(pid_, &wait_status_, WNOHANG) == 0) return true;
    reaped_ = true;
    return false;
  }

  // Waits up to `timeout` for the child to exit on its own (then SIGKILLs
  // it) and describes how it ended: "exit 0", "exit N", "signal N".
  std::string Reap(Millis timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Alive() && Clock::now() < deadline) std::this_thread::sleep_for(Millis(10));
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &wait_status_, 0);
      reaped_ = true;
      return "killed after not exiting within " + std::to_string(timeout.count()) + " ms";
    }
    return Describe();
  }

  // How the reaped child ended.
  std::string Describe() const {
    if (WIFEXITED(wait_status_)) return "exit " + std::to_string(WEXITSTATUS(wait_status_));
    if (WIFSIGNALED(wait_status_)) {
      return "signal " + std::to_string(WTERMSIG(wait_status_)) + " (" +
             strsignal(WTERMSIG(wait_status_)) + ")";
    }
    return "status " + std::to_string(wait_status_);
  }

 private:
  ChildProcess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  const pid_t pid_;
  const int fd_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

std::unique_ptr<KvTransferAgent> CreateAgent(std::vector<uint8_t>& pool, const std::string& tls) {
  KvTransferOptions options;
  options.transports = tls;
  options.coalesce_runs = false;
  auto agent = KvTransferAgent::Create(pool.data(), kBlockBytes, kNumBlocks, options);
  return agent.ok() ? std::move(agent).value() : nullptr;
}

// Receiver child: publishes its info, then answers pings and verify requests
// until told to quit (exit 0) or the parent goes away.
int RunReceiver(int fd, const std::string& tls) {
  std::vector<uint8_t> pool = MakePool(kReceiverSeed);
  auto agent = CreateAgent(pool, tls);
  if (agent == nullptr || !SendPeerInfo(fd, agent->local_info(), agent->write_key())) return 2;
  for (;;) {
    char cmd = 0;
    if (!ReadAll(fd, &cmd, 1) || cmd == kCmdQuit) break;
    char reply = cmd;
    if (cmd == kCmdVerify) {
      char seed = 0;
      if (!ReadAll(fd, &seed, 1)) break;
      std::vector<uint8_t> src = MakePool(static_cast<uint8_t>(seed));
      reply = 1;
      for (const BlockCopy& c : FreshCopies()) {
        if (std::memcmp(&pool[c.dst * kBlockBytes], &src[c.src * kBlockBytes], kBlockBytes) != 0) {
          reply = 0;
        }
      }
    }
    if (!WriteAll(fd, &reply, 1)) break;
  }
  agent.reset();
  return 0;
}

// How a flood began: the first write's status code and how long it took.
struct FloodStart {
  int32_t code = 0;
  int64_t first_write_ms = 0;
};

// The outcome of a flood that ended: the failing call's status code and how
// long that call took.
struct FloodEnd {
  int32_t code = 0;
  int64_t call_ms = 0;
};

// Sender child: connects on request, writes FreshCopies() on request, or
// floods the peer with FloodCopies() (reports a FloodStart after the first
// write) until a write fails (then reports a FloodEnd). Exits 0 when the
// parent goes away or says quit.
int RunSender(int fd, const std::string& tls, uint8_t seed) {
  std::vector<uint8_t> pool = MakePool(seed);
  auto agent = CreateAgent(pool, tls);
  if (agent == nullptr) return 2;
  int peer = -1;
  std::string key;  // the receiver's write key: this test plays the coordinator
  for (;;) {
    char cmd = 0;
    if (!ReadAll(fd, &cmd, 1) || cmd == kCmdQuit) break;
    if (cmd == kCmdConnect) {
      KvPeerInfo info;
      if (!ReceivePeerInfo(fd, &info, &key)) return 3;
      auto handle = agent->Connect(info);
      char code = static_cast<char>(handle.status().code());
      if (handle.ok()) peer = *handle;
      if (!WriteAll(fd, &code, 1)) break;
    } else if (cmd == kCmdWrite) {
      Status st = agent->WriteBlocks(peer, FreshCopies(), testing::Grant(key, FreshCopies()),
                                     kFreshWriteTimeout);
      char code = static_cast<char>(st.code());
      if (!WriteAll(fd, &code, 1)) break;
    } else if (cmd == kCmdFlood) {
      const std::vector<BlockCopy> copies = FloodCopies();
      FloodEnd end;
      for (bool first = true;; first = false) {
        const auto start = Clock::now();
        Status st = agent->WriteBlocks(peer, copies, testing::Grant(key, copies), kWriteTimeout);
        const int64_t ms = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
        if (first) {
          const FloodStart begin{static_cast<int32_t>(st.code()), ms};
          if (!WriteAll(fd, &begin, sizeof begin)) return 0;
        }
        if (!st.ok()) {
          end.code = static_cast<int32_t>(st.code());
          end.call_ms = ms;
          break;
        }
      }
      if (!WriteAll(fd, &end, sizeof end)) break;
    }
  }
  agent.reset();
  return 0;
}

// A receiver's info and write key, as the coordinator holds them.
struct PeerInfoAndKey {
  KvPeerInfo info;
  std::string key;
};

class KvTransferFaultTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A write to a dead child's socket must fail with EPIPE, not kill the
  // test runner with SIGPIPE.
  void SetUp() override { old_sigpipe_ = signal(SIGPIPE, SIG_IGN); }
  void TearDown() override { signal(SIGPIPE, old_sigpipe_); }

  std::unique_ptr<ChildProcess> StartReceiver(PeerInfoAndKey* info) {
    const std::string tls = GetParam();
    auto child = ChildProcess::Start([tls](int fd) { return RunReceiver(fd, tls); });
    if (child == nullptr || !ReceivePeerInfo(child->fd(), &info->info, &info->key)) return nullptr;
    return child;
  }

  std::unique_ptr<ChildProcess> StartSender(uint8_t seed) {
    const std::string tls = GetParam();
    return ChildProcess::Start([tls, seed](int fd) { return RunSender(fd, tls, seed); });
  }

  // Sends `cmd` (and `info` for kCmdConnect) and returns the one-byte reply,
  // or -1 when none came within kReplyTimeout.
  static int Command(ChildProcess& child, char cmd, const PeerInfoAndKey* info = nullptr) {
    if (!WriteAll(child.fd(), &cmd, 1)) return -1;
    if (info != nullptr && !SendPeerInfo(child.fd(), info->info, info->key)) return -1;
    return Reply(child);
  }

  // Asks a receiver whether it holds FreshCopies() from a pool of `seed`.
  static int Verify(ChildProcess& receiver, uint8_t seed) {
    const char cmd[2] = {kCmdVerify, static_cast<char>(seed)};
    if (!WriteAll(receiver.fd(), cmd, 2)) return -1;
    return Reply(receiver);
  }

  static int Reply(ChildProcess& child) {
    char reply = 0;
    if (!ReadWithin(child.fd(), &reply, 1, kReplyTimeout)) return -1;
    return reply;
  }

  // Starts a sender that connects to `receiver` and floods it; returns once
  // the flood has run for kFloodBeforeFault.
  std::unique_ptr<ChildProcess> StartFlood(const PeerInfoAndKey& info) {
    auto sender = StartSender(kFloodSeed);
    if (sender == nullptr) return nullptr;
    const int connected = Command(*sender, kCmdConnect, &info);
    EXPECT_EQ(connected, static_cast<int>(StatusCode::kOk)) << "flood sender's Connect";
    if (connected != static_cast<int>(StatusCode::kOk)) return nullptr;
    FloodStart begin;
    const char flood = kCmdFlood;
    const bool started = WriteAll(sender->fd(), &flood, 1) &&
                         ReadWithin(sender->fd(), &begin, sizeof begin, kReplyTimeout);
    EXPECT_TRUE(started) << "flood sender never finished its first write";
    EXPECT_EQ(begin.code, static_cast<int32_t>(StatusCode::kOk)) << "flood's first write";
    if (!started || begin.code != static_cast<int32_t>(StatusCode::kOk)) return nullptr;
    // One flood write is what a fault interrupts; how long it takes shows
    // how likely a fault lands mid-write (the flood writes back to back).
    RecordProperty("flood_write_ms", std::to_string(begin.first_write_ms));
    std::cout << "[ INFO     ] one flood write (" << kNumBlocks << " x " << kBlockBytes
              << " B) took " << begin.first_write_ms << " ms" << std::endl;
    std::this_thread::sleep_for(kFloodBeforeFault);
    return sender;
  }

  // True for shared memory: UCX 1.13's mm transports (posix, sysv) carry
  // every message through one FIFO per receiver that all senders share. A
  // sender claims a slot (uct_mm_ep_get_remote_elem: atomic cswap of the
  // FIFO head) before it writes the element and marks it ready; one killed
  // in between leaves a slot that is never marked, and the receiver, which
  // reads in order, waits on it for good ("no peer failure handler" in
  // UCX's own words). The receiver lives on, but new senders over shared
  // memory may then time out: a known UCX limit, not a Headway bug.
  bool SharedMemoryFifoMayWedge() const { return GetParam().find("sm") != std::string::npos; }

  // Keeps checking for `window` that the receiver neither exits nor stops
  // answering; then a fresh sender connects, writes FreshCopies() and the
  // receiver finds the bytes intact (over shared memory the write may
  // instead time out, see SharedMemoryFifoMayWedge); finally the receiver
  // exits cleanly.
  void ExpectReceiverServesFreshSender(std::unique_ptr<ChildProcess> receiver,
                                       const PeerInfoAndKey& info, Millis window) {
    const auto end = Clock::now() + window;
    while (Clock::now() < end) {
      ASSERT_EQ(Command(*receiver, kCmdPing), kCmdPing)
          << "receiver stopped answering: " << receiver->Reap(Millis(3000));
      std::this_thread::sleep_for(Millis(250));
    }
    auto fresh = StartSender(kFreshSenderSeed);
    ASSERT_NE(fresh, nullptr);
    EXPECT_EQ(Command(*fresh, kCmdConnect, &info), static_cast<int>(StatusCode::kOk))
        << "fresh sender's Connect";
    const int written = Command(*fresh, kCmdWrite);
    if (written == static_cast<int>(StatusCode::kUnavailable) && SharedMemoryFifoMayWedge()) {
      std::cout << "[ INFO     ] fresh sender timed out: the killed sender wedged the "
                   "receiver's shared-memory FIFO (UCX mm limit)"
                << std::endl;
      RecordProperty("shared_memory_fifo_wedged", "1");
    } else {
      EXPECT_EQ(written, static_cast<int>(StatusCode::kOk)) << "fresh sender's WriteBlocks";
      EXPECT_EQ(Verify(*receiver, kFreshSenderSeed), 1)
          << "receiver's blocks after the fresh write";
    }
    EXPECT_EQ(Command(*receiver, kCmdPing), kCmdPing) << "receiver after the fresh write";
    char quit = kCmdQuit;
    WriteAll(fresh->fd(), &quit, 1);
    EXPECT_EQ(fresh->Reap(Millis(5000)), "exit 0") << "fresh sender";
    WriteAll(receiver->fd(), &quit, 1);
    EXPECT_EQ(receiver->Reap(Millis(5000)), "exit 0") << "receiver";
  }

  sighandler_t old_sigpipe_ = SIG_DFL;
};

TEST_P(KvTransferFaultTest, SenderKilledMidTransfer) {
  PeerInfoAndKey info;
  auto receiver = StartReceiver(&info);
  ASSERT_NE(receiver, nullptr);
  auto sender = StartFlood(info);
  ASSERT_NE(sender, nullptr);
  sender->Signal(SIGKILL);
  sender.reset();
  ExpectReceiverServesFreshSender(std::move(receiver), info, kSurviveWindow);
}

TEST_P(KvTransferFaultTest, SenderStalledMidTransfer) {
  PeerInfoAndKey info;
  auto receiver = StartReceiver(&info);
  ASSERT_NE(receiver, nullptr);
  auto sender = StartFlood(info);
  ASSERT_NE(sender, nullptr);
  sender->Signal(SIGSTOP);
  // The receiver keeps serving while its sender is frozen, and after the
  // frozen sender finally dies.
  const auto stall_end = Clock::now() + kStallWindow;
  while (Clock::now() < stall_end) {
    ASSERT_EQ(Command(*receiver, kCmdPing), kCmdPing)
        << "receiver died while its sender was stopped: " << receiver->Reap(Millis(3000));
    std::this_thread::sleep_for(Millis(250));
  }
  sender->Signal(SIGKILL);
  sender.reset();
  ExpectReceiverServesFreshSender(std::move(receiver), info, Millis(1000));
}

TEST_P(KvTransferFaultTest, ReceiverKilledMidTransfer) {
  PeerInfoAndKey info;
  auto receiver = StartReceiver(&info);
  ASSERT_NE(receiver, nullptr);
  auto sender = StartFlood(info);
  ASSERT_NE(sender, nullptr);
  const auto killed_at = Clock::now();
  receiver->Signal(SIGKILL);
  receiver.reset();
  FloodEnd end;
  // The write in flight at the kill may take its whole timeout; one more
  // started just before could too.
  ASSERT_TRUE(ReadWithin(sender->fd(), &end, sizeof end, 2 * kWriteTimeout + Millis(1000)))
      << "sender's writes did not fail after the receiver died; sender "
      << (sender->Alive() ? "alive" : sender->Describe());
  const auto failed_after = Clock::now() - killed_at;
  EXPECT_EQ(end.code, static_cast<int32_t>(StatusCode::kUnavailable));
  EXPECT_LE(end.call_ms, (kWriteTimeout + Millis(1000)).count());
  EXPECT_LE(failed_after, kWriteTimeout + Millis(1000));
  EXPECT_TRUE(sender->Alive()) << "sender " << sender->Describe();

  // The same sender serves a fresh receiver.
  PeerInfoAndKey fresh_info;
  auto fresh = StartReceiver(&fresh_info);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(Command(*sender, kCmdConnect, &fresh_info), static_cast<int>(StatusCode::kOk));
  EXPECT_EQ(Command(*sender, kCmdWrite), static_cast<int>(StatusCode::kOk));
  EXPECT_EQ(Verify(*fresh, kFloodSeed), 1) << "fresh receiver's blocks";
  char quit = kCmdQuit;
  WriteAll(sender->fd(), &quit, 1);
  EXPECT_EQ(sender->Reap(Millis(5000)), "exit 0") << "sender";
  WriteAll(fresh->fd(), &quit, 1);
  EXPECT_EQ(fresh->Reap(Millis(5000)), "exit 0") << "fresh receiver";
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferFaultTest, ::testing::Values("tcp", "sm,self"),
                         testing::TransportName);

}  // namespace
}  // namespace headway
