// Fused residual add + RMSNorm against independent references: a double loop written from the
// definition (forward and analytic backward), central finite differences in f64 of a loss that
// uses both outputs (y and the new residual h), and the CPU implementation for CUDA. Fresh random
// inputs every run; outputs poisoned before each kernel; odd sizes; in-place residual updates.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/add_rmsnorm/add_rmsnorm_internal.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::MaxAbsError;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

constexpr float kEps = 1e-5f;

struct Ref {
  std::vector<double> h, y, rstd, dh, dw;
};

// h is given (already rounded the way the kernel stores it); everything else in f64.
Ref DoubleReference(const std::vector<double>& h, const std::vector<double>& w, const std::vector<double>& dy,
                    const std::vector<double>& dh_in, int64_t rows, int64_t dim) {
  Ref r;
  r.h = h;
  r.y.resize(h.size());
  r.dh.resize(h.size());
  r.rstd.resize(size_t(rows));
  r.dw.assign(size_t(dim), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += h[i * dim + j] * h[i * dim + j];
    const double rs = 1.0 / std::sqrt(ss / dim + kEps);
    r.rstd[i] = rs;
    double dot = 0;
    for (int64_t j = 0; j < dim; ++j) {
      r.y[i * dim + j] = h[i * dim + j] * rs * w[j];
      dot += dy[i * dim + j] * w[j] * h[i * dim + j];
    }
    for (int64_t j = 0; j < dim; ++j) {
      r.dh[i * dim + j] = dh_in[i * dim + j] + rs * w[j] * dy[i * dim + j] - rs * rs * rs * h[i * dim + j] * dot / dim;
      r.dw[j] += dy[i * dim + j] * h[i * dim + j] * rs;
    }
  }
  return r;
}

// The residual the kernel stores: the f32 sum rounded to the dtype.
std::vector<double> RoundedSum(const std::vector<double>& x, const std::vector<double>& d, DType t) {
  std::vector<double> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float s = float(x[i]) + float(d[i]);
    h[i] = t == DType::kBF16 ? BFloat16::FromFloat(s).ToFloat() : s;
  }
  return h;
}

struct Case {
  int64_t rows, dim;
  DType dtype;
};

std::string Name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.dim) + "_" + std::string(DTypeName(c.dtype));
}

// Forward + backward on `device` against the double reference. With `in_place`, h is written over x
// and dh over dh_in. With `cfg` (CUDA only), the kernels run with that launch configuration.
void CheckAgainstReference(const Case& c, Device device, double tol, bool in_place,
                           const add_rmsnorm_internal::LaunchConfig* cfg = nullptr) {
  SCOPED_TRACE(Name(c) + " on " + device.ToString() + (in_place ? " in place" : "") +
               (cfg ? " " + cfg->ToString() : std::string()));
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  auto& rng = Rng();
  const Shape shape = {c.rows, c.dim};
  Tensor x = RandomTensor(shape, c.dtype, device, rng, 2.0f);
  Tensor delta = RandomTensor(shape, c.dtype, device, rng, 1.0f);
  Tensor w = RandomTensor({c.dim}, c.dtype, device, rng, 1.0f);
  Tensor dy = RandomTensor(shape, c.dtype, device, rng, 1.0f);
  Tensor dh_in = RandomTensor(shape, c.dtype, device, rng, 1.0f);
  const std::vector<double> hx = ToHost(x), hdelta = ToHost(delta), hw = ToHost(w), hdy = ToHost(dy),
                            hdh_in = ToHost(dh_in);
  Tensor h = in_place ? x : Tensor::Empty(shape, c.dtype, device).value();
  Tensor dh = in_place ? dh_in : Tensor::Empty(shape, c.dtype, device).value();
  Tensor y = Tensor::Empty(shape, c.dtype, device).value();
  Tensor rstd = Tensor::Empty({c.rows}, DType::kF32, device).value();
  Tensor dw = Tensor::Empty({c.dim}, DType::kF32, device).value();
  for (const Tensor* t : {&y, &rstd, &dw}) Poison(*t);
  if (!in_place) {
    Poison(h);
    Poison(dh);
  }

  absl::Status st;
  if (cfg == nullptr) {
    st = AddRmsNormForward(x, delta, w, kEps, h, y, rstd, stream);
    ASSERT_TRUE(st.ok()) << st;
    st = AddRmsNormBackward(dy, dh_in, h, w, rstd, dh, dw, stream);
    ASSERT_TRUE(st.ok()) << st;
  } else {
#ifdef SG_WITH_CUDA
    const add_rmsnorm_internal::Problem p{c.rows, c.dim, c.dtype, kEps};
    auto raw = [](const Tensor& t) { return t.view().raw(); };
    st = add_rmsnorm_internal::ForwardCuda(p, raw(x), raw(delta), raw(w), raw(h), raw(y), rstd.data<float>(),
                                           device.ordinal, stream.native(), *cfg);
    ASSERT_TRUE(st.ok()) << st;
    st = add_rmsnorm_internal::BackwardCuda(p, raw(dy), raw(dh_in), raw(h), raw(w), rstd.data<float>(), raw(dh),
                                            dw.data<float>(), device.ordinal, stream.native(), *cfg);
    ASSERT_TRUE(st.ok()) << st;
#endif
  }
  ASSERT_TRUE(stream.Synchronize().ok());

  Ref ref = DoubleReference(RoundedSum(hx, hdelta, c.dtype), hw, hdy, hdh_in, c.rows, c.dim);
  EXPECT_EQ(MaxAbsError(ToHost(h), ref.h), 0.0) << "h is the rounded sum, exactly";
  EXPECT_LT(RelativeError(ToHost(y), ref.y), tol) << "y";
  EXPECT_LT(RelativeError(ToHost(rstd), ref.rstd), 1e-5) << "rstd";
  EXPECT_LT(RelativeError(ToHost(dh), ref.dh), tol) << "dh";
  EXPECT_LT(RelativeError(ToHost(dw), ref.dw), 1e-4) << "dw";
}

