// GpuEnergyMeter: the clock summary against a counting definition of min / median / max on fresh
// random samples; the errors a caller gets (bad period, a machine without NVML or an unknown bus
// id, Start / Stop out of order); and on a GPU, a window of device work read back as positive
// energy at a plausible power with clock samples.
#include "benchmarks/gpu_energy.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/device.h"
#include "kernels/core/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"
#include "kernels/core/testing.h"

namespace sg::benchmarks {
namespace {

// The value with exactly k samples strictly below it or, with ties, the one whose range of ranks
// holds k: no sorting.
unsigned RankK(const std::vector<unsigned>& v, size_t k) {
  for (unsigned x : v) {
    const size_t below = size_t(std::count_if(v.begin(), v.end(), [&](unsigned y) { return y < x; }));
    const size_t same = size_t(std::count(v.begin(), v.end(), x));
    if (below <= k && k < below + same) return x;
  }
  return 0;
}

TEST(GpuEnergyTest, SummarizeClocksGivesMinMedianMax) {
  for (int n : {1, 2, 7, 50}) {
    SCOPED_TRACE(n);
    std::vector<unsigned> mhz;
    for (int i = 0; i < n; ++i) mhz.push_back(unsigned(300 + testing::Rng()() % 1700));
    GpuEnergyReading r;
    r.sm_clock_median_mhz = -1;
    SummarizeClocks(mhz, &r);
    EXPECT_EQ(r.samples, n);
    EXPECT_EQ(r.sm_clock_min_mhz, *std::min_element(mhz.begin(), mhz.end()));
    EXPECT_EQ(r.sm_clock_max_mhz, *std::max_element(mhz.begin(), mhz.end()));
    EXPECT_EQ(r.sm_clock_median_mhz, RankK(mhz, mhz.size() / 2));
  }
  GpuEnergyReading none;
  none.sm_clock_max_mhz = 5;
  SummarizeClocks({}, &none);
  EXPECT_EQ(none.samples, 0);
  EXPECT_EQ(none.sm_clock_max_mhz, 0);
}

TEST(GpuEnergyTest, RefusesANonPositivePeriod) {
  auto m = GpuEnergyMeter::Open("0000:00:00.0", absl::ZeroDuration());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("sample period > 0"), std::string::npos) << m.status();
}

// Without a GPU: no NVML (Unavailable, naming the library) or NVML without this bus id (NotFound,
// naming it); never a meter.
TEST(GpuEnergyTest, WithoutAGpuSaysWhy) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is present: GpuEnergyTest.MeasuresDeviceWork covers it";
  auto m = GpuEnergyMeter::Open("0000:ff:1f.7");
  ASSERT_FALSE(m.ok());
  const std::string msg(m.status().message());
  if (m.status().code() == absl::StatusCode::kUnavailable) {
    EXPECT_NE(msg.find("libnvidia-ml.so.1"), std::string::npos) << msg;
  } else {
    EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
    EXPECT_NE(msg.find("0000:ff:1f.7"), std::string::npos) << msg;
  }
}

