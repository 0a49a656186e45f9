#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/core/allocator.h"
#include "kernels/core/cuda_graph.h"
#include "kernels/core/device.h"
#include "kernels/core/parallel.h"
#include "kernels/core/status.h"
#include "kernels/core/tensor.h"
#include "kernels/core/testing.h"

namespace sg {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every bf16 and f16 value survives a trip through float exactly.
TEST(DTypeTest, SixteenBitTypesRoundTripEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    BFloat16 x{uint16_t(b)};
    Half h{uint16_t(b)};
    if (!std::isnan(x.ToFloat())) {
      EXPECT_EQ(BFloat16::FromFloat(x.ToFloat()).bits, b) << b;
    }
    if (!std::isnan(h.ToFloat())) {
      EXPECT_EQ(Half::FromFloat(h.ToFloat()).bits, b) << b;
    }
  }
}

// Conversion picks the nearest representable value (independent check through double arithmetic).
TEST(DTypeTest, ConversionRoundsToNearest) {
  std::uniform_int_distribution<uint32_t> bits;
  auto& rng = testing::Rng();
  for (int i = 0; i < 200000; ++i) {
    float f = FromBits(bits(rng));
    if (std::isnan(f) || std::isinf(f)) continue;
    const double d = f;
    BFloat16 b = BFloat16::FromFloat(f);
    if (!std::isinf(b.ToFloat())) {
      for (int delta : {-1, 1}) {
        BFloat16 n{uint16_t(b.bits + delta)};
        if (std::isnan(n.ToFloat()) || std::isinf(n.ToFloat())) continue;
        if ((b.bits & 0x7fff) == 0 && delta == -1) continue;  // crossing zero changes sign, not magnitude
        EXPECT_LE(std::abs(double(b.ToFloat()) - d), std::abs(double(n.ToFloat()) - d)) << f;
      }
    }
    float small = std::ldexp(f, -std::ilogb(f) + (i % 40) - 20);  // values within half's range
    Half h = Half::FromFloat(small);
    if (std::isinf(h.ToFloat())) {
      EXPECT_GE(std::abs(small), 65504.0f) << small;
      continue;
    }
    for (int delta : {-1, 1}) {
      Half n{uint16_t(h.bits + delta)};
      if (std::isnan(n.ToFloat()) || std::isinf(n.ToFloat()) || ((h.bits & 0x7fff) == 0 && delta == -1)) continue;
      EXPECT_LE(std::abs(double(h.ToFloat()) - small), std::abs(double(n.ToFloat()) - small)) << small;
    }
  }
}

TEST(DTypeTest, NamesParseBack) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64}) {
    EXPECT_EQ(ParseDType(DTypeName(t)).value(), t);
  }
  absl::StatusOr<DType> bad = ParseDType("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fp8'"), std::string::npos) << bad.status();
}

TEST(TensorTest, ViewsReshapeAndSlice) {
  Tensor t = Tensor::Empty({6, 4}, DType::kF32, Device::Cpu()).value();
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = float(i);
  TensorView rows = t.view().Slice0(2, 5).value();
  EXPECT_EQ(rows.shape(), (Shape{3, 4}));
  EXPECT_EQ(rows.data<float>()[0], 8.0f);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(t.view().Reshape({24}).value().numel(), 24);
  EXPECT_FALSE(t.view().Reshape({5, 5}).ok());
  EXPECT_FALSE(t.view().Slice0(4, 7).ok());
  EXPECT_FALSE(Tensor::Empty({2, -1}, DType::kF32, Device::Cpu()).ok());
}

TEST(TensorTest, ExpectTensorNamesBothSides) {
  Tensor t = Tensor::Empty({3}, DType::kF32, Device::Cpu()).value();
  absl::Status s = ExpectTensor(t, "rmsnorm weight", DType::kBF16, {3}, Device::Cpu());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rmsnorm weight: expected contiguous bf16[3]@cpu, found f32[3]@cpu"),
            std::string::npos)
      << s;
}

TEST(AllocatorTest, HostCountsCurrentAndPeak) {
  Allocator* a = AllocatorFor(Device::Cpu()).value();
  a->ResetPeak();
  const int64_t base = a->CurrentBytes();
  void* p = a->Allocate(1000).value();
  void* q = a->Allocate(64).value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_EQ(a->CurrentBytes() - base, 1024 + 64);
  a->Free(p);
  EXPECT_EQ(a->CurrentBytes() - base, 64);
  EXPECT_EQ(a->PeakBytes() - base, 1024 + 64);
  a->Free(q);
}

TEST(AllocatorTest, CudaUnavailableIsAnError) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<Allocator*> a = AllocatorFor(Device::Cuda(0));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
}

