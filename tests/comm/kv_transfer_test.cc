// KV block transfer between two agents in this process (TCP and shared
// memory), its error cases, and a receiver in a forked process that checks
// the bytes itself.
#include "comm/fd_io.h"
#include "comm/kv_transfer.h"
#include "tests/comm/kv_write_grant.h"
#include "tests/comm/transport_name.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace headway {
namespace {

using Millis = std::chrono::milliseconds;

constexpr uint64_t kBlockBytes = 1024;
constexpr uint32_t kNumBlocks = 64;
constexpr Millis kTimeout(10000);

// Byte `offset` of block `block` in a pool filled with `seed`.
uint8_t PatternByte(uint32_t block, uint64_t offset, uint8_t seed) {
  return static_cast<uint8_t>(block * 131u + offset * 7u + seed);
}

std::vector<uint8_t> MakePool(uint8_t seed, uint64_t block_bytes = kBlockBytes,
                              uint32_t num_blocks = kNumBlocks) {
  std::vector<uint8_t> pool(block_bytes * num_blocks);
  for (uint32_t b = 0; b < num_blocks; ++b) {
    for (uint64_t i = 0; i < block_bytes; ++i) pool[b * block_bytes + i] = PatternByte(b, i, seed);
  }
  return pool;
}

// Runs of consecutive ids (0..2 -> 5..7, 30..31 -> 3..4), single blocks, and
// the last block.
std::vector<BlockCopy> ScatteredCopies() {
  return {{0, 5}, {1, 6}, {2, 7}, {10, 20}, {30, 3}, {31, 4}, {63, 63}, {17, 40}};
}

// Expects `dst` to hold `src`'s blocks per `copies` and its own pattern
// (seed `dst_seed`) everywhere else.
void ExpectCopied(const std::vector<uint8_t>& src, const std::vector<uint8_t>& dst,
                  const std::vector<BlockCopy>& copies, uint8_t dst_seed) {
  std::vector<uint8_t> want = MakePool(dst_seed);
  for (const BlockCopy& c : copies) {
    std::memcpy(&want[c.dst * kBlockBytes], &src[c.src * kBlockBytes], kBlockBytes);
  }
  for (uint32_t b = 0; b < kNumBlocks; ++b) {
    EXPECT_EQ(0, std::memcmp(&want[b * kBlockBytes], &dst[b * kBlockBytes], kBlockBytes))
        << "destination block " << b;
  }
}

std::unique_ptr<KvTransferAgent> MakeAgent(std::vector<uint8_t>& pool, const std::string& tls,
                                           uint64_t block_bytes = kBlockBytes,
                                           bool coalesce = true) {
  KvTransferOptions options;
  options.transports = tls;
  options.coalesce_runs = coalesce;
  auto agent = KvTransferAgent::Create(pool.data(), block_bytes,
                                       static_cast<uint32_t>(pool.size() / block_bytes), options);
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  return agent.ok() ? std::move(agent).value() : nullptr;
}

class KvTransferTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvTransferTest, WritesScatteredBlocksExactly) {
  for (bool coalesce : {true, false}) {
    std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
    auto sender = MakeAgent(src, GetParam(), kBlockBytes, coalesce);
    auto receiver = MakeAgent(dst, GetParam());
    ASSERT_TRUE(sender && receiver);
    auto peer = sender->Connect(receiver->local_info());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    Status st =
        sender->WriteBlocks(*peer, ScatteredCopies(),
                            testing::Grant(receiver->write_key(), ScatteredCopies()), kTimeout);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectCopied(src, dst, ScatteredCopies(), 2);
    // A second write over the same endpoint; and an empty list is a no-op.
    std::vector<BlockCopy> more = {{40, 50}, {41, 51}, {42, 52}, {43, 53}};
    ASSERT_TRUE(
        sender->WriteBlocks(*peer, more, testing::Grant(receiver->write_key(), more), kTimeout)
            .ok());
    ASSERT_TRUE(
        sender->WriteBlocks(*peer, {}, testing::Grant(receiver->write_key(), {}), kTimeout).ok());
    std::vector<BlockCopy> all = ScatteredCopies();
    all.insert(all.end(), more.begin(), more.end());
    ExpectCopied(src, dst, all, 2);
  }
}

TEST_P(KvTransferTest, ConnectReusesThePeer) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
  auto sender = MakeAgent(src, GetParam());
  auto receiver = MakeAgent(dst, GetParam());
  ASSERT_TRUE(sender && receiver);
  auto first = sender->Connect(receiver->local_info());
  auto second = sender->Connect(receiver->local_info());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
}

