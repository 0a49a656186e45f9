// Device collectives over NCCL: the ring path (NCCL P2P + reduce kernels) and NCCL's native path,
// one process per GPU, checked against a double-precision reference. Skips without 2 GPUs.
#include <cmath>
#include <random>

#include "comm/multiprocess_testing.h"
#include "comm/nccl_transport.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::comm {
namespace {

using ::sg::comm::testing::EnvInt;
using ::sg::comm::testing::RunWorkers;

std::vector<double> Input(int64_t seed, int c, int r, int64_t n, DType dtype) {
  std::mt19937_64 rng(uint64_t(seed) * 7919 + uint64_t(c) * 131 + uint64_t(r));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    float f = u(rng);
    x = dtype == DType::kBF16 ? BFloat16::FromFloat(f).ToFloat() : f;
  }
  return v;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, DType dtype, int n,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double tol = dtype == DType::kF32 ? 1e-5 * n : std::ldexp(1.0, -7) * n;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      ++bad;
    }
  }
}

TEST(Workers, DISABLED_DeviceCollectives) {
  auto info = RankInfoFromEnv().value();
  absl::Time d = absl::Now() + absl::Seconds(60);
  auto rdzv = Rendezvous::Create(info, d).value();
  auto ucx = UcxTransport::Create(rdzv->store(), "t", info.rank, info.world_size, d).value();
  Device dev = Device::Cuda(info.local_rank % CudaDeviceCount());
  auto nccl = NcclTransport::Create(rdzv->store(), "t", info.rank, info.world_size, dev, d);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ProcessGroupOptions opt;
  opt.timeout = absl::Seconds(30);
  opt.device_chunk_bytes = 64 << 10;  // many chunks even at test sizes: exercises the pipeline
  auto pg = ProcessGroup::Create(&rdzv->store(), ucx.get(), nccl->get(), "world", opt).value();
  Stream stream = Stream::Create(dev).value();
  const int n = info.world_size, me = info.rank;
  const int64_t seed = EnvInt("SG_COMM_SEED", 1);
  int c = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t numel : {int64_t(1), int64_t(1001), int64_t(300007)}) {
      for (bool native : {false, true}) {
        ++c;
        std::string tag = std::string(DTypeName(dtype)) + " numel " + std::to_string(numel) +
                          (native ? " native" : " ring");
        std::vector<std::vector<double>> in;
        for (int r = 0; r < n; ++r) in.push_back(Input(seed, c, r, numel * n, dtype));
        // all-reduce sum
        std::vector<double> mine(in[size_t(me)].begin(), in[size_t(me)].begin() + numel);
        Tensor t = sg::testing::FromHost(mine, {numel}, dtype, dev);
        absl::Status s = native ? pg->NativeAllReduce(t, ReduceOp::kSum, stream)
                                : pg->AllReduce(t, ReduceOp::kSum, stream);
        ASSERT_TRUE(s.ok()) << tag << ": " << s;
        ASSERT_TRUE(stream.Synchronize().ok());
        std::vector<double> want(static_cast<size_t>(numel));
        for (int64_t i = 0; i < numel; ++i) {
          for (int r = 0; r < n; ++r) want[size_t(i)] += in[size_t(r)][size_t(i)];
        }
        ExpectNear(sg::testing::ToHost(t), want, dtype, n, "all_reduce " + tag);
        // reduce-scatter sum
        Tensor input = sg::testing::FromHost(in[size_t(me)], {numel * n}, dtype, dev);
        Tensor output = Tensor::Empty({numel}, dtype, dev).value();
        sg::testing::Poison(output);
        s = native ? pg->NativeReduceScatter(input, output, ReduceOp::kSum, stream)
                   : pg->ReduceScatter(input, output, ReduceOp::kSum, stream);
        ASSERT_TRUE(s.ok()) << tag << ": " << s;
        ASSERT_TRUE(stream.Synchronize().ok());
        for (int64_t i = 0; i < numel; ++i) {
          want[size_t(i)] = 0;
          for (int r = 0; r < n; ++r) want[size_t(i)] += in[size_t(r)][size_t(me * numel + i)];
        }
        ExpectNear(sg::testing::ToHost(output), want, dtype, n, "reduce_scatter " + tag);
        // all-gather
        Tensor gathered = Tensor::Empty({numel * n}, dtype, dev).value();
        sg::testing::Poison(gathered);
        Tensor part = sg::testing::FromHost(mine, {numel}, dtype, dev);
        s = native ? pg->NativeAllGather(part, gathered, stream) : pg->AllGather(part, gathered, stream);
        ASSERT_TRUE(s.ok()) << tag << ": " << s;
        ASSERT_TRUE(stream.Synchronize().ok());
        std::vector<double> all;
        for (int r = 0; r < n; ++r) all.insert(all.end(), in[size_t(r)].begin(), in[size_t(r)].begin() + numel);
        EXPECT_EQ(sg::testing::ToHost(gathered), all) << "all_gather " << tag;
        if (native) continue;
        // broadcast and all-to-all (ring path only)
        Tensor b = sg::testing::FromHost(mine, {numel}, dtype, dev);
        ASSERT_TRUE(pg->Broadcast(b, n - 1, stream).ok());
        ASSERT_TRUE(stream.Synchronize().ok());
        EXPECT_EQ(sg::testing::ToHost(b),
                  std::vector<double>(in[size_t(n - 1)].begin(), in[size_t(n - 1)].begin() + numel));
        Tensor a2a = Tensor::Empty({numel * n}, dtype, dev).value();
        sg::testing::Poison(a2a);
        ASSERT_TRUE(pg->AllToAll(input, a2a, stream).ok());
        ASSERT_TRUE(stream.Synchronize().ok());
        std::vector<double> want_a2a;
        for (int r = 0; r < n; ++r) {
          want_a2a.insert(want_a2a.end(), in[size_t(r)].begin() + me * numel,
                          in[size_t(r)].begin() + (me + 1) * numel);
        }
        EXPECT_EQ(sg::testing::ToHost(a2a), want_a2a) << "all_to_all " << tag;
      }
    }
  }
  ASSERT_TRUE(pg->SynchronizeDevice(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_TRUE(pg->Barrier().ok());
  EXPECT_TRUE(rdzv->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

TEST(DeviceCollectivesTest, RingAndNativeMatchReferenceOnTwoGpus) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  auto run = RunWorkers(2, "Workers.DISABLED_DeviceCollectives",
                        {"SG_COMM_SEED=" + std::to_string(sg::testing::Rng()() % 1000003)},
                        absl::Seconds(120));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

}  // namespace
}  // namespace sg::comm
