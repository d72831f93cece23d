// KV block transfer between two processes that share nothing but a network
// link: a receiver and a sender KvTransferAgent, each in its own Linux
// network namespace, joined by a veth pair, with UCX over TCP restricted to
// the veth device. This is the closest a single host gets to two workers on
// two machines (no shared memory transports, no loopback shortcut).
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`; skips
// otherwise. Each case builds its namespaces with `ip netns add` and removes
// them on every path out (NetnsLink's destructor), also after a failed
// assertion.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/fd_io.h"
#include "comm/kv_transfer.h"

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// ---- pools and copies ---------------------------------------------------------

uint8_t PatternByte(uint32_t block, uint64_t offset, uint8_t seed) {
  return static_cast<uint8_t>(block * 131u + offset * 7u + seed * 29u);
}

std::vector<uint8_t> MakePool(uint8_t seed, uint64_t block_bytes, uint32_t num_blocks) {
  std::vector<uint8_t> pool(block_bytes * num_blocks);
  for (uint32_t b = 0; b < num_blocks; ++b) {
    for (uint64_t i = 0; i < block_bytes; ++i) pool[b * block_bytes + i] = PatternByte(b, i, seed);
  }
  return pool;
}

constexpr uint64_t kBlockBytes = 4096;
constexpr uint32_t kNumBlocks = 256;
constexpr uint8_t kSenderSeed = 1;
constexpr uint8_t kReceiverSeed = 2;

// Runs of consecutive ids (coalesced into one put each), a run whose
// destination steps down (not coalesced), single blocks, the first and the
// last block.
std::vector<BlockCopy> ScatteredCopies() {
  std::vector<BlockCopy> copies;
  for (uint32_t i = 0; i < 8; ++i) copies.push_back({i, 100 + i});
  for (uint32_t i = 0; i < 3; ++i) copies.push_back({20 + i, 3 + i});
  for (uint32_t i = 0; i < 4; ++i) copies.push_back({40 + i, 90 - i});
  copies.push_back({255, 0});
  copies.push_back({17, 255});
  copies.push_back({200, 201});
  copies.push_back({128, 60});
  return copies;
}

// Empty when `dst` holds the sender's blocks per `copies` and its own
// pattern everywhere else; otherwise the first bad block.
std::string CheckReceived(const std::vector<uint8_t>& dst, const std::vector<BlockCopy>& copies) {
  std::vector<uint8_t> src = MakePool(kSenderSeed, kBlockBytes, kNumBlocks);
  std::vector<uint8_t> want = MakePool(kReceiverSeed, kBlockBytes, kNumBlocks);
  for (const BlockCopy& c : copies) {
    std::memcpy(&want[c.dst * kBlockBytes], &src[c.src * kBlockBytes], kBlockBytes);
  }
  for (uint32_t b = 0; b < kNumBlocks; ++b) {
    if (std::memcmp(&want[b * kBlockBytes], &dst[b * kBlockBytes], kBlockBytes) != 0) {
      bool written = false;
      for (const BlockCopy& c : copies) written |= c.dst == b;
      return "destination block " + std::to_string(b) +
             (written ? " (written) holds wrong bytes" : " (untouched) was changed");
    }
  }
  return "";
}

// ---- byte streams ---------------------------------------------------------------

// Reads `fd` until EOF or `deadline`. Returns false on timeout.
bool ReadUntilEof(int fd, Clock::time_point deadline, std::string* out) {
  char buf[512];
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return true;
    out->append(buf, static_cast<size_t>(r));
  }
}

// Writes `line` to the parent's result pipe and exits with `code`.
[[noreturn]] void Report(int result_fd, const std::string& line, int code) {
  WriteAll(result_fd, line.data(), line.size());
  _exit(code);
}

// ---- namespaces -----------------------------------------------------------------

// Runs a shell command quietly; true when it exits 0.
bool Run(const std::string& command) {
  const std::string quiet = "(" + command + ") >/dev/null 2>&1";
  const int rc = std::system(quiet.c_str());
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

// Two network namespaces joined by a veth pair with addresses 10.201.X.1
// (end `a`) and 10.201.X.2 (end `b`), plus the child processes that run in
// them. The destructor kills the children and deletes both namespaces (which
// deletes the veth pair with them), whatever state setup reached.
class NetnsLink {
 public:
  NetnsLink() {
    static int counter = 0;
    const std::string id = std::to_string(getpid()) + "n" + std::to_string(counter++);
    ns_a_ = "headway-kv-" + id + "-a";
    ns_b_ = "headway-kv-" + id + "-b";
    // Interface names are at most 15 bytes: "hk" + 7-digit pid + "n" + n + "a".
    veth_a_ = "hk" + id + "a";
    veth_b_ = "hk" + id + "b";
    std::random_device rd;
    subnet_ = 1 + static_cast<int>(rd() % 254);
  }
  ~NetnsLink() {
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    // Deleting a namespace destroys the veth end inside it, and with it the
    // peer; the host-side delete covers a failure before the move.
    if (veth_created_) Run("ip link del " + veth_a_);
    if (ns_a_created_) Run("ip netns del " + ns_a_);
    if (ns_b_created_) Run("ip netns del " + ns_b_);
  }
  NetnsLink(const NetnsLink&) = delete;
  NetnsLink& operator=(const NetnsLink&) = delete;

  // Empty on success, else why the environment cannot host the test (the
  // caller skips). `fatal` is set when setup failed after the namespaces
  // were allowed (the caller fails).
  std::string Setup(bool* fatal) {
    *fatal = false;
    if (geteuid() != 0) return "needs root to create network namespaces";
    if (!Run("command -v ip")) return "iproute2's `ip` is not installed";
    if (!Run("ip netns add " + ns_a_)) {
      return "`ip netns add` failed (no CAP_SYS_ADMIN, e.g. in an unprivileged container)";
    }
    ns_a_created_ = true;
    if (!Run("ip netns add " + ns_b_)) return "second `ip netns add` failed";
    ns_b_created_ = true;
    if (!Run("ip link add " + veth_a_ + " type veth peer name " + veth_b_)) {
      return "`ip link add ... type veth` failed (no veth support or CAP_NET_ADMIN)";
    }
    veth_created_ = true;
    *fatal = true;
    if (!Run("ip link set " + veth_a_ + " netns " + ns_a_)) return "moving " + veth_a_;
    veth_created_ = false;  // now owned by ns_a_
    if (!Run("ip link set " + veth_b_ + " netns " + ns_b_)) return "moving " + veth_b_;
    using Side = std::tuple<std::string, std::string, int>;
    for (const auto& [ns, dev, host] : {Side{ns_a_, veth_a_, 1}, Side{ns_b_, veth_b_, 2}}) {
      const std::string ip = "ip -n " + ns + " ";
      if (!Run(ip + "addr add " + Address(host) + "/24 dev " + dev) ||
          !Run(ip + "link set " + dev + " up") || !Run(ip + "link set lo up")) {
        return "configuring " + dev + " in " + ns;
      }
    }
    // UCX only lists running interfaces (IFF_RUNNING), and the kernel
    // updates a veth's operational state asynchronously (linkwatch, slower
    // under load): wait for "state UP" on both ends.
    const auto deadline = Clock::now() + Millis(5000);
    for (const auto& [ns, dev] : {std::pair{ns_a_, veth_a_}, std::pair{ns_b_, veth_b_}}) {
      while (!Run("ip -n " + ns + " link show dev " + dev + " | grep -q 'state UP'")) {
        if (Clock::now() > deadline) return dev + " in " + ns + " never came up";
        std::this_thread::sleep_for(Millis(10));
      }
    }
    *fatal = false;
    return "";
  }

  // Forks a child that enters namespace a or b and runs `body`, which
  // must end the process (_exit). The child dies with the test process.
  pid_t Spawn(bool side_a, const std::function<void()>& body) {
    const std::string ns = side_a ? ns_a_ : ns_b_;
    pid_t pid = fork();
    if (pid != 0) {
      if (pid > 0) children_.push_back(pid);
      return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    body();
    _exit(120);
  }

  // Called in a child: joins `side_a`'s namespace and gives the child a
  // private /sys of that namespace (UCX lists TCP devices from
  // /sys/class/net, which otherwise still shows the host's interfaces, as
  // `ip netns exec` does). Sets UCX_NET_DEVICES to the veth end. Empty on
  // success, else what failed.
  std::string EnterNamespace(bool side_a) const {
    const std::string path = "/var/run/netns/" + (side_a ? ns_a_ : ns_b_);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "open " + path + ": " + std::strerror(errno);
    if (setns(fd, CLONE_NEWNET) != 0) return std::string("setns: ") + std::strerror(errno);
    close(fd);
    if (unshare(CLONE_NEWNS) != 0) return std::string("unshare(NEWNS): ") + std::strerror(errno);
    if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
      return std::string("making / a slave mount: ") + std::strerror(errno);
    }
    umount2("/sys", MNT_DETACH);  // may not be a mount point of its own
    if (mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
      return std::string("mounting sysfs: ") + std::strerror(errno);
    }
    setenv("UCX_NET_DEVICES", (side_a ? veth_a_ : veth_b_).c_str(), 1);
    return "";
  }

  // Waits up to `timeout` for `pid` to exit; returns its wait status or -1.
  int WaitChild(pid_t pid, Millis timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        std::erase(children_, pid);
        return status;
      }
      if (Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(Millis(5));
    }
  }

  void Kill(pid_t pid) { kill(pid, SIGKILL); }

  std::string Address(int host) const {
    return "10.201." + std::to_string(subnet_) + "." + std::to_string(host);
  }
  const std::string& ns_a() const { return ns_a_; }
  const std::string& ns_b() const { return ns_b_; }

 private:
  std::string ns_a_, ns_b_, veth_a_, veth_b_;
  int subnet_ = 1;
  bool ns_a_created_ = false, ns_b_created_ = false, veth_created_ = false;
  std::vector<pid_t> children_;
};

// Closes its fds on scope exit.
struct Fds {
  std::vector<int> fds;
  ~Fds() {
    for (int fd : fds) close(fd);
  }
};

// Creates a pipe whose ends are registered in `owned`.
bool MakePipe(int ends[2], Fds* owned) {
  if (pipe(ends) != 0) return false;
  owned->fds.push_back(ends[0]);
  owned->fds.push_back(ends[1]);
  return true;
}

Result<std::unique_ptr<KvTransferAgent>> MakeAgent(std::vector<uint8_t>& pool,
                                                   int max_outstanding_puts, bool coalesce) {
  KvTransferOptions options;
  options.transports = "tcp";
  options.max_outstanding_puts = max_outstanding_puts;
  options.coalesce_runs = coalesce;
  return KvTransferAgent::Create(pool.data(), kBlockBytes, kNumBlocks, options);
}

// The sender child's start: enters side B, takes the receiver's KvPeerInfo
// from `chan` and connects. Any failure is reported on `out` (and exits).
struct ConnectedSender {
  std::vector<uint8_t> pool;  // outlives the agent (members die in reverse)
  std::unique_ptr<KvTransferAgent> agent;
  int peer = -1;
};

ConnectedSender ConnectSender(const NetnsLink& link, int chan, int out, int max_outstanding_puts,
                              bool coalesce) {
  std::string err = link.EnterNamespace(false);
  if (!err.empty()) Report(out, "SKIP " + err, 2);
  KvPeerInfo info;
  if (!ReceivePeerInfo(chan, &info)) Report(out, "FAIL no info from the receiver", 3);
  ConnectedSender sender;
  sender.pool = MakePool(kSenderSeed, kBlockBytes, kNumBlocks);
  auto agent = MakeAgent(sender.pool, max_outstanding_puts, coalesce);
  if (!agent.ok()) Report(out, "FAIL sender Create: " + agent.status().ToString(), 4);
  sender.agent = std::move(*agent);
  auto peer = sender.agent->Connect(info);
  if (!peer.ok()) Report(out, "FAIL Connect: " + peer.status().ToString(), 5);
  sender.peer = *peer;
  return sender;
}

// The skip or failure a Setup result calls for.
#define HW_SETUP_NETNS(link)                                         \
  do {                                                               \
    bool fatal = false;                                              \
    const std::string why = (link).Setup(&fatal);                    \
    if (fatal) FAIL() << "network namespace setup: " << why;         \
    if (!why.empty()) GTEST_SKIP() << "network namespaces: " << why; \
  } while (0)

constexpr Millis kWriteTimeout(5000);

// ---- cases ----------------------------------------------------------------------

// The receiver (namespace a) publishes its KvPeerInfo over a socketpair; the
// sender (namespace b) writes scattered blocks over TCP on the veth and says
// so; the receiver checks every byte of its pool and reports to the parent.
TEST(KvTransferNetnsTest, WritesScatteredBlocksAcrossNamespaces) {
  const auto start = Clock::now();
  NetnsLink link;
  HW_SETUP_NETNS(link);
  Fds fds;
  int peer_link[2], rx_result[2], tx_result[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, peer_link), 0);
  fds.fds = {peer_link[0], peer_link[1]};
  ASSERT_TRUE(MakePipe(rx_result, &fds) && MakePipe(tx_result, &fds));

  const pid_t receiver = link.Spawn(true, [&] {
    const int chan = peer_link[0], out = rx_result[1];
    // Keep only this side's ends, so EOFs mean what they say.
    close(peer_link[1]);
    close(rx_result[0]);
    close(tx_result[0]);
    close(tx_result[1]);
    std::string err = link.EnterNamespace(true);
    if (!err.empty()) Report(out, "SKIP " + err, 2);
    std::vector<uint8_t> pool = MakePool(kReceiverSeed, kBlockBytes, kNumBlocks);
    auto agent = MakeAgent(pool, 256, true);
    if (!agent.ok()) Report(out, "FAIL receiver Create: " + agent.status().ToString(), 3);
    if (!SendPeerInfo(chan, (*agent)->local_info())) Report(out, "FAIL sending info", 4);
    char written = 0;
    if (!ReadAll(chan, &written, 1)) Report(out, "FAIL sender went away before writing", 5);
    std::string bad = CheckReceived(pool, ScatteredCopies());
    char ack = 1;
    WriteAll(chan, &ack, 1);
    // Stay up (and keep the endpoint) until the sender has shut down.
    while (ReadAll(chan, &ack, 1)) {
    }
    agent->reset();
    Report(out, bad.empty() ? "OK" : "FAIL " + bad, 0);
  });
  ASSERT_GT(receiver, 0);
  const pid_t sender = link.Spawn(false, [&] {
    const int chan = peer_link[1], out = tx_result[1];
    close(peer_link[0]);
    close(rx_result[0]);
    close(rx_result[1]);
    close(tx_result[0]);
    ConnectedSender tx = ConnectSender(link, chan, out, 256, true);
    Status st = tx.agent->WriteBlocks(tx.peer, ScatteredCopies(), kWriteTimeout);
    if (!st.ok()) Report(out, "FAIL WriteBlocks: " + st.ToString(), 6);
    char byte = 1;
    if (!WriteAll(chan, &byte, 1) || !ReadAll(chan, &byte, 1)) {
      Report(out, "FAIL receiver went away before checking", 7);
    }
    tx.agent.reset();
    Report(out, "OK", 0);
  });
  ASSERT_GT(sender, 0);
  // The parent keeps no end of the children's channel or result pipes'
  // write ends, so each result pipe reaches EOF when its child exits.
  close(peer_link[0]);
  close(peer_link[1]);
  close(rx_result[1]);
  close(tx_result[1]);
  fds.fds = {rx_result[0], tx_result[0]};

  const auto deadline = Clock::now() + Millis(20000);
  std::string tx_line, rx_line;
  ASSERT_TRUE(ReadUntilEof(tx_result[0], deadline, &tx_line)) << "sender hung";
  ASSERT_TRUE(ReadUntilEof(rx_result[0], deadline, &rx_line)) << "receiver hung";
  if (tx_line.rfind("SKIP", 0) == 0 || rx_line.rfind("SKIP", 0) == 0) {
    GTEST_SKIP() << "cannot enter the namespace: " << tx_line << " / " << rx_line;
  }
  EXPECT_EQ(tx_line, "OK") << "sender";
  EXPECT_EQ(rx_line, "OK") << "receiver";
  const int tx_status = link.WaitChild(sender, Millis(5000));
  const int rx_status = link.WaitChild(receiver, Millis(5000));
  EXPECT_TRUE(tx_status != -1 && WIFEXITED(tx_status) && WEXITSTATUS(tx_status) == 0)
      << "sender wait status " << tx_status;
  EXPECT_TRUE(rx_status != -1 && WIFEXITED(rx_status) && WEXITSTATUS(rx_status) == 0)
      << "receiver wait status " << rx_status;
  EXPECT_LT(Clock::now() - start, Millis(10000));
}

// The receiver is SIGKILLed while the sender streams the whole pool in many
// small puts: the sender's WriteBlocks must fail with Unavailable within its
// timeout, and neither the call nor the sender's shutdown may hang.
TEST(KvTransferNetnsTest, KilledReceiverFailsSenderWithinTimeout) {
  const auto start = Clock::now();
  NetnsLink link;
  HW_SETUP_NETNS(link);
  Fds fds;
  int peer_link[2], rx_result[2], tx_result[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, peer_link), 0);
  fds.fds = {peer_link[0], peer_link[1]};
  ASSERT_TRUE(MakePipe(rx_result, &fds) && MakePipe(tx_result, &fds));
  constexpr Millis kTimeout(3000);

  const pid_t receiver = link.Spawn(true, [&] {
    const int chan = peer_link[0], out = rx_result[1];
    close(peer_link[1]);
    close(rx_result[0]);
    close(tx_result[0]);
    close(tx_result[1]);
    std::string err = link.EnterNamespace(true);
    if (!err.empty()) Report(out, "SKIP " + err, 2);
    std::vector<uint8_t> pool = MakePool(kReceiverSeed, kBlockBytes, kNumBlocks);
    auto agent = MakeAgent(pool, 256, true);
    if (!agent.ok()) Report(out, "FAIL receiver Create: " + agent.status().ToString(), 3);
    if (!SendPeerInfo(chan, (*agent)->local_info())) Report(out, "FAIL sending info", 4);
    // Serve puts (the progress thread) until the parent's SIGKILL; the
    // parent, not this process, reads what the sender sends on `chan`.
    WriteAll(out, "READY", 5);
    close(out);
    for (;;) pause();
  });
  ASSERT_GT(receiver, 0);
  const pid_t sender = link.Spawn(false, [&] {
    const int chan = peer_link[1], out = tx_result[1];
    close(peer_link[0]);
    close(rx_result[0]);
    close(rx_result[1]);
    close(tx_result[0]);
    ConnectedSender tx = ConnectSender(link, chan, out, 2, false);
    std::vector<BlockCopy> all;
    for (uint32_t b = 0; b < kNumBlocks; ++b) all.push_back({b, kNumBlocks - 1 - b});
    Status st = tx.agent->WriteBlocks(tx.peer, all, kTimeout);
    if (!st.ok()) Report(out, "FAIL first WriteBlocks: " + st.ToString(), 6);
    char started = 1;
    WriteAll(chan, &started, 1);  // the parent kills the receiver on this
    int writes = 0;
    Millis failed_after(0);
    const auto loop_end = Clock::now() + Millis(15000);
    while (st.ok() && Clock::now() < loop_end) {
      const auto t0 = Clock::now();
      st = tx.agent->WriteBlocks(tx.peer, all, kTimeout);
      failed_after = std::chrono::duration_cast<Millis>(Clock::now() - t0);
      ++writes;
    }
    const auto shutdown_start = Clock::now();
    tx.agent.reset();
    const auto shutdown =
        std::chrono::duration_cast<Millis>(Clock::now() - shutdown_start).count();
    Report(out,
           std::to_string(static_cast<int>(st.code())) + " " +
               std::to_string(failed_after.count()) + " " + std::to_string(writes) + " " +
               std::to_string(shutdown) + " " + st.ToString(),
           0);
  });
  ASSERT_GT(sender, 0);
  close(peer_link[1]);
  close(rx_result[1]);
  close(tx_result[1]);
  fds.fds = {peer_link[0], rx_result[0], tx_result[0]};

  const auto deadline = Clock::now() + Millis(25000);
  std::string rx_line;
  ASSERT_TRUE(ReadUntilEof(rx_result[0], deadline, &rx_line)) << "receiver hung";
  if (rx_line.rfind("SKIP", 0) == 0) GTEST_SKIP() << "cannot enter the namespace: " << rx_line;
  ASSERT_EQ(rx_line, "READY");
  // Wait for the sender's first complete write, then kill the receiver
  // while later writes are in flight.
  pollfd p{peer_link[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "sender never finished its first write";
  char started = 0;
  ASSERT_TRUE(ReadAll(peer_link[0], &started, 1));
  std::this_thread::sleep_for(Millis(30));
  link.Kill(receiver);
  const auto killed_at = Clock::now();

  std::string tx_line;
  ASSERT_TRUE(ReadUntilEof(tx_result[0], deadline, &tx_line)) << "sender hung";
  const auto reported_after = Clock::now() - killed_at;
  if (tx_line.rfind("SKIP", 0) == 0) GTEST_SKIP() << "cannot enter the namespace: " << tx_line;
  int code = -1;
  long failed_after_ms = -1, shutdown_ms = -1;
  int writes = -1;
  ASSERT_EQ(std::sscanf(tx_line.c_str(), "%d %ld %d %ld", &code, &failed_after_ms, &writes,
                        &shutdown_ms),
            4)
      << tx_line;
  EXPECT_EQ(code, static_cast<int>(StatusCode::kUnavailable)) << tx_line;
  EXPECT_LE(failed_after_ms, kTimeout.count() + 500) << tx_line;
  EXPECT_LT(shutdown_ms, 3000) << tx_line;
  // The failing call is at most the second after the kill: one in flight,
  // possibly one more taken by socket buffers before the reset arrives.
  EXPECT_LT(reported_after, 2 * kTimeout + Millis(3500)) << tx_line;
  const int tx_status = link.WaitChild(sender, Millis(5000));
  EXPECT_TRUE(tx_status != -1 && WIFEXITED(tx_status) && WEXITSTATUS(tx_status) == 0)
      << "sender wait status " << tx_status;
  std::printf("[ info     ] after the kill: %s; %ld ms to the sender's report\n", tx_line.c_str(),
              static_cast<long>(
                  std::chrono::duration_cast<Millis>(reported_after).count()));
  EXPECT_LT(Clock::now() - start, Millis(15000));
}

}  // namespace
}  // namespace headway
