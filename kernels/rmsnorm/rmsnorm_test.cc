// RMSNorm against independent references: a plain double loop (forward and analytic backward),
// central finite differences of a random projection of the output (backward), and the CPU reference
// for the CUDA kernels. Fresh random inputs every run; outputs poisoned before each kernel.
#include <cmath>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm_internal.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

constexpr float kEps = 1e-5f;

struct Ref {
  std::vector<double> y, rstd, dx, dw;
};

// Double-precision forward and backward written straight from the definition.
Ref DoubleReference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& dy,
                    int64_t rows, int64_t dim) {
  Ref r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.rstd.resize(size_t(rows));
  r.dw.assign(size_t(dim), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += x[i * dim + j] * x[i * dim + j];
    const double rs = 1.0 / std::sqrt(ss / dim + kEps);
    r.rstd[i] = rs;
    double dot = 0;
    for (int64_t j = 0; j < dim; ++j) {
      r.y[i * dim + j] = x[i * dim + j] * rs * w[j];
      dot += dy[i * dim + j] * w[j] * x[i * dim + j];
    }
    for (int64_t j = 0; j < dim; ++j) {
      r.dx[i * dim + j] = rs * w[j] * dy[i * dim + j] - rs * rs * rs * x[i * dim + j] * dot / dim;
      r.dw[j] += dy[i * dim + j] * x[i * dim + j] * rs;
    }
  }
  return r;
}

struct Case {
  int64_t rows, dim;
  DType dtype;
};

std::string Name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.dim) + "_" + std::string(DTypeName(c.dtype));
}

// Runs forward + backward on `device` and checks them against the double reference. With `cfg`
// (CUDA only), the kernels run with that launch configuration instead of the default one.
void CheckAgainstReference(const Case& c, Device device, double tol,
                           const rmsnorm_internal::LaunchConfig* cfg = nullptr) {
  SCOPED_TRACE(Name(c) + " on " + device.ToString() + (cfg ? " " + cfg->ToString() : std::string()));
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  auto& rng = Rng();
  Tensor x = RandomTensor({c.rows, c.dim}, c.dtype, device, rng, 2.0f);
  Tensor w = RandomTensor({c.dim}, c.dtype, device, rng, 1.0f);
  Tensor dy = RandomTensor({c.rows, c.dim}, c.dtype, device, rng, 1.0f);
  Tensor y = Tensor::Empty(x.shape(), c.dtype, device).value();
  Tensor rstd = Tensor::Empty({c.rows}, DType::kF32, device).value();
  Tensor dx = Tensor::Empty(x.shape(), c.dtype, device).value();
  Tensor dw = Tensor::Empty({c.dim}, DType::kF32, device).value();
  for (const Tensor* t : {&y, &rstd, &dx, &dw}) Poison(*t);

  if (cfg == nullptr) {
    ASSERT_TRUE(RmsNormForward(x, w, kEps, y, rstd, stream).ok());
    ASSERT_TRUE(RmsNormBackward(dy, x, w, rstd, dx, dw, stream).ok());
  } else {
#ifdef SG_WITH_CUDA
    const rmsnorm_internal::Problem p{c.rows, c.dim, c.dtype, kEps};
    auto raw = [](const Tensor& t) { return t.view().raw(); };
    ASSERT_TRUE(rmsnorm_internal::ForwardCuda(p, raw(x), raw(w), raw(y), rstd.data<float>(), device.ordinal,
                                              stream.native(), *cfg)
                    .ok());
    ASSERT_TRUE(rmsnorm_internal::BackwardCuda(p, raw(dy), raw(x), raw(w), rstd.data<float>(), raw(dx),
                                               dw.data<float>(), device.ordinal, stream.native(), *cfg)
                    .ok());
#endif
  }
  ASSERT_TRUE(stream.Synchronize().ok());

  // The reference sees the same (rounded) inputs the kernel saw.
  Ref ref = DoubleReference(ToHost(x), ToHost(w), ToHost(dy), c.rows, c.dim);
  EXPECT_LT(RelativeError(ToHost(y), ref.y), tol) << "y";
  EXPECT_LT(RelativeError(ToHost(rstd), ref.rstd), 1e-5) << "rstd";
  EXPECT_LT(RelativeError(ToHost(dx), ref.dx), tol) << "dx";
  EXPECT_LT(RelativeError(ToHost(dw), ref.dw), 1e-4) << "dw";
}

// Tolerances: f32 outputs are f32-rounded results of an f64-accumulated computation (~1e-6);
// bf16 outputs carry bf16 rounding (2^-9 relative per element, ~3e-3 in L2).
const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 5, DType::kF32},    {3, 7, DType::kF32},     {17, 200, DType::kF32}, {33, 2048, DType::kF32},
      {5, 2056, DType::kF32}, {1, 8, DType::kBF16},    {9, 24, DType::kBF16},  {67, 1000, DType::kBF16},
      {130, 2048, DType::kBF16}, {7, 4096, DType::kBF16}, {3, 4104, DType::kBF16}, {2, 8192, DType::kBF16},
  };
  return cases;
}

double Tolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

TEST(RmsNormCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) CheckAgainstReference(c, Device::Cpu(), Tolerance(c.dtype));
}

// d/dx and d/dw of L = sum(y * g) for a random g, by central differences in f64 around f32 inputs.
TEST(RmsNormCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, dim = 11;
  auto& rng = Rng();
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(rows * dim), w(dim), g(rows * dim);
  for (auto* v : {&x, &w, &g})
    for (double& e : *v) e = u(rng);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    Ref r = DoubleReference(xx, ww, g, rows, dim);
    double l = 0;
    for (size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * g[i];
    return l;
  };
  // The kernel's analytic gradients (f32 CPU path) must match the numeric ones.
  Tensor tx = FromHost(x, {rows, dim}, DType::kF32, Device::Cpu());
  Tensor tw = FromHost(w, {dim}, DType::kF32, Device::Cpu());
  Tensor tg = FromHost(g, {rows, dim}, DType::kF32, Device::Cpu());
  Tensor y = Tensor::Empty({rows, dim}, DType::kF32, Device::Cpu()).value();
  Tensor rstd = Tensor::Empty({rows}, DType::kF32, Device::Cpu()).value();
  Tensor dx = Tensor::Empty({rows, dim}, DType::kF32, Device::Cpu()).value();
  Tensor dw = Tensor::Empty({dim}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(RmsNormForward(tx, tw, kEps, y, rstd, Stream::Cpu()).ok());
  ASSERT_TRUE(RmsNormBackward(tg, tx, tw, rstd, dx, dw, Stream::Cpu()).ok());
  std::vector<double> hx = ToHost(dx), hw = ToHost(dw);
  const double h = 1e-6;
  for (int64_t i = 0; i < rows * dim; ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    EXPECT_NEAR(hx[i], (loss(xp, w) - loss(xm, w)) / (2 * h), 1e-4) << "dx[" << i << "]";
  }
  for (int64_t j = 0; j < dim; ++j) {
    std::vector<double> wp = w, wm = w;
    wp[j] += h;
    wm[j] -= h;
    EXPECT_NEAR(hw[j], (loss(x, wp) - loss(x, wm)) / (2 * h), 1e-4) << "dw[" << j << "]";
  }
}

TEST(RmsNormCpuTest, BadArgumentsAreNamed) {
  Tensor x = Tensor::Empty({4, 8}, DType::kF32, Device::Cpu()).value();
  Tensor w = Tensor::Empty({9}, DType::kF32, Device::Cpu()).value();
  Tensor y = Tensor::Empty({4, 8}, DType::kF32, Device::Cpu()).value();
  Tensor rstd = Tensor::Empty({4}, DType::kF32, Device::Cpu()).value();
  absl::Status s = RmsNormForward(x, w, kEps, y, rstd, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("weight: expected contiguous f32[8]@cpu, found f32[9]@cpu"), std::string::npos) << s;
  Tensor xi = Tensor::Empty({4, 8}, DType::kI32, Device::Cpu()).value();
  EXPECT_EQ(RmsNormForward(xi, w, kEps, y, rstd, Stream::Cpu()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RmsNormCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) CheckAgainstReference(c, Device::Cuda(0), Tolerance(c.dtype));
  CheckAgainstReference({16384, 2048, DType::kBF16}, Device::Cuda(0), 1e-2);  // the Llama-1B shape
}

// Every launch layout the kernels support (packs per thread 1, 2, 4; rows per step 1, 2, 4; one
// CTA per step or persistent CTAs; 1 to 8 partial weight-gradient rows per SM; the partial-row sum
// launched normally or as a programmatic dependent launch), on widths that
// reach each of them (32 threads: 256 bf16 = 1 pack per thread, 512 = 2, 1000 = 4; wider rows
// raise the thread count) and row counts that leave partial steps and partial CTA runs.
TEST(RmsNormCudaTest, EveryLaunchConfigMatchesReference) {
  SG_SKIP_WITHOUT_CUDA();
  std::vector<rmsnorm_internal::LaunchConfig> configs = {
      {256, 4, 0, 0}, {32, 1, 0, 1}, {32, 4, 2, 8}, {64, 2, 1, 2}, {128, 4, 0, 4}, {512, 2, 8, 1}, {512, 4, 0, 3},
      {256, 4, 0, 0, true}, {32, 2, 0, 8, true},
  };
  const std::vector<Case> cases = {
      {37, 256, DType::kBF16},  {130, 512, DType::kBF16},  {259, 1000, DType::kBF16}, {3, 2048, DType::kBF16},
      {1031, 2048, DType::kBF16}, {66, 4096, DType::kBF16}, {5, 8192, DType::kBF16},   {2, 16384, DType::kBF16},
      {9, 16392, DType::kBF16}, {41, 256, DType::kF32},     {67, 1000, DType::kF32},   {130, 2048, DType::kF32},
      {6, 8192, DType::kF32},   {3, 8200, DType::kF32},
  };
  // Both kernels as programmatic dependent launches, or neither (the defaults launch the forward
  // that way and the partial-row sum as a dependent of the backward).
  for (bool pdl : {false, true}) {
    rmsnorm_internal::LaunchConfig c;
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
      for (const Case& c : cases) CheckAgainstReference(c, Device::Cuda(0), Tolerance(c.dtype), &cfg);
    }
  }
}

// A row start that is not 16-byte aligned (a view one element into a buffer) takes the general
// path, which must give the same results.
TEST(RmsNormCudaTest, UnalignedViewsMatchReference) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream stream = Stream::Create(d).value();
  const int64_t rows = 33, dim = 256;
  auto& rng = Rng();
  Tensor xb = RandomTensor({rows * dim + 1}, DType::kBF16, d, rng, 2.0f);
  Tensor w = RandomTensor({dim}, DType::kBF16, d, rng);
  Tensor dy = RandomTensor({rows, dim}, DType::kBF16, d, rng);
  TensorView x(static_cast<char*>(xb.view().raw()) + 2, DType::kBF16, {rows, dim}, d);
  Tensor y = Tensor::Empty({rows, dim}, DType::kBF16, d).value();
  Tensor rstd = Tensor::Empty({rows}, DType::kF32, d).value();
  Tensor dx = Tensor::Empty({rows, dim}, DType::kBF16, d).value();
  Tensor dw = Tensor::Empty({dim}, DType::kF32, d).value();
  for (const Tensor* t : {&y, &rstd, &dx, &dw}) Poison(*t);
  ASSERT_TRUE(RmsNormForward(x, w, kEps, y, rstd, stream).ok());
  ASSERT_TRUE(RmsNormBackward(dy, x, w, rstd, dx, dw, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  Ref ref = DoubleReference(ToHost(x), ToHost(w), ToHost(dy), rows, dim);
  EXPECT_LT(RelativeError(ToHost(y), ref.y), 1e-2) << "y";
  EXPECT_LT(RelativeError(ToHost(dx), ref.dx), 1e-2) << "dx";
  EXPECT_LT(RelativeError(ToHost(dw), ref.dw), 1e-4) << "dw";
}

// The weight gradient is reduced in a fixed order: two runs give identical bits.
TEST(RmsNormCudaTest, WeightGradientIsDeterministic) {
  SG_SKIP_WITHOUT_CUDA();
  const Device d = Device::Cuda(0);
  Stream s = Stream::Create(d).value();
  auto& rng = Rng();
  Tensor x = RandomTensor({4099, 2048}, DType::kBF16, d, rng);
  Tensor w = RandomTensor({2048}, DType::kBF16, d, rng);
  Tensor dy = RandomTensor({4099, 2048}, DType::kBF16, d, rng);
  Tensor y = Tensor::Empty(x.shape(), DType::kBF16, d).value();
  Tensor rstd = Tensor::Empty({4099}, DType::kF32, d).value();
  Tensor dx = Tensor::Empty(x.shape(), DType::kBF16, d).value();
  Tensor dw1 = Tensor::Empty({2048}, DType::kF32, d).value();
  Tensor dw2 = Tensor::Empty({2048}, DType::kF32, d).value();
  ASSERT_TRUE(RmsNormForward(x, w, kEps, y, rstd, s).ok());
  ASSERT_TRUE(RmsNormBackward(dy, x, w, rstd, dx, dw1, s).ok());
  ASSERT_TRUE(RmsNormBackward(dy, x, w, rstd, dx, dw2, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(ToHost(dw1), ToHost(dw2));
}

TEST(RmsNormCudaTest, CudaTensorsWithoutCudaBuildFail) {
#ifdef SG_WITH_CUDA
  GTEST_SKIP() << "built with CUDA";
#else
  TensorView x(reinterpret_cast<void*>(0x100), DType::kF32, {2, 8}, Device::Cuda(0));
  TensorView w(reinterpret_cast<void*>(0x100), DType::kF32, {8}, Device::Cuda(0));
  TensorView r(reinterpret_cast<void*>(0x100), DType::kF32, {2}, Device::Cuda(0));
  EXPECT_EQ(RmsNormForward(x, w, kEps, x, r, Stream::Cpu()).code(), absl::StatusCode::kFailedPrecondition);
#endif
}

}  // namespace
}  // namespace sg::kernels
