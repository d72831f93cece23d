// KvPoolMemory, and the transfer agent's staged path without a GPU: a pool
// whose bytes sit in a private array reachable only through the copy
// functions, while base() points at inaccessible pages (PROT_NONE), so an
// agent that dereferenced a staged pool directly would crash the test.
#include "comm/kv_pool_memory.h"
#include "comm/kv_transfer.h"
#include "tests/comm/kv_block_pattern.h"
#include "tests/comm/kv_write_grant.h"
#include "tests/comm/transport_name.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace headway {
namespace {

using Millis = std::chrono::milliseconds;

constexpr uint64_t kBlockBytes = testing::kPatternBlockBytes;
constexpr uint32_t kNumBlocks = testing::kPatternNumBlocks;
constexpr uint64_t kPoolBytes = testing::kPatternPoolBytes;
constexpr Millis kTimeout(20000);



// Pool memory that only the copy functions reach: the bytes live in a
// private array; base() is a PROT_NONE mapping of the pool's size, so any
// direct access through it faults. Counts the bytes copied each way.
class OpaqueKvPoolMemory final : public KvPoolMemory {
 public:
  explicit OpaqueKvPoolMemory(std::vector<uint8_t> contents) : contents_(std::move(contents)) {
    guard_bytes_ = (contents_.size() + size_t(getpagesize()) - 1) / size_t(getpagesize()) *
                   size_t(getpagesize());
    guard_ = mmap(nullptr, guard_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    HW_CHECK(guard_ != MAP_FAILED);
  }
  ~OpaqueKvPoolMemory() override { munmap(guard_, guard_bytes_); }

  void* base() const override { return guard_; }
  uint64_t bytes() const override { return contents_.size(); }
  int cuda_device() const override { return -1; }
  bool host_accessible() const override { return false; }

  Status CopyToHost(uint64_t offset, void* dst, uint64_t bytes) const override {
    if (fail_copies.load()) return Status::Unavailable("injected copy failure");
    HW_RETURN_IF_ERROR(CheckKvPoolRange(offset, bytes, contents_.size()));
    std::memcpy(dst, contents_.data() + offset, bytes);
    bytes_out.fetch_add(bytes);
    return Status::Ok();
  }
  Status CopyFromHost(uint64_t offset, const void* src, uint64_t bytes) override {
    if (fail_copies.load()) return Status::Unavailable("injected copy failure");
    HW_RETURN_IF_ERROR(CheckKvPoolRange(offset, bytes, contents_.size()));
    std::memcpy(contents_.data() + offset, src, bytes);
    bytes_in.fetch_add(bytes);
    return Status::Ok();
  }
  Result<std::shared_ptr<uint8_t>> AllocateStaging(uint64_t bytes) const override {
    staging_buffers.fetch_add(1);
    return std::shared_ptr<uint8_t>(new uint8_t[bytes], std::default_delete<uint8_t[]>());
  }
  Status BindCallingThread() const override { return Status::Ok(); }

  // Test access to the bytes (the agent has only the copies).
  const std::vector<uint8_t>& contents() const { return contents_; }

  mutable std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> bytes_in{0};
  mutable std::atomic<int> staging_buffers{0};
  std::atomic<bool> fail_copies{false};

 private:
  std::vector<uint8_t> contents_;
  void* guard_ = nullptr;
  size_t guard_bytes_ = 0;
};

// One agent with its pool: a host pool (a vector) or an opaque one.
struct Side {
  bool staged = false;
  std::vector<uint8_t> host;
  OpaqueKvPoolMemory* opaque = nullptr;  // owned by agent
  std::unique_ptr<KvTransferAgent> agent;