// Tolerances: f32 outputs are f32-rounded results of f32/f64 arithmetic (~1e-6); bf16 outputs carry
// one bf16 rounding (2^-9 relative per element, ~2e-3 in L2). rstd and dw are f32 outputs.
const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 5, DType::kF32},     {3, 7, DType::kF32},     {17, 200, DType::kF32},    {33, 2048, DType::kF32},
      {5, 2056, DType::kF32},  {1, 8, DType::kBF16},    {9, 24, DType::kBF16},     {67, 1000, DType::kBF16},
      {130, 2048, DType::kBF16}, {7, 4096, DType::kBF16}, {3, 4104, DType::kBF16}, {2, 8192, DType::kBF16},
      {5, 333, DType::kBF16},
  };
  return cases;
}

double Tolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

TEST(AddRmsNormCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) CheckAgainstReference(c, Device::Cpu(), Tolerance(c.dtype), false);
}

TEST(AddRmsNormCpuTest, InPlaceResidualUpdate) {
  for (const Case& c : {Case{9, 24, DType::kBF16}, Case{4, 37, DType::kF32}}) {
    CheckAgainstReference(c, Device::Cpu(), Tolerance(c.dtype), true);
  }
}

// L = sum(y * gy) + sum(h * gh) as a function of x (and of delta: h = x + delta, so dL/dx = dL/ddelta
// = dh) and of w, by central differences in f64; against the kernel's analytic gradients (f32 CPU).
TEST(AddRmsNormCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, dim = 11;
  auto& rng = Rng();
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(rows * dim), delta(rows * dim), w(dim), gy(rows * dim), gh(rows * dim);
  for (auto* v : {&x, &delta, &w, &gy, &gh})
    for (double& e : *v) e = u(rng);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& dd, const std::vector<double>& ww) {
    std::vector<double> hh(xx.size());
    for (size_t i = 0; i < hh.size(); ++i) hh[i] = xx[i] + dd[i];
    Ref r = DoubleReference(hh, ww, gy, gh, rows, dim);
    double l = 0;
    for (size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * gy[i] + hh[i] * gh[i];
    return l;
  };
  const Device cpu = Device::Cpu();
  const Shape shape = {rows, dim};
  Tensor tx = FromHost(x, shape, DType::kF32, cpu), td = FromHost(delta, shape, DType::kF32, cpu);
  Tensor tw = FromHost(w, {dim}, DType::kF32, cpu);
  Tensor tgy = FromHost(gy, shape, DType::kF32, cpu), tgh = FromHost(gh, shape, DType::kF32, cpu);
  Tensor h = Tensor::Empty(shape, DType::kF32, cpu).value(), y = Tensor::Empty(shape, DType::kF32, cpu).value();
  Tensor rstd = Tensor::Empty({rows}, DType::kF32, cpu).value();
  Tensor dh = Tensor::Empty(shape, DType::kF32, cpu).value(), dw = Tensor::Empty({dim}, DType::kF32, cpu).value();
  ASSERT_TRUE(AddRmsNormForward(tx, td, tw, kEps, h, y, rstd, Stream::Cpu()).ok());
  ASSERT_TRUE(AddRmsNormBackward(tgy, tgh, h, tw, rstd, dh, dw, Stream::Cpu()).ok());
  const std::vector<double> hdh = ToHost(dh), hdw = ToHost(dw);
  const double eps = 1e-6;
  for (int64_t i = 0; i < rows * dim; ++i) {
    std::vector<double> xp = x, xm = x, dp = delta, dm = delta;
    xp[i] += eps;
    xm[i] -= eps;
    dp[i] += eps;
    dm[i] -= eps;
    EXPECT_NEAR(hdh[i], (loss(xp, delta, w) - loss(xm, delta, w)) / (2 * eps), 1e-4) << "d/dx[" << i << "]";
    EXPECT_NEAR(hdh[i], (loss(x, dp, w) - loss(x, dm, w)) / (2 * eps), 1e-4) << "d/ddelta[" << i << "]";
  }
  for (int64_t j = 0; j < dim; ++j) {
    std::vector<double> wp = w, wm = w;
    wp[j] += eps;
    wm[j] -= eps;
    EXPECT_NEAR(hdw[j], (loss(x, delta, wp) - loss(x, delta, wm)) / (2 * eps), 1e-4) << "dw[" << j << "]";
  }
}

