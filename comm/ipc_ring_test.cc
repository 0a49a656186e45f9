// The CUDA IPC ring (ipc_ring.h) with 2, 3 and 4 members, whatever the number of GPUs: members
// share GPUs round-robin (CUDA IPC maps memory between processes on one GPU too), so the n-member
// ring's segment order and its signal / wait protocol run on a 1- or 2-GPU machine. All-reduce
// (sum, average, max) and all-gather against a double-precision reference, at sizes whose
// segments start unaligned, outputs poisoned. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "comm/ipc_ring.h"
#include "comm/multiprocess_testing.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::comm {
namespace {

using ::sg::comm::testing::EnvInt;
using ::sg::comm::testing::ExpectCollectiveNear;
using ::sg::comm::testing::RankInput;
using ::sg::comm::testing::RunWorkers;

#ifdef SG_WITH_CUDA
TEST(Workers, DISABLED_IpcRing) {
  const RankInfo info = RankInfoFromEnv().value();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto rdzv = Rendezvous::Create(info, deadline).value();
  const int n = info.world_size, me = info.rank;
  const Device dev = Device::Cuda(me % CudaDeviceCount());
  ASSERT_EQ(cudaSetDevice(dev.ordinal), cudaSuccess);
  Stream stream = Stream::Create(dev).value();
  internal::IpcConfig cfg;
  cfg.max_members = n;
  cfg.timeout = absl::Seconds(30);
  std::string why_not;
  auto made = internal::IpcRing::Create(rdzv->store(), "ipc_test", me, n, dev, true, cfg, deadline, &why_not);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_NE(*made, nullptr) << why_not;
  internal::IpcRing& ring = **made;
  auto check = [deadline] {
    return absl::Now() < deadline ? absl::OkStatus() : absl::DeadlineExceededError("peer buffers");
  };
  const int64_t seed = EnvInt("SG_COMM_SEED", 1);
  int64_t seq = 0;
  int c = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t numel : {int64_t(1), int64_t(1001), int64_t(300007)}) {
      ++c;
      const std::string tag = std::string(DTypeName(dtype)) + " numel " + std::to_string(numel);
      std::vector<std::vector<double>> in;
      for (int r = 0; r < n; ++r) in.push_back(RankInput(seed, c, r, numel, dtype));
      std::vector<int64_t> counts(size_t(n), numel / n);
      for (int i = 0; i < numel % n; ++i) ++counts[size_t(i)];
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        Tensor t = sg::testing::FromHost(in[size_t(me)], {numel}, dtype, dev);
        const float scale = op == ReduceOp::kAvg ? 1.0f / float(n) : 1.0f;
        ASSERT_TRUE(ring.AllReduce(static_cast<char*>(t.view().raw()), dtype, counts, op, scale, ++seq, stream, check)
                        .ok())
            << tag;
        ASSERT_TRUE(stream.Synchronize().ok());
        ASSERT_TRUE(ring.Error().ok()) << ring.Error();
        std::vector<double> want(static_cast<size_t>(numel), op == ReduceOp::kMax ? -1e300 : 0.0);
        for (int64_t i = 0; i < numel; ++i) {
          for (int r = 0; r < n; ++r) {
            const double x = in[size_t(r)][size_t(i)];
            want[size_t(i)] = op == ReduceOp::kMax ? std::max(want[size_t(i)], x) : want[size_t(i)] + x * scale;
          }
        }
        ExpectCollectiveNear(sg::testing::ToHost(t), want, dtype, n,
                   "all_reduce " + std::string(ReduceOpName(op)) + " " + tag);
      }
      Tensor part = sg::testing::FromHost(in[size_t(me)], {numel}, dtype, dev);
      Tensor all = Tensor::Empty({numel * n}, dtype, dev).value();
      sg::testing::Poison(all);
      ASSERT_TRUE(ring.AllGather(static_cast<const char*>(part.view().raw()), static_cast<char*>(all.view().raw()),
                                 part.nbytes(), ++seq, stream, check)
                      .ok())
          << tag;
      ASSERT_TRUE(stream.Synchronize().ok());
      ASSERT_TRUE(ring.Error().ok()) << ring.Error();
      std::vector<double> want_all;
      for (int r = 0; r < n; ++r) want_all.insert(want_all.end(), in[size_t(r)].begin(), in[size_t(r)].end());
      EXPECT_EQ(sg::testing::ToHost(all), want_all) << "all_gather " << tag;
    }
  }
  EXPECT_TRUE(rdzv->Finalize(absl::Now() + absl::Seconds(30)).ok());
}
#endif  // SG_WITH_CUDA

void RunRing(int members) {
  auto run = RunWorkers(members, "Workers.DISABLED_IpcRing",
                        {"SG_COMM_SEED=" + std::to_string(sg::testing::Rng()() % 1000003)}, absl::Seconds(240));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

TEST(IpcRingTest, TwoMembersMatchReference) {
  SG_SKIP_WITHOUT_CUDA();
  RunRing(2);
}
TEST(IpcRingTest, ThreeMembersMatchReference) {
  SG_SKIP_WITHOUT_CUDA();
  RunRing(3);
}
TEST(IpcRingTest, FourMembersMatchReference) {
  SG_SKIP_WITHOUT_CUDA();
  RunRing(4);
}

}  // namespace
}  // namespace sg::comm