// The PCI bus id names a device ("dddd:bb:dd.f"); an ordinal out of range, or no device at all,
// is an error naming why.
TEST(DeviceTest, PciBusIdOfEachDevice) {
  if (!CudaAvailable()) {
    absl::StatusOr<std::string> none = CudaDevicePciBusId(0);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(none.status().message().find(CudaUnavailableReason()), std::string::npos) << none.status();
    return;
  }
  for (int d = 0; d < CudaDeviceCount(); ++d) {
    absl::StatusOr<std::string> id = CudaDevicePciBusId(d);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(std::count(id->begin(), id->end(), ':'), 2) << *id;
    EXPECT_NE(id->find('.'), std::string::npos) << *id;
  }
  absl::StatusOr<std::string> bad = CudaDevicePciBusId(CudaDeviceCount());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("found " + std::to_string(CudaDeviceCount())), std::string::npos);
}

TEST(CudaTest, CachingAllocatorReusesAndTracksPeak) {
  SG_SKIP_WITHOUT_CUDA();
  Allocator* a = AllocatorFor(Device::Cuda(0)).value();
  a->ResetPeak();
  void* p = a->Allocate(3 << 20).value();
  const int64_t reserved = a->ReservedBytes();
  a->Free(p);
  void* q = a->Allocate(3 << 20).value();
  EXPECT_EQ(p, q) << "a freed block of the same size must be reused";
  EXPECT_EQ(a->ReservedBytes(), reserved);
  EXPECT_GE(a->PeakBytes(), 3 << 20);
  a->Free(q);
}

TEST(CudaTest, CopyRoundTripAndEvents) {
  SG_SKIP_WITHOUT_CUDA();
  auto& rng = testing::Rng();
  Stream s = Stream::Create(Device::Cuda(0)).value();
  Tensor h = testing::RandomTensor({1000, 3}, DType::kBF16, Device::Cpu(), rng);
  Tensor d = Tensor::Empty(h.shape(), h.dtype(), Device::Cuda(0)).value();
  Tensor back = Tensor::Empty(h.shape(), h.dtype(), Device::Cpu()).value();
  testing::Poison(back);
  Event start = Event::Create(s.device(), /*timing=*/true).value();
  Event stop = Event::Create(s.device(), /*timing=*/true).value();
  ASSERT_TRUE(start.Record(s).ok());
  ASSERT_TRUE(CopyTensor(h, d, s).ok());
  ASSERT_TRUE(CopyTensor(d, back, s).ok());
  ASSERT_TRUE(stop.Record(s).ok());
  ASSERT_TRUE(stop.Synchronize().ok());
  EXPECT_GE(stop.ElapsedMsSince(start).value(), 0.0f);
  EXPECT_EQ(testing::ToHost(back), testing::ToHost(h));
}

TEST(ParallelTest, CoversEveryIndexOnce) {
  for (int64_t n : {1, 7, 1000, 100003}) {
    std::vector<int> hits(size_t(n), 0);
    ParallelFor(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "n=" << n << " i=" << i;
  }
}

// StreamHold: work enqueued behind a hold waits for Release() (a device-to-device copy has not
// happened while held), then runs; a hold never released ends by itself at its limit.
TEST(CudaTest, StreamHoldWaitsForReleaseAndTimesOut) {
  SG_SKIP_WITHOUT_CUDA();
  auto& rng = testing::Rng();
  Stream s = Stream::Create(Device::Cuda(0)).value();
  Tensor src = testing::RandomTensor({4096}, DType::kF32, Device::Cuda(0), rng);
  Tensor dst = Tensor::Empty({4096}, DType::kF32, Device::Cuda(0)).value();
  testing::Poison(dst);
  auto hold = testing::StreamHold::Create();
  ASSERT_TRUE(hold.ok()) << hold.status();
  ASSERT_TRUE((*hold)->Hold(s, /*limit_s=*/30.0).ok());
  ASSERT_TRUE(CopyTensor(src, dst, s).ok());
  Event done = Event::Create(s.device()).value();
  ASSERT_TRUE(done.Record(s).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.Query().value()) << "the copy ran while the stream was held";
  (*hold)->Release();
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(testing::ToHost(dst), testing::ToHost(src));

  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*hold)->Hold(s, /*limit_s=*/0.2).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.15);
  EXPECT_LT(waited, 10.0);
}

