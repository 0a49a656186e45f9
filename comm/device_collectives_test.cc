// Device collectives over NCCL: the ring path (NCCL P2P + reduce kernels) and NCCL's native path,
// one process per GPU, checked against a double-precision reference; and device Send/Recv in both
// directions at once, posted in every order. Skips without 2 GPUs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/match.h"

#include "comm/multiprocess_testing.h"
#include "comm/nccl_transport.h"
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

// One worker's connections: store, UCX and NCCL transports, the world group over them.
struct Job {
  RankInfo info;
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<UcxTransport> ucx;
  std::unique_ptr<NcclTransport> nccl;
  Device dev;
  std::unique_ptr<ProcessGroup> pg;
};

Job Connect(const ProcessGroupOptions& opt) {
  Job j;
  j.info = RankInfoFromEnv().value();
  const absl::Time d = absl::Now() + absl::Seconds(60);
  j.rdzv = Rendezvous::Create(j.info, d).value();
  j.ucx = UcxTransport::Create(j.rdzv->store(), "t", j.info.rank, j.info.world_size, d).value();
  j.dev = Device::Cuda(j.info.local_rank % CudaDeviceCount());
  j.nccl = NcclTransport::Create(j.rdzv->store(), "t", j.info.rank, j.info.world_size, j.dev, d).value();
  j.pg = ProcessGroup::Create(&j.rdzv->store(), j.ucx.get(), j.nccl.get(), "world", opt).value();
  return j;
}