TEST_P(KvTransferTest, OutOfRangeIdWritesNothing) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
  auto sender = MakeAgent(src, GetParam());
  auto receiver = MakeAgent(dst, GetParam());
  ASSERT_TRUE(sender && receiver);
  auto peer = sender->Connect(receiver->local_info());
  ASSERT_TRUE(peer.ok());
  // The bad id comes last, after valid copies that must not go out either.
  std::vector<BlockCopy> bad_dst = {{0, 0}, {1, 1}, {2, kNumBlocks}};
  std::vector<BlockCopy> bad_src = {{3, 3}, {kNumBlocks, 4}};
  EXPECT_EQ(
      sender->WriteBlocks(*peer, bad_dst, testing::Grant(receiver->write_key(), bad_dst), kTimeout)
          .code(),
      StatusCode::kOutOfRange);
  EXPECT_EQ(
      sender->WriteBlocks(*peer, bad_src, testing::Grant(receiver->write_key(), bad_src), kTimeout)
          .code(),
      StatusCode::kOutOfRange);
  // A valid write on the same endpoint: once it is acknowledged, messages
  // the bad lists had sent before it would have landed too.
  ASSERT_TRUE(
      sender
          ->WriteBlocks(*peer, {{9, 9}}, testing::Grant(receiver->write_key(), {{9, 9}}), kTimeout)
          .ok());
  ExpectCopied(src, dst, {{9, 9}}, 2);
  EXPECT_EQ(sender
                ->WriteBlocks(*peer + 1, {{0, 0}}, testing::Grant(receiver->write_key(), {{0, 0}}),
                              kTimeout)
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_P(KvTransferTest, ConnectRejectsOtherBlockBytes) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2, 2 * kBlockBytes, kNumBlocks / 2);
  auto sender = MakeAgent(src, GetParam());
  auto receiver = MakeAgent(dst, GetParam(), 2 * kBlockBytes);
  ASSERT_TRUE(sender && receiver);
  EXPECT_EQ(sender->Connect(receiver->local_info()).status().code(),
            StatusCode::kInvalidArgument);
  KvPeerInfo empty = receiver->local_info();
  empty.block_bytes = kBlockBytes;
  empty.worker_address.clear();
  EXPECT_EQ(sender->Connect(empty).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferTest,
                         ::testing::Values("tcp", "sm,self", "posix,cma,self"),
                         testing::TransportName);

TEST(KvTransferAgentTest, CreateRejectsBadArguments) {
  std::vector<uint8_t> pool = MakePool(0);
  KvTransferOptions options;
  EXPECT_EQ(KvTransferAgent::Create(nullptr, kBlockBytes, kNumBlocks, options).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(KvTransferAgent::Create(pool.data(), 0, kNumBlocks, options).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(KvTransferAgent::Create(pool.data(), kBlockBytes, 0, options).status().code(),
            StatusCode::kInvalidArgument);
  options.max_outstanding_messages = 0;
  EXPECT_EQ(KvTransferAgent::Create(pool.data(), kBlockBytes, kNumBlocks, options).status().code(),
            StatusCode::kInvalidArgument);
  options.max_outstanding_messages = 4;
  options.transports = "no_such_transport";
  auto bad = KvTransferAgent::Create(pool.data(), kBlockBytes, kNumBlocks, options);
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(bad.status().message().find("no_such_transport"), std::string::npos)
      << bad.status().ToString();
}

// The IPv4 addresses of this host's interfaces other than loopback.
std::vector<in_addr> NonLoopbackIpv4() {
  std::vector<in_addr> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) != 0 || (i->ifa_flags & IFF_UP) == 0) continue;
    out.push_back(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr);
  }
  freeifaddrs(list);
  return out;
}

bool Holds(const std::string& bytes, const in_addr& ip) {
  return bytes.find(std::string(reinterpret_cast<const char*>(&ip), sizeof ip)) !=
         std::string::npos;
}

