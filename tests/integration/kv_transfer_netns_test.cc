// KV block transfer between two processes that share nothing but a network
// link: a receiver and a sender KvTransferAgent, each in its own Linux
// network namespace, joined by a veth pair, with UCX over TCP restricted to
// the veth device. This is the closest a single host gets to two workers on
// two machines (no shared memory transports, no loopback shortcut).
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`; skips
// otherwise. Each case builds its namespaces with a NetnsPair
// (tests/support/netns.h), which removes them on every path out, also after
// a failed assertion.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/fd_io.h"
#include "comm/kv_transfer.h"
#include "tests/comm/kv_write_grant.h"
#include "tests/support/netns.h"

namespace headway {
namespace {

using testing::NetnsPair;
using testing::NetnsSide;

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

// Runs of consecutive ids (coalesced into one message each), a run whose
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
                                                   int max_outstanding_messages, bool coalesce) {
  KvTransferOptions options;
  options.transports = "tcp";
  options.max_outstanding_messages = max_outstanding_messages;
  options.coalesce_runs = coalesce;
  return KvTransferAgent::Create(pool.data(), kBlockBytes, kNumBlocks, options);
}

// Called first in a forked child: joins `side`'s namespace (with a private
// /sys, where UCX finds its TCP devices) and restricts UCX to that side's
// veth end. Empty on success, else what failed.
std::string EnterSide(const NetnsPair& link, NetnsSide side) {
  Status st = link.EnterFromChild(side);
  if (!st.ok()) return st.message();
  // This process alone: UCX reads UCX_* when the child creates its agent.
  setenv("UCX_NET_DEVICES", link.device(side).c_str(), 1);
  return "";
}

// The sender child's start: enters side B, takes the receiver's KvPeerInfo
// from `chan` and connects. Any failure is reported on `out` (and exits).
struct ConnectedSender {
  std::vector<uint8_t> pool;  // outlives the agent (members die in reverse)
  std::unique_ptr<KvTransferAgent> agent;
  int peer = -1;
  std::string write_key;  // the receiver's: this test plays the coordinator
};

ConnectedSender ConnectSender(const NetnsPair& link, int chan, int out,
                              int max_outstanding_messages, bool coalesce) {
  std::string err = EnterSide(link, NetnsSide::kB);
  if (!err.empty()) Report(out, "SKIP " + err, 2);
  KvPeerInfo info;
  ConnectedSender sender;
  if (!ReceivePeerInfo(chan, &info, &sender.write_key)) {
    Report(out, "FAIL no info from the receiver", 3);
  }
  sender.pool = MakePool(kSenderSeed, kBlockBytes, kNumBlocks);
  auto agent = MakeAgent(sender.pool, max_outstanding_messages, coalesce);
  if (!agent.ok()) Report(out, "FAIL sender Create: " + agent.status().ToString(), 4);
  sender.agent = std::move(*agent);
  auto peer = sender.agent->Connect(info);
  if (!peer.ok()) Report(out, "FAIL Connect: " + peer.status().ToString(), 5);
  sender.peer = *peer;
  return sender;
}

constexpr Millis kWriteTimeout(5000);

// ---- cases ----------------------------------------------------------------------

// The receiver (namespace a) publishes its KvPeerInfo over a socketpair; the
// sender (namespace b) writes scattered blocks over TCP on the veth and says
// so; the receiver checks every byte of its pool and reports to the parent.
TEST(KvTransferNetnsTest, WritesScatteredBlocksAcrossNamespaces) {
  const auto start = Clock::now();
  NetnsPair link("kv");
  HW_SETUP_NETNS_OR_SKIP(link);
  Fds fds;
  int peer_link[2], rx_result[2], tx_result[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, peer_link), 0);
  fds.fds = {peer_link[0], peer_link[1]};
  ASSERT_TRUE(MakePipe(rx_result, &fds) && MakePipe(tx_result, &fds));

  const pid_t receiver = link.ForkChild([&] {
    const int chan = peer_link[0], out = rx_result[1];
    // Keep only this side's ends, so EOFs mean what they say.
    close(peer_link[1]);
    close(rx_result[0]);
    close(tx_result[0]);
    close(tx_result[1]);
    std::string err = EnterSide(link, NetnsSide::kA);
    if (!err.empty()) Report(out, "SKIP " + err, 2);
    std::vector<uint8_t> pool = MakePool(kReceiverSeed, kBlockBytes, kNumBlocks);
    auto agent = MakeAgent(pool, 256, true);
    if (!agent.ok()) Report(out, "FAIL receiver Create: " + agent.status().ToString(), 3);
    if (!SendPeerInfo(chan, (*agent)->local_info(), (*agent)->write_key()))
      Report(out, "FAIL sending info", 4);
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
  const pid_t sender = link.ForkChild([&] {
    const int chan = peer_link[1], out = tx_result[1];
    close(peer_link[0]);
    close(rx_result[0]);
    close(rx_result[1]);
    close(tx_result[0]);
    ConnectedSender tx = ConnectSender(link, chan, out, 256, true);
    Status st = tx.agent->WriteBlocks(
        tx.peer, ScatteredCopies(), testing::Grant(tx.write_key, ScatteredCopies()), kWriteTimeout);
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
// small block messages: the sender's WriteBlocks must fail with Unavailable within its
// timeout, and neither the call nor the sender's shutdown may hang.
TEST(KvTransferNetnsTest, KilledReceiverFailsSenderWithinTimeout) {
  const auto start = Clock::now();
  NetnsPair link("kv");
  HW_SETUP_NETNS_OR_SKIP(link);
  Fds fds;
  int peer_link[2], rx_result[2], tx_result[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, peer_link), 0);
  fds.fds = {peer_link[0], peer_link[1]};
  ASSERT_TRUE(MakePipe(rx_result, &fds) && MakePipe(tx_result, &fds));
  constexpr Millis kTimeout(3000);

  const pid_t receiver = link.ForkChild([&] {
    const int chan = peer_link[0], out = rx_result[1];
    close(peer_link[1]);
    close(rx_result[0]);
    close(tx_result[0]);
    close(tx_result[1]);
    std::string err = EnterSide(link, NetnsSide::kA);
    if (!err.empty()) Report(out, "SKIP " + err, 2);
    std::vector<uint8_t> pool = MakePool(kReceiverSeed, kBlockBytes, kNumBlocks);
    auto agent = MakeAgent(pool, 256, true);
    if (!agent.ok()) Report(out, "FAIL receiver Create: " + agent.status().ToString(), 3);
    if (!SendPeerInfo(chan, (*agent)->local_info(), (*agent)->write_key()))
      Report(out, "FAIL sending info", 4);
    // Serve block messages (the progress thread) until the parent's SIGKILL; the
    // parent, not this process, reads what the sender sends on `chan`.
    WriteAll(out, "READY", 5);
    close(out);
    for (;;) pause();
  });
  ASSERT_GT(receiver, 0);
  const pid_t sender = link.ForkChild([&] {
    const int chan = peer_link[1], out = tx_result[1];
    close(peer_link[0]);
    close(rx_result[0]);
    close(rx_result[1]);
    close(tx_result[0]);
    ConnectedSender tx = ConnectSender(link, chan, out, 2, false);
    std::vector<BlockCopy> all;
    for (uint32_t b = 0; b < kNumBlocks; ++b) all.push_back({b, kNumBlocks - 1 - b});
    Status st = tx.agent->WriteBlocks(tx.peer, all, testing::Grant(tx.write_key, all), kTimeout);
    if (!st.ok()) Report(out, "FAIL first WriteBlocks: " + st.ToString(), 6);
    char started = 1;
    WriteAll(chan, &started, 1);  // the parent kills the receiver on this
    int writes = 0;
    Millis failed_after(0);
    const auto loop_end = Clock::now() + Millis(15000);
    while (st.ok() && Clock::now() < loop_end) {
      const auto t0 = Clock::now();
      st = tx.agent->WriteBlocks(tx.peer, all, testing::Grant(tx.write_key, all), kTimeout);
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
  link.KillChild(receiver);
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