TEST(AddRmsNormCpuTest, BadArgumentsAreNamed) {
  const Device cpu = Device::Cpu();
  auto empty = [&](Shape s, DType t) { return Tensor::Empty(s, t, cpu).value(); };
  Tensor x = empty({4, 8}, DType::kF32), d = empty({4, 9}, DType::kF32), w = empty({8}, DType::kF32);
  Tensor h = empty({4, 8}, DType::kF32), y = empty({4, 8}, DType::kF32), rstd = empty({4}, DType::kF32);
  absl::Status s = AddRmsNormForward(x, d, w, kEps, h, y, rstd, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("delta: expected contiguous f32[4,8]@cpu, found f32[4,9]@cpu"), std::string::npos) << s;
  Tensor d16 = empty({4, 8}, DType::kBF16);
  s = AddRmsNormForward(x, d16, w, kEps, h, y, rstd, Stream::Cpu());
  EXPECT_NE(s.message().find("delta: expected contiguous f32[4,8]@cpu, found bf16[4,8]@cpu"), std::string::npos) << s;
  s = AddRmsNormForward(x, h, w, kEps, h, h, rstd, Stream::Cpu());
  EXPECT_NE(s.message().find("y must not alias"), std::string::npos) << s;
  Tensor dw = empty({7}, DType::kF32);
  s = AddRmsNormBackward(y, y, h, w, rstd, x, dw, Stream::Cpu());
  EXPECT_NE(s.message().find("dweight: expected contiguous f32[8]@cpu, found f32[7]@cpu"), std::string::npos) << s;
}

TEST(AddRmsNormCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) CheckAgainstReference(c, Device::Cuda(0), Tolerance(c.dtype), false);
  CheckAgainstReference({9, 24, DType::kBF16}, Device::Cuda(0), 1e-2, true);
  CheckAgainstReference({4, 37, DType::kF32}, Device::Cuda(0), 1e-5, true);
  CheckAgainstReference({16384, 2048, DType::kBF16}, Device::Cuda(0), 1e-2, false);  // the Llama-1B shape
}

// AddRmsNormStatsForward is AddRmsNormForward without y: the same h and rstd, bit for bit, on the
// vector path (dim a multiple of 8) and the general one, and no byte of the poisoned y touched.
void CheckStatsMatchForward(const Device& dev) {
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  auto& rng = Rng();
  for (const auto& [rows, dim] : {std::tuple<int64_t, int64_t>{64, 2048}, {9, 37}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(dim));
    Tensor x = RandomTensor({rows, dim}, DType::kBF16, dev, rng);
    Tensor delta = RandomTensor({rows, dim}, DType::kBF16, dev, rng);
    Tensor w = RandomTensor({dim}, DType::kBF16, dev, rng);
    auto empty = [&](Shape s, DType t) {
      Tensor e = Tensor::Empty(s, t, dev).value();
      Poison(e);
      return e;
    };
    Tensor h = empty({rows, dim}, DType::kBF16), y = empty({rows, dim}, DType::kBF16), r = empty({rows}, DType::kF32);
    Tensor h2 = empty({rows, dim}, DType::kBF16), r2 = empty({rows}, DType::kF32);
    ASSERT_TRUE(AddRmsNormForward(x, delta, w, 1e-5f, h, y, r, stream).ok());
    const absl::Status s = AddRmsNormStatsForward(x, delta, 1e-5f, h2, r2, stream);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(stream.Synchronize().ok());
    const std::vector<double> hw = ToHost(h), hg = ToHost(h2), rw = ToHost(r), rg = ToHost(r2);
    EXPECT_EQ(hg, hw);
    EXPECT_EQ(rg, rw);
    for (const double v : rw) ASSERT_GT(v, 0.0);  // written (the poison fails this), never all zeros
  }
}