  const std::vector<uint8_t>& bytes() const { return staged ? opaque->contents() : host; }
};

std::unique_ptr<Side> MakeSide(bool staged, uint8_t seed, const std::string& tls,
                               bool coalesce = true, int max_outstanding = 256) {
  auto side = std::make_unique<Side>();
  side->staged = staged;
  KvTransferOptions options;
  options.transports = tls;
  options.coalesce_runs = coalesce;
  options.max_outstanding_messages = max_outstanding;
  Result<std::unique_ptr<KvTransferAgent>> agent = Status::Internal("unset");
  if (staged) {
    auto memory = std::make_unique<OpaqueKvPoolMemory>(testing::MakePattern(seed));
    side->opaque = memory.get();
    agent = KvTransferAgent::Create(std::move(memory), kBlockBytes, kNumBlocks, options);
  } else {
    side->host = testing::MakePattern(seed);
    agent = KvTransferAgent::Create(side->host.data(), kBlockBytes, kNumBlocks, options);
  }
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  if (!agent.ok()) return nullptr;
  side->agent = std::move(agent).value();
  EXPECT_STREQ(side->agent->memory_path(), staged ? "staged" : "host");
  return side;
}


// Every byte of `dst` is `src`'s per `copies`, else `dst`'s own pattern.
void ExpectCopied(const Side& src, const Side& dst, const std::vector<BlockCopy>& copies,
                  uint8_t dst_seed) {
  testing::ExpectCopied(src.bytes(), dst.bytes(), copies, dst_seed);
}

TEST(KvPoolMemoryTest, HostCopiesAndChecksRanges) {
  std::vector<uint8_t> pool = testing::MakePattern(3);
  auto memory = NewHostKvPoolMemory(pool.data(), pool.size());
  EXPECT_EQ(memory->base(), pool.data());
  EXPECT_EQ(memory->bytes(), kPoolBytes);
  EXPECT_EQ(memory->cuda_device(), -1);
  EXPECT_TRUE(memory->host_accessible());
  EXPECT_TRUE(memory->BindCallingThread().ok());

  std::vector<uint8_t> out(100);
  ASSERT_TRUE(memory->CopyToHost(kPoolBytes - 100, out.data(), 100).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), &pool[kPoolBytes - 100], 100));
  std::vector<uint8_t> in(50, 0xab);
  ASSERT_TRUE(memory->CopyFromHost(7, in.data(), 50).ok());
  EXPECT_EQ(0, std::memcmp(&pool[7], in.data(), 50));
  EXPECT_EQ(pool[57], testing::MakePattern(3)[57]);