// CudaGraph refuses what it cannot capture, on any build: a CPU stream, and a replay of nothing.
TEST(CudaGraphTest, CpuStreamAndEmptyGraphAreErrors) {
  Stream cpu = Stream::Cpu();
  bool ran = false;
  absl::StatusOr<CudaGraph> g = CudaGraph::Capture(cpu, [&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_FALSE(ran) << "the body must not run when nothing can capture it";
  CudaGraph empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_EQ(empty.Launch(cpu).code(), absl::StatusCode::kFailedPrecondition);
}

// A captured chain of device copies (src -> mid -> dst, with a branch on a second stream that
// forks from and is joined back into the capturing stream) does not run at capture, and every
// replay reads src as it is at that replay: new random values before each launch arrive in dst.
TEST(CudaGraphTest, ReplaysReadCurrentInputsAndJoinForkedStreams) {
  SG_SKIP_WITHOUT_CUDA();
  auto& rng = testing::Rng();
  const Device gpu = Device::Cuda(0);
  Stream s = Stream::Create(gpu).value();
  Stream side = Stream::Create(gpu).value();
  Tensor src = Tensor::Empty({3000}, DType::kF32, gpu).value();
  Tensor mid = Tensor::Empty({3000}, DType::kF32, gpu).value();
  Tensor dst = Tensor::Empty({3000}, DType::kF32, gpu).value();
  Tensor branch = Tensor::Empty({3000}, DType::kF32, gpu).value();
  for (Tensor* t : {&src, &mid, &dst, &branch}) testing::Poison(*t);
  Event fork = Event::Create(gpu).value();
  for (bool node_priority : {false, true}) {
    absl::StatusOr<CudaGraph> g = CudaGraph::Capture(
        s,
        [&]() -> absl::Status {
          SG_RETURN_IF_ERROR(CopyTensorAsync(src, mid, s));
          SG_RETURN_IF_ERROR(fork.Record(s));
          SG_RETURN_IF_ERROR(fork.Block(side));
          SG_RETURN_IF_ERROR(CopyTensorAsync(mid, branch, side));
          return CopyTensorAsync(mid, dst, s);
        },
        {&side}, node_priority);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(g->valid());
    ASSERT_TRUE(s.Synchronize().ok());
    if (!node_priority) {
      for (double v : testing::ToHost(dst)) ASSERT_TRUE(std::isnan(v)) << "the capture ran the copies";
    }
    for (int replay = 0; replay < 3; ++replay) {
      Tensor fresh = testing::RandomTensor({3000}, DType::kF32, Device::Cpu(), rng);
      ASSERT_TRUE(CopyTensor(fresh, src, s).ok());
      ASSERT_TRUE(g->Launch(s).ok());
      ASSERT_TRUE(s.Synchronize().ok());
      EXPECT_EQ(testing::ToHost(dst), testing::ToHost(fresh)) << "replay " << replay;
      EXPECT_EQ(testing::ToHost(branch), testing::ToHost(fresh)) << "replay " << replay << " (forked stream)";
    }
  }
}

// A body's error comes back after the capture has ended, as does a forked stream left unjoined,
// and the stream stays usable for eager work afterwards.
TEST(CudaGraphTest, FailedCaptureLeavesStreamUsable) {
  SG_SKIP_WITHOUT_CUDA();
  auto& rng = testing::Rng();
  const Device gpu = Device::Cuda(0);
  Stream s = Stream::Create(gpu).value();
  Stream side = Stream::Create(gpu).value();
  Tensor a = testing::RandomTensor({512}, DType::kF32, gpu, rng);
  Tensor b = Tensor::Empty({512}, DType::kF32, gpu).value();
  absl::StatusOr<CudaGraph> failed = CudaGraph::Capture(s, [&]() -> absl::Status {
    SG_RETURN_IF_ERROR(CopyTensorAsync(a, b, s));
    return absl::DataLossError("body failed on purpose");
  });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss) << failed.status();
  EXPECT_NE(failed.status().message().find("on purpose"), std::string::npos) << failed.status();
  Event fork = Event::Create(gpu).value();
  absl::StatusOr<CudaGraph> unjoined = CudaGraph::Capture(s, [&]() -> absl::Status {
    SG_RETURN_IF_ERROR(fork.Record(s));
    SG_RETURN_IF_ERROR(fork.Block(side));
    return CopyTensorAsync(a, b, side);
  });  // `side` not in the join list
  EXPECT_FALSE(unjoined.ok()) << "a capture with an unjoined forked stream must fail";
  testing::Poison(b);
  ASSERT_TRUE(CopyTensor(a, b, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(testing::ToHost(b), testing::ToHost(a));
}

// Median against a full sort of fresh random values, odd and even counts (benchmarks report it).
TEST(TestingTest, MedianMatchesSortedMiddle) {
  auto& rng = testing::Rng();
  std::uniform_real_distribution<double> u(-5.0, 5.0);
  for (int n : {1, 2, 7, 10, 101}) {
    std::vector<double> v(n);
    for (double& x : v) x = u(rng);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double want = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    EXPECT_DOUBLE_EQ(testing::Median(v), want) << n;
  }
  EXPECT_EQ(testing::Median({}), 0.0);
}

}  // namespace
}  // namespace sg