TEST(GpuEnergyTest, MeasuresDeviceWork) {
  SG_SKIP_WITHOUT_CUDA();
  absl::StatusOr<std::string> bus = CudaDevicePciBusId(0);
  ASSERT_TRUE(bus.ok()) << bus.status();
  auto m = GpuEnergyMeter::Open(*bus, absl::Milliseconds(20));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->Stop().status().code(), absl::StatusCode::kFailedPrecondition);
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  Tensor big = Tensor::Empty({int64_t(1) << 28}, DType::kF32, d).value();  // 1 GiB
  ASSERT_TRUE(s.Synchronize().ok());
  ASSERT_TRUE((*m)->Start().ok());
  EXPECT_EQ((*m)->Start().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Time until = absl::Now() + absl::Milliseconds(400);
  while (absl::Now() < until) {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(ZeroTensor(big.view(), s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
  }
  absl::StatusOr<GpuEnergyReading> r = (*m)->Stop();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->seconds, 0.4);
  EXPECT_GT(r->joules, 0);
  EXPECT_GT(r->mean_watts, 20) << "a GPU writing memory for 0.4 s";
  EXPECT_LT(r->mean_watts, 2000);
  EXPECT_GE(r->samples, 5);
  EXPECT_GT(r->sm_clock_min_mhz, 100);
  EXPECT_LE(r->sm_clock_min_mhz, r->sm_clock_median_mhz);
  EXPECT_LE(r->sm_clock_median_mhz, r->sm_clock_max_mhz);
  // A working GPU between freezing and its shutdown temperature (every NVML this runs on has the reading).
  EXPECT_GE(r->temperature_min_c, 5);
  EXPECT_LE(r->temperature_min_c, r->temperature_max_c);
  EXPECT_LT(r->temperature_max_c, 110);
  // A second window on the same meter.
  ASSERT_TRUE((*m)->Start().ok());
  EXPECT_TRUE((*m)->Stop().ok());
}

// Polls as a counter that the driver bumps every `period` s at `watts`, read every `poll` s from
// `t0` for `seconds`.
std::vector<CounterReading> Polls(double t0, double seconds, double poll, double period, double watts) {
  std::vector<CounterReading> v;
  for (double t = t0; t <= t0 + seconds + 1e-12; t += poll) {
    const double last_update = std::floor(t / period) * period;
    v.push_back({t, uint64_t(1000000 + std::llround(last_update * watts * 1e3))});
  }
  return v;
}

TEST(GpuEnergyTest, PowerBetweenUpdatesUsesOnlyTheCounterEdges) {
  const double watts = 300 + double(testing::Rng()() % 400);
  const double t0 = double(testing::Rng()() % 1000) / 997.0;
  // A 1 s window polled every ms: the updates are 100 ms apart, the span between the first and
  // the last ~0.9 s, and the power exact to the poll's quantization.
  absl::StatusOr<EdgePower> p = PowerBetweenUpdates(Polls(t0, 1.0, 0.001, 0.1, watts));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GE(p->updates, 9);
  EXPECT_LE(p->updates, 11);
  EXPECT_NEAR(p->seconds, 0.1 * (p->updates - 1), 0.0021);
  EXPECT_NEAR(p->watts, watts, watts * 0.005);
  // Too short a window: names what it found.
  absl::StatusOr<EdgePower> short_window = PowerBetweenUpdates(Polls(t0, 0.15, 0.001, 0.1, watts));
  EXPECT_EQ(short_window.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(short_window.status().message().find("expected >= 3 updates"), std::string::npos) << short_window.status();
  EXPECT_EQ(PowerBetweenUpdates({}, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuEnergyTest, EnergyCostMeterRefusesBadWindows) {
  auto m = EnergyCostMeter::Open("0000:00:00.0", absl::Milliseconds(100));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find(">= 300 ms"), std::string::npos) << m.status();
  m = EnergyCostMeter::Open("0000:00:00.0", absl::Seconds(1), absl::Milliseconds(-1));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
}

// Zeroing twice the bytes a call costs about twice the joules; the power is a working GPU's.
TEST(GpuEnergyTest, EnergyCostMeterScalesWithTheWork) {
  SG_SKIP_WITHOUT_CUDA();
  absl::StatusOr<std::string> bus = CudaDevicePciBusId(0);
  ASSERT_TRUE(bus.ok()) << bus.status();
  std::ostringstream log;
  auto meter = EnergyCostMeter::Open(*bus, absl::Milliseconds(600), absl::Milliseconds(200), &log);
  ASSERT_TRUE(meter.ok()) << meter.status();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  Tensor big = Tensor::Empty({int64_t(1) << 29}, DType::kF32, d).value();  // 2 GiB
  auto cost = [&](int64_t elems) -> absl::StatusOr<double> {
    SG_ASSIGN_OR_RETURN(TensorView v, big.view().Slice0(0, elems));
    auto run = [&](int64_t calls) -> absl::StatusOr<double> {
      const absl::Time t = absl::Now();
      for (int64_t i = 0; i < calls; ++i) SG_RETURN_IF_ERROR(ZeroTensor(v, s));
      SG_RETURN_IF_ERROR(s.Synchronize());
      return absl::ToDoubleMilliseconds(absl::Now() - t);
    };
    SG_ASSIGN_OR_RETURN(double ms, run(4));
    return (*meter)->CostPerCall(run, ms * 1e3 / 4);
  };
  absl::StatusOr<double> one = cost(int64_t(1) << 28), two = cost(int64_t(1) << 29);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_GT(*one, 0);
  EXPECT_GT(*two / *one, 1.6) << log.str();
  EXPECT_LT(*two / *one, 2.5) << log.str();
  EXPECT_NE(log.str().find(" W: "), std::string::npos) << log.str();
  // Writing 1 GiB takes ~0.3 ms at 3-4 TB/s: between an idle GPU's ~0.03 J and the limit's ~0.25.
  EXPECT_GT(*one, 0.01) << log.str();
  EXPECT_LT(*one, 1.0) << log.str();
}

TEST(GpuEnergyTest, PowerWhileNeedsAWindowLongEnough) {
  SG_SKIP_WITHOUT_CUDA();
  auto m = GpuEnergyMeter::Open(*CudaDevicePciBusId(0));
  ASSERT_TRUE(m.ok()) << m.status();
  auto quick = (*m)->PowerWhile([] {
    absl::SleepFor(absl::Milliseconds(20));
    return absl::OkStatus();
  });
  EXPECT_EQ(quick.status().code(), absl::StatusCode::kFailedPrecondition) << quick.status();
  auto failing = (*m)->PowerWhile([] { return absl::DataLossError("work failed"); });
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kDataLoss);
  // The meter is usable after both.
  auto idle = (*m)->PowerWhile([] {
    absl::SleepFor(absl::Milliseconds(450));
    return absl::OkStatus();
  });
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_GT(idle->watts, 10);
  EXPECT_LT(idle->watts, 1200);
}

}  // namespace
}  // namespace sg::benchmarks