// UCX publishes the addresses of the network devices it uses: restricted to
// loopback, a receiver's worker address names none of the host's other
// interfaces, and a sender still reaches it.
TEST(KvTransferAgentTest, NetDevicesChooseTheAddressesAReceiverPublishes) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
  KvTransferOptions options;
  options.transports = "tcp";
  options.net_devices = "lo";
  auto receiver = KvTransferAgent::Create(dst.data(), kBlockBytes, kNumBlocks, options);
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  for (const in_addr& ip : NonLoopbackIpv4()) {
    EXPECT_FALSE(Holds((*receiver)->local_info().worker_address, ip)) << inet_ntoa(ip);
  }
  auto sender = MakeAgent(src, "tcp");
  ASSERT_TRUE(sender);
  auto peer = sender->Connect((*receiver)->local_info());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(sender
                  ->WriteBlocks(*peer, ScatteredCopies(),
                                testing::Grant((*receiver)->write_key(), ScatteredCopies()),
                                kTimeout)
                  .ok());
  ExpectCopied(src, dst, ScatteredCopies(), 2);

  // Without the restriction, the host's other interfaces are published too
  // (where it has any).
  std::vector<uint8_t> other = MakePool(3);
  auto everywhere = MakeAgent(other, "tcp");
  ASSERT_TRUE(everywhere);
  for (const in_addr& ip : NonLoopbackIpv4()) {
    EXPECT_TRUE(Holds(everywhere->local_info().worker_address, ip)) << inet_ntoa(ip);
  }

  options.net_devices = "no_such_device0";
  auto none = KvTransferAgent::Create(dst.data(), kBlockBytes, kNumBlocks, options);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no_such_device0"), std::string::npos)
      << none.status().ToString();
}

TEST(KvTransferAgentTest, SmallOutstandingCapStillWritesAll) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
  KvTransferOptions options;
  options.transports = "tcp";
  options.max_outstanding_messages = 1;
  options.coalesce_runs = false;
  auto sender = KvTransferAgent::Create(src.data(), kBlockBytes, kNumBlocks, options);
  auto receiver = MakeAgent(dst, "tcp");
  ASSERT_TRUE(sender.ok() && receiver);
  auto peer = (*sender)->Connect(receiver->local_info());
  ASSERT_TRUE(peer.ok());
  std::vector<BlockCopy> copies;
  for (uint32_t b = 0; b < kNumBlocks; ++b) copies.push_back({b, kNumBlocks - 1 - b});
  ASSERT_TRUE(
      (*sender)
          ->WriteBlocks(*peer, copies, testing::Grant(receiver->write_key(), copies), kTimeout)
          .ok());
  ExpectCopied(src, dst, copies, 2);
}

// tcp_seg_size reaches UCX's tcp transport: 512k segments carry whole
// coalesced messages, and a size too small for UCX's own headers (100 bytes)
// fails Create, which it would not if the key were dropped.
TEST(KvTransferAgentTest, TcpSegSizeReachesTheTcpTransport) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
  KvTransferOptions options;
  options.transports = "tcp";
  options.tcp_seg_size = "512k";
  auto sender = KvTransferAgent::Create(src.data(), kBlockBytes, kNumBlocks, options);
  auto receiver = KvTransferAgent::Create(dst.data(), kBlockBytes, kNumBlocks, options);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  auto peer = (*sender)->Connect((*receiver)->local_info());
  ASSERT_TRUE(peer.ok());
  std::vector<BlockCopy> copies;
  for (uint32_t b = 0; b < kNumBlocks; ++b) copies.push_back({b, b});
  ASSERT_TRUE(
      (*sender)
          ->WriteBlocks(*peer, copies, testing::Grant((*receiver)->write_key(), copies), kTimeout)
          .ok());
  ExpectCopied(src, dst, copies, 2);

  options.tcp_seg_size = "100";
  auto too_small = KvTransferAgent::Create(src.data(), kBlockBytes, kNumBlocks, options);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), StatusCode::kUnavailable);
}

