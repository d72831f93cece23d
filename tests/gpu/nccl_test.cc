// The NCCL communicator on real GPUs: collectives on device memory, the
// unique id through the rendezvous store, and its error paths. With one GPU
// only setup and errors can be checked (NCCL refuses two ranks on one GPU);
// with two or more, a two-rank all-reduce and gather.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cuda/runtime.h"
#include "tests/gpu/gpu_test.h"

namespace headway {
namespace {

using testing::ToDevice;
using testing::ToHost;

CommunicatorOptions Nccl(int rank, int size, int device, const std::string& prefix) {
  CommunicatorOptions o;
  o.backend = "nccl";
  o.rank = rank;
  o.size = size;
  o.device = device;
  o.key_prefix = prefix;
  o.timeout = std::chrono::milliseconds(10000);
  o.connect_timeout = std::chrono::milliseconds(5000);
  return o;
}

TEST(CudaNcclTest, SingleRankCollectivesOnDeviceMemory) {
  HW_SKIP_WITHOUT_GPU();
  auto store = NewInMemoryStore();
  auto comm = CreateCommunicator(Nccl(0, 1, 0, "single"), *store);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  const std::vector<float> host = {1.5f, -2.0f, 3.25f};
  cuda::DeviceBuffer data = ToDevice(host);
  ASSERT_TRUE((*comm)->AllReduceSum(data.as<float>(), host.size()).ok());
  EXPECT_EQ(ToHost<float>(data.data(), host.size()), host);
  cuda::DeviceBuffer out = ToDevice(std::vector<float>(host.size(), 0.0f));
  ASSERT_TRUE((*comm)->Gather(data.as<float>(), host.size(), out.as<float>(), 0).ok());
  EXPECT_EQ(ToHost<float>(out.data(), host.size()), host);
  EXPECT_TRUE((*comm)->Barrier().ok());
}

TEST(CudaNcclTest, DeviceOutsideTheMachineIsRefused) {
  HW_SKIP_WITHOUT_GPU();
  auto store = NewInMemoryStore();
  auto comm = CreateCommunicator(Nccl(0, 1, cuda::DeviceCount(), "bad-device"), *store);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status().ToString();
}

TEST(CudaNcclTest, PeerThatNeverJoinsTimesOut) {
  HW_SKIP_WITHOUT_GPU();
  auto store = NewInMemoryStore();
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = CreateCommunicator(Nccl(0, 2, 0, "lonely"), *store);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable) << comm.status().ToString();
  EXPECT_LT(seconds, 30.0);
}

// Two ranks: on two GPUs they must sum; on one GPU NCCL refuses the pair,
// and both ranks must return an error rather than hang.
TEST(CudaNcclTest, TwoRanks) {
  HW_SKIP_WITHOUT_GPU();
  const bool two_gpus = cuda::DeviceCount() >= 2;
  auto store = NewInMemoryStore();
  auto run = [&](int rank) -> Status {
    HW_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::SetDevice(two_gpus ? rank : 0));
    (void)info;
    HW_ASSIGN_OR_RETURN(auto comm,
                        CreateCommunicator(Nccl(rank, 2, two_gpus ? rank : 0, "pair"), *store));
    std::vector<float> host = {float(rank + 1), 10.0f * float(rank + 1)};
    cuda::DeviceBuffer data = ToDevice(host);
    HW_RETURN_IF_ERROR(comm->AllReduceSum(data.as<float>(), host.size()));
    const std::vector<float> sum = ToHost<float>(data.data(), host.size());
    if (sum != std::vector<float>{3.0f, 30.0f}) return Status::Internal("wrong all-reduce sum");
    return Status::Ok();
  };
  auto r0 = std::async(std::launch::async, run, 0);
  auto r1 = std::async(std::launch::async, run, 1);
  ASSERT_EQ(r0.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "rank 0 hung";
  ASSERT_EQ(r1.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "rank 1 hung";
  const Status s0 = r0.get(), s1 = r1.get();
  if (two_gpus) {
    EXPECT_TRUE(s0.ok()) << s0.ToString();
    EXPECT_TRUE(s1.ok()) << s1.ToString();
  } else {
    std::printf("[ measured ] one GPU: rank 0: %s; rank 1: %s\n", s0.ToString().c_str(),
                s1.ToString().c_str());
    EXPECT_FALSE(s0.ok() && s1.ok()) << "NCCL accepted two ranks on one GPU";
  }
}

}  // namespace
}  // namespace headway