TEST(AddRmsNormCpuTest, StatsForwardMatchesForward) { CheckStatsMatchForward(Device::Cpu()); }
TEST(AddRmsNormCudaTest, StatsForwardMatchesForward) {
  SG_SKIP_WITHOUT_CUDA();
  CheckStatsMatchForward(Device::Cuda(0));
}

// The weight gradient is reduced in a fixed order: two runs give identical bits.
// Every launch layout of the shared RMSNorm kernels with the add and the residual gradient switched
// on (see RmsNormCudaTest.EveryLaunchConfigMatchesReference for how the widths reach each layout),
// out of place and in place.
TEST(AddRmsNormCudaTest, EveryLaunchConfigMatchesReference) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<add_rmsnorm_internal::LaunchConfig> configs = {
      {256, 4, 0, 0}, {32, 1, 0, 1}, {32, 4, 2, 8}, {64, 2, 1, 2}, {128, 4, 0, 4}, {512, 2, 8, 1}, {512, 4, 0, 3},
      {256, 4, 0, 0, true}, {32, 2, 0, 8, true},
  };
  const std::vector<Case> cases = {
      {37, 256, DType::kBF16},  {130, 512, DType::kBF16}, {259, 1000, DType::kBF16}, {1031, 2048, DType::kBF16},
      {66, 4096, DType::kBF16}, {2, 16384, DType::kBF16}, {9, 16392, DType::kBF16},  {41, 256, DType::kF32},
      {67, 1000, DType::kF32},  {6, 8192, DType::kF32},   {3, 8200, DType::kF32},
  };
  // Both kernels as programmatic dependent launches, or neither (the defaults launch the forward
  // that way and the partial-row sum as a dependent of the backward).
  for (bool pdl : {false, true}) {
    add_rmsnorm_internal::LaunchConfig c;
    c.max_threads = pdl ? 128 : 64;
    c.rows_per_step = 2;
    c.fwd_pdl = c.bwd_pdl = c.overlap_sum = pdl;
    configs.push_back(c);
  }
  for (auto cfg : configs) {
    cfg.fwd_max_threads = cfg.max_threads;  // the forward takes the same shapes
    cfg.fwd_rows_per_step = cfg.rows_per_step;
    for (bool prefetch : {false, true}) {  // register double buffering (persistent forward CTAs only)
      cfg.fwd_prefetch = cfg.bwd_prefetch = prefetch;
      for (const Case& c : cases) {
        for (bool in_place : {false, true}) CheckAgainstReference(c, Device::Cuda(0), Tolerance(c.dtype), in_place, &cfg);
      }
    }
  }
}

TEST(AddRmsNormCudaTest, WeightGradientIsDeterministic) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  auto& rng = Rng();
  const Shape shape = {4099, 2048};
  Tensor x = RandomTensor(shape, DType::kBF16, d, rng), delta = RandomTensor(shape, DType::kBF16, d, rng);
  Tensor w = RandomTensor({2048}, DType::kBF16, d, rng);
  Tensor dy = RandomTensor(shape, DType::kBF16, d, rng), dh_in = RandomTensor(shape, DType::kBF16, d, rng);
  Tensor h = Tensor::Empty(shape, DType::kBF16, d).value(), y = Tensor::Empty(shape, DType::kBF16, d).value();
  Tensor rstd = Tensor::Empty({4099}, DType::kF32, d).value();
  Tensor dh = Tensor::Empty(shape, DType::kBF16, d).value();
  Tensor dw1 = Tensor::Empty({2048}, DType::kF32, d).value(), dw2 = Tensor::Empty({2048}, DType::kF32, d).value();
  ASSERT_TRUE(AddRmsNormForward(x, delta, w, kEps, h, y, rstd, s).ok());
  ASSERT_TRUE(AddRmsNormBackward(dy, dh_in, h, w, rstd, dh, dw1, s).ok());
  ASSERT_TRUE(AddRmsNormBackward(dy, dh_in, h, w, rstd, dh, dw2, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(ToHost(dw1), ToHost(dw2));
}

TEST(AddRmsNormCudaTest, CudaTensorsWithoutCudaBuildFail) {
#ifdef SG_WITH_CUDA
  GTEST_SKIP() << "built with CUDA";
#else
  void* p = reinterpret_cast<void*>(0x100);
  TensorView x(p, DType::kF32, {2, 8}, Device::Cuda(0)), w(p, DType::kF32, {8}, Device::Cuda(0));
  TensorView r(p, DType::kF32, {2}, Device::Cuda(0));
  TensorView y(reinterpret_cast<void*>(0x200), DType::kF32, {2, 8}, Device::Cuda(0));
  EXPECT_EQ(AddRmsNormForward(x, x, w, kEps, x, y, r, Stream::Cpu()).code(), absl::StatusCode::kFailedPrecondition);
#endif
}

}  // namespace
}  // namespace sg::kernels