TEST(KvTransferAgentTest, DestroyedPeerFailsWithinTimeout) {
  std::vector<uint8_t> src = MakePool(1), dst = MakePool(2);
  auto sender = MakeAgent(src, "tcp");
  auto receiver = MakeAgent(dst, "tcp");
  ASSERT_TRUE(sender && receiver);
  const std::string key = receiver->write_key();
  auto peer = sender->Connect(receiver->local_info());
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(sender->WriteBlocks(*peer, {{0, 0}}, testing::Grant(key, {{0, 0}}), kTimeout).ok());
  receiver.reset();
  const Millis timeout(3000);
  const auto start = std::chrono::steady_clock::now();
  Status st = Status::Ok();
  // The first write after the close may still be accepted by the kernel's
  // socket buffers; the peer's reset fails a later one.
  for (int i = 0; i < 20 && st.ok(); ++i) {
    std::vector<BlockCopy> copies;
    for (uint32_t b = 0; b < kNumBlocks; ++b) copies.push_back({b, b});
    st = sender->WriteBlocks(*peer, copies, testing::Grant(key, copies), timeout);
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_LT(elapsed, Millis(20 * 3000 + 1000));
  // The sender's destructor must not hang on the dead endpoint.
}

// --- a receiver in a forked process

// Child: publish, wait for "written", check the pool, answer 1 (good) or 0.
[[noreturn]] void RunChildReceiver(int to_parent, int from_parent, const std::string& tls) {
  std::vector<uint8_t> dst = MakePool(2);
  KvTransferOptions options;
  options.transports = tls;
  auto agent = KvTransferAgent::Create(dst.data(), kBlockBytes, kNumBlocks, options);
  if (!agent.ok() || !SendPeerInfo(to_parent, (*agent)->local_info(), (*agent)->write_key()))
    _exit(2);
  char go = 0;
  if (!ReadAll(from_parent, &go, 1)) _exit(3);
  std::vector<uint8_t> src = MakePool(1);
  std::vector<uint8_t> want = MakePool(2);
  for (const BlockCopy& c : ScatteredCopies()) {
    std::memcpy(&want[c.dst * kBlockBytes], &src[c.src * kBlockBytes], kBlockBytes);
  }
  char verdict = want == dst ? 1 : 0;
  WriteAll(to_parent, &verdict, 1);
  char bye = 0;
  ReadAll(from_parent, &bye, 1);  // stay up until the sender is done
  agent->reset();
  _exit(0);
}

void RunCrossProcess(const std::string& tls) {
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    RunChildReceiver(up[1], down[0], tls);
  }
  close(up[1]);
  close(down[0]);
  KvPeerInfo info;
  std::string key;
  ASSERT_TRUE(ReceivePeerInfo(up[0], &info, &key));
  std::vector<uint8_t> src = MakePool(1);
  auto sender = MakeAgent(src, tls);
  ASSERT_TRUE(sender);
  auto peer = sender->Connect(info);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  Status st = sender->WriteBlocks(*peer, ScatteredCopies(), testing::Grant(key, ScatteredCopies()),
                                  kTimeout);
  EXPECT_TRUE(st.ok()) << st.ToString();
  char go = 1, verdict = 0;
  ASSERT_TRUE(WriteAll(down[1], &go, 1));
  ASSERT_TRUE(ReadAll(up[0], &verdict, 1));
  EXPECT_EQ(verdict, 1) << "receiver saw wrong bytes";
  sender.reset();
  WriteAll(down[1], &go, 1);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  close(up[0]);
  close(down[1]);
}

TEST(KvTransferCrossProcessTest, TcpReceiverInChildGetsBlocks) { RunCrossProcess("tcp"); }

TEST(KvTransferCrossProcessTest, SharedMemoryReceiverInChildGetsBlocks) {
  RunCrossProcess("sm,self");
}

}  // namespace
}  // namespace headway

namespace headway {
namespace {

// A receiver process that dies (no clean shutdown) after a first good
// write: later writes fail or time out, and neither they nor the sender's
// destructor hang.
void RunDyingChildPeer(const std::string& tls) {
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    std::vector<uint8_t> dst = MakePool(2);
    KvTransferOptions options;
    options.transports = tls;
    auto agent = KvTransferAgent::Create(dst.data(), kBlockBytes, kNumBlocks, options);
    if (!agent.ok() || !SendPeerInfo(up[1], (*agent)->local_info(), (*agent)->write_key()))
      _exit(2);
    char die = 0;
    ReadAll(down[0], &die, 1);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  KvPeerInfo info;
  std::string key;
  ASSERT_TRUE(ReceivePeerInfo(up[0], &info, &key));
  std::vector<uint8_t> src = MakePool(1);
  auto sender = MakeAgent(src, tls);
  ASSERT_TRUE(sender);
  auto peer = sender->Connect(info);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(
      sender
          ->WriteBlocks(*peer, ScatteredCopies(), testing::Grant(key, ScatteredCopies()), kTimeout)
          .ok());
  char die = 1;
  ASSERT_TRUE(WriteAll(down[1], &die, 1));
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  close(up[0]);
  close(down[1]);
  const Millis timeout(2000);
  const auto start = std::chrono::steady_clock::now();
  Status st = Status::Ok();
  // Until the transport notices, a write may still be taken by socket buffers.
  for (int i = 0; i < 5 && st.ok(); ++i)
    st = sender->WriteBlocks(*peer, ScatteredCopies(), testing::Grant(key, ScatteredCopies()),
                             timeout);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5 * timeout + Millis(1000));
  sender.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5 * timeout + Millis(4000));
}

TEST(KvTransferCrossProcessTest, TcpDyingPeerFailsWithinTimeout) { RunDyingChildPeer("tcp"); }
TEST(KvTransferCrossProcessTest, SharedMemoryDyingPeerFailsWithinTimeout) {
  RunDyingChildPeer("sm,self");
}

}  // namespace
}  // namespace headway