TEST(Workers, DISABLED_DeviceCollectives) {
  ProcessGroupOptions opt;
  opt.timeout = absl::Seconds(30);
  opt.device_chunk_bytes = 64 << 10;  // many chunks even at test sizes: exercises the pipeline
  opt.device_ipc = EnvInt("SG_TEST_IPC", 0);
  Job j = Connect(opt);
  const RankInfo& info = j.info;
  const Device dev = j.dev;
  std::unique_ptr<ProcessGroup>& pg = j.pg;
  Stream stream = Stream::Create(dev).value();
  const int n = info.world_size, me = info.rank;
  const int64_t seed = EnvInt("SG_COMM_SEED", 1);
  // Sizes: 1 element; odd sizes whose segments start at offsets that are not 16-byte aligned (the
  // IPC kernels' element-wise path); and 10-24 MB (their vector loop, every unrolled iteration;
  // split copy-engine copies).
  int c = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t numel : {int64_t(1), int64_t(1001), int64_t(300007), int64_t(2500021), int64_t(6000011)}) {
      for (bool native : {false, true}) {
        ++c;
        std::string tag = std::string(DTypeName(dtype)) + " numel " + std::to_string(numel) +
                          (native ? " native" : " ring");
        std::vector<std::vector<double>> in;
        for (int r = 0; r < n; ++r) in.push_back(RankInput(seed, c, r, numel * n, dtype));
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
        ExpectCollectiveNear(sg::testing::ToHost(t), want, dtype, n, "all_reduce " + tag);
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
        ExpectCollectiveNear(sg::testing::ToHost(output), want, dtype, n, "reduce_scatter " + tag);
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
        // avg (the device ring fuses the 1/n into the last reduction) and max, ring path only
        Tensor avg = sg::testing::FromHost(mine, {numel}, dtype, dev);
        ASSERT_TRUE(pg->AllReduce(avg, ReduceOp::kAvg, stream).ok());
        ASSERT_TRUE(stream.Synchronize().ok());
        std::vector<double> want_avg(static_cast<size_t>(numel));
        for (int64_t i = 0; i < numel; ++i) {
          for (int r = 0; r < n; ++r) want_avg[size_t(i)] += in[size_t(r)][size_t(i)] / n;
        }
        ExpectCollectiveNear(sg::testing::ToHost(avg), want_avg, dtype, n, "all_reduce avg " + tag);
        for (ReduceOp rop : {ReduceOp::kAvg, ReduceOp::kMax}) {
          sg::testing::Poison(output);
          ASSERT_TRUE(pg->ReduceScatter(input, output, rop, stream).ok());
          ASSERT_TRUE(stream.Synchronize().ok());
          for (int64_t i = 0; i < numel; ++i) {
            double acc = rop == ReduceOp::kMax ? -1e300 : 0.0;
            for (int r = 0; r < n; ++r) {
              double x = in[size_t(r)][size_t(me * numel + i)];
              acc = rop == ReduceOp::kMax ? std::max(acc, x) : acc + x / n;
            }
            want[size_t(i)] = acc;
          }
          ExpectCollectiveNear(sg::testing::ToHost(output), want, dtype, n,
                     std::string("reduce_scatter ") + std::string(ReduceOpName(rop)) + " " + tag);
        }
        // bf16 in, f32 out (the IPC pull-reduce reading bf16, or the input widened first): the sums
        // to f32 rounding.
        if (dtype == DType::kBF16) {
          Tensor wide = Tensor::Empty({numel}, DType::kF32, dev).value();
          for (ReduceOp rop : {ReduceOp::kSum, ReduceOp::kAvg}) {
            sg::testing::Poison(wide);
            ASSERT_TRUE(pg->ReduceScatter(input, wide, rop, stream).ok()) << tag;
            ASSERT_TRUE(stream.Synchronize().ok());
            for (int64_t i = 0; i < numel; ++i) {
              want[size_t(i)] = 0;
              for (int r = 0; r < n; ++r) want[size_t(i)] += in[size_t(r)][size_t(me * numel + i)];
              if (rop == ReduceOp::kAvg) want[size_t(i)] /= n;
            }
            ExpectCollectiveNear(sg::testing::ToHost(wide), want, DType::kF32, n,
                                 std::string("reduce_scatter bf16 -> f32 ") + std::string(ReduceOpName(rop)) + " " + tag);
          }
        }
        // in-place all-gather: the input is block `me` of the output
        Tensor inplace = Tensor::Empty({numel * n}, dtype, dev).value();
        sg::testing::Poison(inplace);
        Tensor mine_t = sg::testing::FromHost(mine, {numel}, dtype, dev);
        TensorView block(static_cast<char*>(inplace.view().raw()) + me * numel * SizeOf(dtype), dtype,
                         {numel}, dev);
        ASSERT_TRUE(CopyTensor(mine_t, block, stream).ok());
        ASSERT_TRUE(pg->AllGather(block, inplace, stream).ok());
        ASSERT_TRUE(stream.Synchronize().ok());
        EXPECT_EQ(sg::testing::ToHost(inplace), all) << "in-place all_gather " << tag;
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
        // SendRecv with the other rank (on the IPC path each pulls the other's tensor).
        Tensor got = Tensor::Empty({numel}, dtype, dev).value();
        sg::testing::Poison(got);
        auto pair = pg->SendRecv(mine_t, 1 - me, got, 1 - me, 9, stream);
        ASSERT_TRUE(pair.ok()) << tag << ": " << pair.status();
        ASSERT_TRUE(pair->first.Wait(absl::Now() + absl::Seconds(30)).ok()) << tag;
        ASSERT_TRUE(pair->second.Wait(absl::Now() + absl::Seconds(30)).ok()) << tag;
        EXPECT_EQ(sg::testing::ToHost(got),
                  std::vector<double>(in[size_t(1 - me)].begin(), in[size_t(1 - me)].begin() + numel))
            << "sendrecv " << tag;
      }
    }
  }
  ASSERT_TRUE(pg->SynchronizeDevice(absl::Now() + absl::Seconds(30)).ok());
  // The path the collectives took is the one asked for.
  std::cout << "rank " << me << " device algorithm: " << pg->DeviceAlgorithm() << "\n";
  if (opt.device_ipc == 1) {
    EXPECT_EQ(pg->DeviceAlgorithm(), "ipc");
  } else {
    EXPECT_TRUE(absl::StartsWith(pg->DeviceAlgorithm(), "ring")) << pg->DeviceAlgorithm();
  }
  EXPECT_TRUE(pg->Barrier().ok());
  EXPECT_TRUE(j.rdzv->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

#ifdef SG_WITH_CUDA
// The IPC path when a peer is late in the device: rank 1 enters the all-reduce on the host (its
// buffers reach the mailbox) but its stream is held by an 8 s host callback, so its signals never
// come in time. Rank 0's device-side wait gives up at the group's 2 s timeout, its stream drains by
// itself (nothing to abort), and SynchronizeDevice reports which rank did not arrive.
TEST(Workers, DISABLED_IpcPeerLateInTheDevice) {
  ProcessGroupOptions opt;
  opt.timeout = absl::Seconds(2);
  opt.device_ipc = 1;
  Job j = Connect(opt);
  const RankInfo& info = j.info;
  const Device dev = j.dev;
  std::unique_ptr<ProcessGroup>& pg = j.pg;
  Stream stream = Stream::Create(dev).value();
  Tensor t = sg::testing::FromHost(std::vector<double>(4099, 1.0), {4099}, DType::kF32, dev);
  ASSERT_TRUE(pg->AllReduce(t, ReduceOp::kSum, stream).ok());  // first one: both on time
  ASSERT_TRUE(pg->SynchronizeDevice(absl::Now() + absl::Seconds(10)).ok());
  ASSERT_EQ(pg->DeviceAlgorithm(), "ipc");
  EXPECT_EQ(sg::testing::ToHost(t), std::vector<double>(4099, 2.0));
  if (info.rank == 1) {
    const cudaStream_t comm = static_cast<cudaStream_t>(j.nccl->stream()->native());
    ASSERT_EQ(cudaLaunchHostFunc(
                  comm, [](void*) { std::this_thread::sleep_for(std::chrono::seconds(8)); }, nullptr),
              cudaSuccess);
    (void)pg->AllReduce(t, ReduceOp::kSum, stream);
    std::this_thread::sleep_for(std::chrono::seconds(9));
    std::_Exit(0);
  }
  const absl::Time start = absl::Now();
  ASSERT_TRUE(pg->AllReduce(t, ReduceOp::kSum, stream).ok());
  const absl::Status st = pg->SynchronizeDevice(absl::Now() + absl::Seconds(20));
  std::cout << "rank 0 after " << absl::FormatDuration(absl::Now() - start) << ": " << st << "\n";
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 1 did not arrive")) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_TRUE(stream.Synchronize().ok());  // drained without any abort
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}
#endif  // SG_WITH_CUDA

// Point to point between two GPUs in both directions at once, posted the ways users post them. A
// lone NCCL receive blocks its stream until the data arrives, so before the transport batched
// ungrouped operations, "Recv; Send; Wait" on both ranks hung until the deadline.
TEST(Workers, DISABLED_DeviceSendRecvBothDirections) {
  ProcessGroupOptions opt;
  opt.timeout = absl::Seconds(30);
  Job j = Connect(opt);
  const RankInfo& info = j.info;
  const Device dev = j.dev;
  std::unique_ptr<ProcessGroup>& pg = j.pg;
  Stream stream = Stream::Create(dev).value();
  const int me = info.rank, other = 1 - info.rank;
  const int64_t seed = EnvInt("SG_COMM_SEED", 1);
  // How each rank posts its two operations before waiting on them.
  enum Order { kRecvFirst, kSendFirst, kRank0SendsFirst, kTwoEachWay, kThenCollective };
  int c = 0;
  for (Order order : {kRecvFirst, kSendFirst, kRank0SendsFirst, kTwoEachWay, kThenCollective}) {
    for (int64_t numel : {int64_t(1), int64_t(1001), int64_t(3) << 20}) {  // up to 12 MiB f32
      ++c;
      const std::string tag = "order " + std::to_string(int(order)) + " numel " + std::to_string(numel);
      const int messages = order == kTwoEachWay ? 2 : 1;
      std::vector<Tensor> out, in;
      for (int m = 0; m < messages; ++m) {
        out.push_back(sg::testing::FromHost(RankInput(seed, c * 2 + m, me, numel, DType::kF32), {numel},
                                            DType::kF32, dev));
        in.push_back(Tensor::Empty({numel}, DType::kF32, dev).value());
        sg::testing::Poison(in.back());
      }
      std::vector<Request> reqs;
      auto post = [&](bool send, int m) {
        absl::StatusOr<Request> r = send ? pg->Send(out[size_t(m)], other, 5) : pg->Recv(in[size_t(m)], other, 5);
        ASSERT_TRUE(r.ok()) << tag << ": " << r.status();
        reqs.push_back(*std::move(r));
      };
      const bool send_first = order == kSendFirst || (order == kRank0SendsFirst && me == 0);
      for (int m = 0; m < messages; ++m) {
        post(send_first, m);
        post(!send_first, m);
      }
      if (order == kThenCollective) {
        // A collective issued before any Wait must start the held pair first, not deadlock behind it.
        Tensor one = sg::testing::FromHost({1.0}, {1}, DType::kF32, dev);
        ASSERT_TRUE(pg->AllReduce(one, ReduceOp::kSum, stream).ok()) << tag;
        ASSERT_TRUE(pg->SynchronizeDevice(absl::Now() + absl::Seconds(30)).ok()) << tag;
        ASSERT_TRUE(stream.Synchronize().ok());
        EXPECT_EQ(sg::testing::ToHost(one), std::vector<double>{2.0}) << tag;
      }
      for (Request& r : reqs) {
        absl::Status st = r.Wait(absl::Now() + absl::Seconds(30));
        ASSERT_TRUE(st.ok()) << tag << ": " << st;
      }
      // Same-tag messages between a pair arrive in posting order.
      for (int m = 0; m < messages; ++m) {
        EXPECT_EQ(sg::testing::ToHost(in[size_t(m)]), RankInput(seed, c * 2 + m, other, numel, DType::kF32))
            << tag << " message " << m;
      }
    }
  }
  EXPECT_TRUE(pg->Barrier().ok());
  EXPECT_TRUE(j.rdzv->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

TEST(DeviceCollectivesTest, SendRecvBothDirectionsAtOnceOnTwoGpus) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  auto run = RunWorkers(2, "Workers.DISABLED_DeviceSendRecvBothDirections",
                        {"SG_COMM_SEED=" + std::to_string(sg::testing::Rng()() % 1000003)},
                        absl::Seconds(120));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

TEST(DeviceCollectivesTest, IpcPathMatchesReferenceOnTwoGpus) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  auto run = RunWorkers(2, "Workers.DISABLED_DeviceCollectives",
                        {"SG_COMM_SEED=" + std::to_string(sg::testing::Rng()() % 1000003), "SG_TEST_IPC=1",
                         // copies of 16 MiB and more (the largest size's all-gather and SendRecv) in 3 pieces
                         "SG_COMM_IPC_COPY_SPLITS=3"},
                        absl::Seconds(180));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

TEST(DeviceCollectivesTest, IpcPeerLateInTheDeviceFailsAtTheTimeout) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  auto run = RunWorkers(2, "Workers.DISABLED_IpcPeerLateInTheDevice", {}, absl::Seconds(60));
  ASSERT_FALSE(run.timed_out) << run.Summary();
  ASSERT_EQ(run.exit_codes.size(), 2u);
  EXPECT_EQ(run.exit_codes[0], 0) << run.Summary();
  std::cout << run.outputs[0];
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