  EXPECT_EQ(memory->CopyToHost(kPoolBytes - 99, out.data(), 100).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(memory->CopyFromHost(kPoolBytes + 1, in.data(), 0).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(memory->CopyFromHost(8, in.data(), UINT64_MAX).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(memory->CopyToHost(kPoolBytes, out.data(), 0).ok());

  auto staging = memory->AllocateStaging(4096);
  ASSERT_TRUE(staging.ok());
  std::memset(staging->get(), 1, 4096);
}

TEST(KvPoolMemoryTest, CudaMemoryRefusesHostPointers) {
  // Without a GPU (or without CUDA in the build) this cannot succeed; with
  // one, a host pointer is not device memory.
  std::vector<uint8_t> pool(4096);
  EXPECT_FALSE(NewCudaKvPoolMemory(pool.data(), pool.size(), 0).ok());
  EXPECT_FALSE(NewCudaKvPoolMemory(nullptr, pool.size(), 0).ok());
  EXPECT_FALSE(NewCudaKvPoolMemory(pool.data(), pool.size(), -1).ok());
}

TEST(KvPoolMemoryTest, AgentRefusesTooSmallMemory) {
  std::vector<uint8_t> pool(kPoolBytes - 1);
  auto agent = KvTransferAgent::Create(NewHostKvPoolMemory(pool.data(), pool.size()),
                                       kBlockBytes, kNumBlocks, KvTransferOptions{});
  EXPECT_EQ(agent.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvTransferAgent::Create(nullptr, kBlockBytes, kNumBlocks, KvTransferOptions{})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

class KvTransferStagedTest : public ::testing::TestWithParam<std::string> {};

// staged -> host, host -> staged, staged -> staged; coalesced and one
// message per block; many or two messages in flight (two staging buffers).
TEST_P(KvTransferStagedTest, WritesEveryByteThroughStaging) {
  struct Case {
    bool src_staged, dst_staged, coalesce;
    int max_outstanding;
  };
  for (const Case& c : {Case{true, false, true, 256}, Case{false, true, true, 256},
                        Case{true, true, true, 256}, Case{true, true, false, 256},
                        Case{true, false, false, 2}, Case{true, true, true, 1}}) {
    SCOPED_TRACE(std::string("src ") + (c.src_staged ? "staged" : "host") + ", dst " +
                 (c.dst_staged ? "staged" : "host") + (c.coalesce ? ", coalesced" : ", per block") +
                 ", max_outstanding " + std::to_string(c.max_outstanding));
    auto src = MakeSide(c.src_staged, 1, GetParam(), c.coalesce, c.max_outstanding);
    auto dst = MakeSide(c.dst_staged, 2, GetParam());
    ASSERT_TRUE(src && dst);
    auto peer = src->agent->Connect(dst->agent->local_info());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    const std::vector<BlockCopy> copies = testing::PatternCopies();
    Status st = src->agent->WriteBlocks(*peer, copies,
                                        testing::Grant(dst->agent->write_key(), copies), kTimeout);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectCopied(*src, *dst, copies, 2);
    const uint64_t bytes = copies.size() * kBlockBytes;
    if (c.src_staged) {
      EXPECT_EQ(src->opaque->bytes_out.load(), bytes);
      EXPECT_EQ(src->opaque->staging_buffers.load(), std::min(8, c.max_outstanding));
    }
    if (c.dst_staged) {
      EXPECT_EQ(dst->opaque->bytes_in.load(), bytes);
    }

    // A second write over the same endpoint lands too.
    const std::vector<BlockCopy> more = {{10, 11}, {11, 12}, {46, 45}};
    ASSERT_TRUE(
        src->agent
            ->WriteBlocks(*peer, more, testing::Grant(dst->agent->write_key(), more), kTimeout)
            .ok());
    std::vector<BlockCopy> all = copies;
    all.insert(all.end(), more.begin(), more.end());
    ExpectCopied(*src, *dst, all, 2);
  }
}

TEST_P(KvTransferStagedTest, CopyFailuresFailTheWrite) {
  auto src = MakeSide(true, 1, GetParam());
  auto dst = MakeSide(true, 2, GetParam());
  ASSERT_TRUE(src && dst);
  auto peer = src->agent->Connect(dst->agent->local_info());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  // The receiver cannot store: its acks say so and the sender aborts.
  dst->opaque->fail_copies.store(true);
  Status st = src->agent->WriteBlocks(
      *peer, testing::PatternCopies(),
      testing::Grant(dst->agent->write_key(), testing::PatternCopies()), kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  dst->opaque->fail_copies.store(false);

  // The sender cannot copy out: nothing more is sent.
  src->opaque->fail_copies.store(true);
  st = src->agent->WriteBlocks(*peer, {{5, 5}}, testing::Grant(dst->agent->write_key(), {{5, 5}}),
                               kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("injected copy failure"), std::string::npos) << st.ToString();
  src->opaque->fail_copies.store(false);

  // Both recover: the endpoint and the staging buffers are still usable.
  ASSERT_TRUE(src->agent
                  ->WriteBlocks(*peer, testing::PatternCopies(),
                                testing::Grant(dst->agent->write_key(), testing::PatternCopies()),
                                kTimeout)
                  .ok());
  ExpectCopied(*src, *dst, testing::PatternCopies(), 2);
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferStagedTest, ::testing::Values("tcp", "sm,self"),
                         testing::TransportName);

}  // namespace
}  // namespace headway
