// KV transfer from and into pools in CUDA device memory, in one process
// over loopback UCX (tcp, and shared memory): device -> host, host ->
// device and device -> device, every byte compared. With Debian's UCX (no
// CUDA transports) the device pools go the staged path; a CUDA-aware UCX
// takes the direct one. Either is accepted and printed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/kv_pool_memory.h"
#include "comm/kv_transfer.h"
#include "tests/comm/kv_block_pattern.h"
#include "tests/gpu/gpu_test.h"
#include "tests/comm/kv_write_grant.h"
#include "tests/comm/transport_name.h"

namespace headway {
namespace {

using Millis = std::chrono::milliseconds;

constexpr uint64_t kBlockBytes = testing::kPatternBlockBytes;
constexpr uint32_t kNumBlocks = testing::kPatternNumBlocks;
constexpr uint64_t kPoolBytes = testing::kPatternPoolBytes;
constexpr Millis kTimeout(20000);



// One agent and its pool, on the device (device.data() != nullptr) or the host.
struct Side {
  std::vector<uint8_t> host;
  cuda::DeviceBuffer device;
  std::unique_ptr<KvTransferAgent> agent;

  std::vector<uint8_t> Bytes() const {
    return device.data() != nullptr ? testing::ToHost<uint8_t>(device.data(), kPoolBytes) : host;
  }
};

std::unique_ptr<Side> MakeSide(bool on_device, uint8_t seed, const std::string& tls,
                               bool coalesce) {
  auto side = std::make_unique<Side>();
  KvTransferOptions options;
  options.transports = tls;
  options.coalesce_runs = coalesce;
  Result<std::unique_ptr<KvTransferAgent>> agent = Status::Internal("unset");
  if (on_device) {
    side->device = testing::ToDevice(testing::MakePattern(seed));
    if (side->device.data() == nullptr) return nullptr;
    auto memory = NewCudaKvPoolMemory(side->device.data(), kPoolBytes, 0);
    EXPECT_TRUE(memory.ok()) << memory.status().ToString();
    if (!memory.ok()) return nullptr;
    agent = KvTransferAgent::Create(std::move(memory).value(), kBlockBytes, kNumBlocks, options);
  } else {
    side->host = testing::MakePattern(seed);
    agent = KvTransferAgent::Create(side->host.data(), kBlockBytes, kNumBlocks, options);
  }
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  if (!agent.ok()) return nullptr;
  side->agent = std::move(agent).value();
  const std::string path = side->agent->memory_path();
  if (on_device) {
    EXPECT_TRUE(path == "staged" || path == "direct") << path;
  } else {
    EXPECT_EQ(path, "host");
  }
  std::printf("[ info     ] %s pool over %s: memory path %s\n", on_device ? "device" : "host",
              tls.c_str(), path.c_str());
  return side;
}

// Every byte of `dst` is `src`'s per `copies`, else `dst`'s own pattern.
void ExpectCopied(const Side& src, const Side& dst, const std::vector<BlockCopy>& copies,
                  uint8_t dst_seed) {
  testing::ExpectCopied(src.Bytes(), dst.Bytes(), copies, dst_seed);
}

TEST(KvPoolMemoryGpuTest, CopiesToAndFromTheDevice) {
  HW_SKIP_WITHOUT_GPU();
  cuda::DeviceBuffer pool = testing::ToDevice(testing::MakePattern(5));
  ASSERT_NE(pool.data(), nullptr);
  auto memory = NewCudaKvPoolMemory(pool.data(), kPoolBytes, 0);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  KvPoolMemory& m = **memory;
  EXPECT_EQ(m.base(), pool.data());
  EXPECT_EQ(m.cuda_device(), 0);
  EXPECT_FALSE(m.host_accessible());
  ASSERT_TRUE(m.BindCallingThread().ok());

  auto staging = m.AllocateStaging(kBlockBytes);
  ASSERT_TRUE(staging.ok()) << staging.status().ToString();
  const std::vector<uint8_t> want = testing::MakePattern(5);
  ASSERT_TRUE(m.CopyToHost(3 * kBlockBytes + 10, staging->get(), kBlockBytes).ok());
  EXPECT_EQ(0, std::memcmp(staging->get(), &want[3 * kBlockBytes + 10], kBlockBytes));

  std::vector<uint8_t> in(1000, 0x5a);
  ASSERT_TRUE(m.CopyFromHost(kPoolBytes - 1000, in.data(), in.size()).ok());
  const std::vector<uint8_t> got = testing::ToHost<uint8_t>(pool.data(), kPoolBytes);
  EXPECT_EQ(0, std::memcmp(&got[kPoolBytes - 1000], in.data(), in.size()));
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), kPoolBytes - 1000));

  EXPECT_EQ(m.CopyToHost(kPoolBytes - 10, staging->get(), 11).code(), StatusCode::kOutOfRange);
  // Host memory is refused as a device pool.
  EXPECT_EQ(NewCudaKvPoolMemory(in.data(), in.size(), 0).status().code(),
            StatusCode::kInvalidArgument);
}

class KvTransferGpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvTransferGpuTest, MovesEveryByteBetweenDeviceAndHostPools) {
  HW_SKIP_WITHOUT_GPU();
  struct Case {
    bool src_device, dst_device, coalesce;
  };
  for (const Case& c : {Case{true, false, true}, Case{false, true, true}, Case{true, true, true},
                        Case{true, true, false}}) {
    SCOPED_TRACE(std::string(c.src_device ? "device" : "host") + " -> " +
                 (c.dst_device ? "device" : "host") + (c.coalesce ? ", coalesced" : ", per block"));
    auto src = MakeSide(c.src_device, 1, GetParam(), c.coalesce);
    auto dst = MakeSide(c.dst_device, 2, GetParam(), true);
    ASSERT_TRUE(src && dst);
    auto peer = src->agent->Connect(dst->agent->local_info());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    const std::vector<BlockCopy> copies = testing::PatternCopies();
    Status st = src->agent->WriteBlocks(*peer, copies,
                                        testing::Grant(dst->agent->write_key(), copies), kTimeout);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectCopied(*src, *dst, copies, 2);

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

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferGpuTest, ::testing::Values("tcp", "sm,self"),
                         testing::TransportName);

}  // namespace
}  // namespace headway
