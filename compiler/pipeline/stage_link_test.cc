// StageLink on real processes: every stage runs the 1F1B order with pp_step's pairing (each
// action's send posted with the next action's receive), a "forward" that doubles its input and a
// "backward" that triples its gradient into ONE output buffer reused by every action (so a send
// that did not copy first, or a compute that did not wait for its receive, shows), for 2 steps.
// Every received value is recorded on the compute stream and checked against the closed form:
// stage s receives x_i 2^s, and the gradient x_i 2^(p-1) 3^(p-2-s). CPU: 3 processes over UCX
// (host path). GPU (skips without 2 GPUs): one process per GPU, device path (NCCL, no host sync).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/dist_context.h"
#include "compiler/pipeline/schedule.h"
#include "compiler/pipeline/stage_link.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/elementwise/elementwise.h"

namespace sg::compiler {
namespace {

constexpr int kMicro = 5, kElems = 6;

// Micro-batch i's stage-0 input, element k (step-dependent so a stale buffer shows).
float X(int step, int i, int k) { return float(step + 1) * (1.f + float(i)) + 0.25f * float(k); }

void RunLink(bool cuda) {
  const int rank = int(comm::testing::EnvInt("RANK", 0));
  const Device device = cuda ? Device::Cuda(rank) : Device::Cpu();
  auto ctx = DistContext::FromEnv(device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  comm::ProcessGroup& pp = (*ctx)->world();
  const int p = pp.size(), s = pp.rank();
  const StageSpec spec{s, p, 0, 0};
  auto stream = Stream::Create(device);
  ASSERT_TRUE(stream.ok()) << stream.status();
  StageLink::Options lo;
  lo.timeout = absl::Seconds(20);
  auto link = StageLink::Create(&pp, spec, kMicro, {2, 3}, DType::kF32, *stream, lo);
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ((*link)->device_path(), cuda);
  auto out = Tensor::Empty({2, 3}, DType::kF32, device);
  auto seen = Tensor::Empty({2, kMicro, kElems}, DType::kF32, device);  // [activation/gradient][i]
  ASSERT_TRUE(out.ok() && seen.ok());
  auto row = [&](int kind, int i) {
    return TensorView(seen->view().data<float>() + (kind * kMicro + i) * kElems, DType::kF32, {2, 3}, device);
  };
  const std::vector<PipelineAction> order = OneFOneBSchedule(p, s, kMicro);
  using K = PipelineAction::Kind;
  for (int step = 0; step < 2; ++step) {
    std::vector<float> poison(2 * kMicro * kElems, -1.f);
    ASSERT_TRUE(CopyTensor(TensorView(poison.data(), DType::kF32, {int64_t(poison.size())}, Device::Cpu()),
                           seen->view().Reshape({int64_t(poison.size())}).value(), *stream).ok());
    auto needs = [&](size_t k, StageLink::Kind* kind) {
      if (k >= order.size()) return false;
      *kind = order[k].kind == K::kForward ? StageLink::kActivation : StageLink::kGradient;
      return order[k].kind == K::kForward ? !spec.first() : !spec.last();
    };
    auto post_needed = [&](size_t k) {
      StageLink::Kind kind;
      return needs(k, &kind) ? (*link)->PostRecv(kind, order[k].micro) : absl::OkStatus();
    };
    ASSERT_TRUE(post_needed(0).ok());
    std::vector<TensorView> act(kMicro);
    for (size_t k = 0; k < order.size(); ++k) {
      const int i = order[k].micro;
      StageLink::Kind kind;
      TensorView in;
      if (needs(k, &kind)) {
        auto r = (*link)->Received(kind, i);
        ASSERT_TRUE(r.ok()) << r.status();
        in = *r;
        ASSERT_TRUE(CopyTensor(in, row(int(kind), i), *stream).ok());
      }
      if (order[k].kind == K::kForward) {
        if (spec.first()) {
          std::vector<float> x(kElems);
          for (int e = 0; e < kElems; ++e) x[size_t(e)] = X(step, i, e);
          ASSERT_TRUE(CopyTensor(TensorView(x.data(), DType::kF32, {2, 3}, Device::Cpu()), out->view(), *stream).ok());
          in = out->view();
        }
        act[size_t(i)] = in;
        if (!spec.last()) {
          ASSERT_TRUE(kernels::Scale(in, 2.f, out->view(), *stream).ok());
          ASSERT_TRUE((*link)->PostSend(StageLink::kActivation, i, out->view()).ok());
        }
      } else {
        // The last stage's gradient is its received activation; others triple theirs.
        ASSERT_TRUE(kernels::Scale(spec.last() ? act[size_t(i)] : in, spec.last() ? 1.f : 3.f, out->view(), *stream).ok());
        if (!spec.first()) {
          ASSERT_TRUE((*link)->PostSend(StageLink::kGradient, i, out->view()).ok());
        }
      }
      ASSERT_TRUE(post_needed(k + 1).ok());
    }
    ASSERT_TRUE((*link)->Finish().ok());
    std::vector<float> host(2 * kMicro * kElems);
    ASSERT_TRUE(CopyTensor(seen->view(), TensorView(host.data(), DType::kF32, {2, kMicro, kElems}, Device::Cpu()),
                           *stream).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    for (int i = 0; i < kMicro; ++i) {
      for (int e = 0; e < kElems; ++e) {
        const float x = X(step, i, e);
        if (!spec.first()) {
          EXPECT_FLOAT_EQ(host[size_t(i * kElems + e)], x * std::pow(2.f, float(s))) << "activation " << i << " step " << step;
        }
        if (!spec.last()) {
          EXPECT_FLOAT_EQ(host[size_t((kMicro + i) * kElems + e)], x * std::pow(2.f, float(p - 1)) * std::pow(3.f, float(p - 2 - s)))
              << "gradient " << i << " step " << step;
        }
      }
    }
  }
  EXPECT_TRUE((*ctx)->Finalize(absl::Now() + absl::Seconds(20)).ok());
}

TEST(Workers, DISABLED_Link) { RunLink(false); }
TEST(Workers, DISABLED_LinkCuda) { RunLink(true); }

TEST(StageLinkTest, ThreeCpuStagesOneFOneB) {
  auto run = comm::testing::RunWorkers(3, "Workers.DISABLED_Link", {}, absl::Seconds(60));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

// GPU: device to device on every GPU of the machine (up to 4 stages), no host sync in between.
TEST(StageLinkTest, GpuStagesOneFOneBDeviceToDevice) {
  SG_SKIP_WITHOUT_CUDA();
  const int n = std::min(CudaDeviceCount(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, found " << n;
  auto run = comm::testing::RunWorkers(n, "Workers.DISABLED_LinkCuda", {}, absl::Seconds(120));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

}  // namespace
}  // namespace sg::compiler
