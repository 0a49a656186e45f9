// Fused RMSNorm + GEMM against the unfused definition, out = (x * rstd * w_norm) @ W^T, written as a
// double loop with its textbook backward (dY = dout W, dx = RMSNorm backward of dY, dW = dout^T Y,
// dw_norm = sum dY * xhat): a different algebra from the fused code's (folded W', row scale, G).
// Also central finite differences in f64 of sum(out * gout), on the CPU; CUDA against the same
// double reference, with each forward GEMM (cuBLASLt epilogue, row-scale pass, the wgmma kernel,
// which takes the Llama-like shapes and falls back to cuBLASLt on the odd ones). Fresh random
// inputs; outputs poisoned; odd sizes.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_rmsnorm/gemm_rmsnorm.h"
#include "kernels/wgmma_gemm/wgmma_gemm.h"

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
  std::vector<double> out, rstd, dx, dw, dg;
};

// x [m,k], w [n,k], g [k], dout [m,n].
Ref DoubleReference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& g,
                    const std::vector<double>& dout, int64_t m, int64_t k, int64_t n) {
  Ref r;
  r.rstd.resize(size_t(m));
  std::vector<double> y(size_t(m * k)), dy(size_t(m * k), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < k; ++j) ss += x[i * k + j] * x[i * k + j];
    r.rstd[i] = 1.0 / std::sqrt(ss / k + kEps);
    for (int64_t j = 0; j < k; ++j) y[i * k + j] = x[i * k + j] * r.rstd[i] * g[j];
  }
  r.out.assign(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < n; ++o)
      for (int64_t j = 0; j < k; ++j) r.out[i * n + o] += y[i * k + j] * w[o * k + j];
  if (dout.empty()) return r;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < n; ++o)
      for (int64_t j = 0; j < k; ++j) dy[i * k + j] += dout[i * n + o] * w[o * k + j];
  r.dw.assign(size_t(n * k), 0.0);
  for (int64_t o = 0; o < n; ++o)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) r.dw[o * k + j] += dout[i * n + o] * y[i * k + j];
  r.dx.resize(size_t(m * k));
  r.dg.assign(size_t(k), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    const double rs = r.rstd[i];
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += dy[i * k + j] * g[j] * x[i * k + j];
    for (int64_t j = 0; j < k; ++j) {
      r.dx[i * k + j] = rs * g[j] * dy[i * k + j] - rs * rs * rs * x[i * k + j] * dot / k;
      r.dg[j] += dy[i * k + j] * x[i * k + j] * rs;
    }
  }
  return r;
}

struct Case {
  int64_t m, k, n;
  DType dtype;
};

struct Tol {
  double out, dx, dw, dg;
};

// f32: f32 GEMMs over k <= ~2048 terms and f32 elementwise (~1e-6..1e-5). bf16: W' = W * w_norm is
// rounded to bf16 once, the output once, and the backward's dz and xhat intermediates once each
// (2^-9 relative per element, a few 1e-3 in L2; dx loses a little more to the mean subtraction).
Tol TolFor(DType t) { return t == DType::kF32 ? Tol{2e-5, 1e-4, 2e-5, 1e-4} : Tol{1e-2, 2e-2, 1e-2, 2e-2}; }

const char* GemmName(GemmRmsNormGemm g) {
  switch (g) {
    case GemmRmsNormGemm::kFromEnv: return " (gemm from env)";
    case GemmRmsNormGemm::kCublasEpilogue: return " (cuBLASLt epilogue)";
    case GemmRmsNormGemm::kRowScalePass: return " (row-scale pass)";
    case GemmRmsNormGemm::kWgmma: return " (wgmma)";
  }
  return "";
}

void CheckAgainstReference(const Case& c, Device dev, GemmRmsNormGemm gemm, bool rstd_given = false) {
  SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.k) + "->" + std::to_string(c.n) + " " +
               std::string(DTypeName(c.dtype)) + " on " + dev.ToString() + GemmName(gemm) +
               (rstd_given ? " (rstd given)" : ""));
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  auto& rng = Rng();
  Tensor x = RandomTensor({c.m, c.k}, c.dtype, dev, rng, 2.0f);
  Tensor w = RandomTensor({c.n, c.k}, c.dtype, dev, rng, 1.0f);
  std::vector<double> gv(size_t(c.k));
  std::uniform_real_distribution<double> u(0.5, 1.5);  // norm weights near 1, as trained ones are
  for (double& v : gv) v = u(rng);
  Tensor g = FromHost(gv, {c.k}, c.dtype, dev);
  Tensor dout = RandomTensor({c.m, c.n}, c.dtype, dev, rng, 1.0f);
  Ref ref = DoubleReference(ToHost(x), ToHost(w), ToHost(g), ToHost(dout), c.m, c.k, c.n);

  Tensor wf = Tensor::Empty({c.n, c.k}, c.dtype, dev).value();
  Tensor out = Tensor::Empty({c.m, c.n}, c.dtype, dev).value();
  Tensor rstd = rstd_given ? FromHost(ref.rstd, {c.m}, DType::kF32, dev) : Tensor::Empty({c.m}, DType::kF32, dev).value();
  Tensor dx = Tensor::Empty({c.m, c.k}, c.dtype, dev).value();
  Tensor dw = Tensor::Empty({c.n, c.k}, DType::kF32, dev).value();
  Tensor dg = Tensor::Empty({c.k}, DType::kF32, dev).value();
  for (const Tensor* t : {&wf, &out, &dx, &dw, &dg}) Poison(*t);
  if (!rstd_given) Poison(rstd);

  GemmRmsNormOptions opts;
  opts.gemm = gemm;
  opts.rstd_given = rstd_given;
  absl::Status st = GemmRmsNormFoldWeight(w, g, wf, stream);
  ASSERT_TRUE(st.ok()) << st;
  st = GemmRmsNormForward(x, wf, kEps, out, rstd, stream, opts);
  ASSERT_TRUE(st.ok()) << st;
  st = GemmRmsNormBackward(dout, x, w, g, wf, rstd, dx, dw, dg, stream);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(stream.Synchronize().ok());

  const Tol tol = TolFor(c.dtype);
  EXPECT_LT(RelativeError(ToHost(rstd), ref.rstd), 1e-5) << "rstd";
  EXPECT_LT(RelativeError(ToHost(out), ref.out), tol.out) << "out";
  EXPECT_LT(RelativeError(ToHost(dx), ref.dx), tol.dx) << "dx";
  EXPECT_LT(RelativeError(ToHost(dw), ref.dw), tol.dw) << "dw";
  EXPECT_LT(RelativeError(ToHost(dg), ref.dg), tol.dg) << "dw_norm";
}

// K >= 3: with K = 1 the norm is sign(x), dx is ~eps/x^2 and its relative error is pure cancellation.
const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 3, 1, DType::kF32},    {7, 13, 5, DType::kF32},     {33, 64, 24, DType::kF32}, {65, 130, 71, DType::kF32},
      {9, 16, 8, DType::kBF16},  {33, 40, 24, DType::kBF16},  {19, 96, 50, DType::kBF16}, {70, 200, 129, DType::kBF16},
      {5, 37, 11, DType::kBF16},
  };
  return cases;
}

TEST(GemmRmsNormCpuTest, MatchesUnfusedDoubleReference) {
  for (const Case& c : Cases()) CheckAgainstReference(c, Device::Cpu(), GemmRmsNormGemm::kCublasEpilogue);
  CheckAgainstReference({21, 48, 30, DType::kBF16}, Device::Cpu(), GemmRmsNormGemm::kWgmma, /*rstd_given=*/true);
}

// d/dx, d/dW, d/dw_norm of L = sum(out * gout) by central differences in f64 around f32 inputs,
// against the kernel's analytic gradients (f32 CPU path).
TEST(GemmRmsNormCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t m = 3, k = 7, n = 5;
  auto& rng = Rng();
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(m * k), w(n * k), g(k), gout(m * n);
  for (auto* v : {&x, &w, &g, &gout})
    for (double& e : *v) e = float(u(rng));  // representable in f32: the kernel sees the same point
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww, const std::vector<double>& gg) {
    Ref r = DoubleReference(xx, ww, gg, {}, m, k, n);
    double l = 0;
    for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * gout[i];
    return l;
  };
  const Device cpu = Device::Cpu();
  const DType f32 = DType::kF32;
  Tensor tx = FromHost(x, {m, k}, f32, cpu), tw = FromHost(w, {n, k}, f32, cpu), tg = FromHost(g, {k}, f32, cpu);
  Tensor tgo = FromHost(gout, {m, n}, f32, cpu);
  Tensor wf = Tensor::Empty({n, k}, f32, cpu).value(), out = Tensor::Empty({m, n}, f32, cpu).value();
  Tensor rstd = Tensor::Empty({m}, f32, cpu).value(), dx = Tensor::Empty({m, k}, f32, cpu).value();
  Tensor dw = Tensor::Empty({n, k}, f32, cpu).value(), dg = Tensor::Empty({k}, f32, cpu).value();
  ASSERT_TRUE(GemmRmsNormFoldWeight(tw, tg, wf, Stream::Cpu()).ok());
  ASSERT_TRUE(GemmRmsNormForward(tx, wf, kEps, out, rstd, Stream::Cpu()).ok());
  ASSERT_TRUE(GemmRmsNormBackward(tgo, tx, tw, tg, wf, rstd, dx, dw, dg, Stream::Cpu()).ok());
  const std::vector<double> hdx = ToHost(dx), hdw = ToHost(dw), hdg = ToHost(dg);
  const double h = 1e-6;
  auto numeric = [&](std::vector<double> xx, std::vector<double> ww, std::vector<double> gg, std::vector<double>* which,
                     size_t i) {
    std::vector<double>* target = which == &x ? &xx : which == &w ? &ww : &gg;
    const double keep = (*target)[i];
    (*target)[i] = keep + h;
    const double lp = loss(xx, ww, gg);
    (*target)[i] = keep - h;
    const double lm = loss(xx, ww, gg);
    return (lp - lm) / (2 * h);
  };
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(hdx[i], numeric(x, w, g, &x, i), 1e-4) << "dx[" << i << "]";
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(hdw[i], numeric(x, w, g, &w, i), 1e-4) << "dw[" << i << "]";
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(hdg[i], numeric(x, w, g, &g, i), 1e-4) << "dw_norm[" << i << "]";
}

// SG_GEMM_RMSNORM picks the GEMM when options.gemm is kFromEnv; a bad value is an error naming it.
TEST(GemmRmsNormCpuTest, GemmFromEnvironment) {
  const char* saved = std::getenv("SG_GEMM_RMSNORM");
  const std::string keep = saved == nullptr ? "" : saved;
  const Device cpu = Device::Cpu();
  Tensor x = RandomTensor({4, 8}, DType::kF32, cpu, Rng()), wf = RandomTensor({6, 8}, DType::kF32, cpu, Rng());
  Tensor out = Tensor::Empty({4, 6}, DType::kF32, cpu).value(), rstd = Tensor::Empty({4}, DType::kF32, cpu).value();
  setenv("SG_GEMM_RMSNORM", "fast", 1);
  absl::Status s = GemmRmsNormForward(x, wf, kEps, out, rstd, Stream::Cpu());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("SG_GEMM_RMSNORM: expected cublas_epilogue, pass or wgmma (or unset), found 'fast'"),
            std::string::npos)
      << s;
  for (const char* v : {"wgmma", "pass", "cublas_epilogue", ""}) {
    setenv("SG_GEMM_RMSNORM", v, 1);
    EXPECT_TRUE(GemmRmsNormForward(x, wf, kEps, out, rstd, Stream::Cpu()).ok()) << v;
  }
  if (saved == nullptr) {
    unsetenv("SG_GEMM_RMSNORM");
  } else {
    setenv("SG_GEMM_RMSNORM", keep.c_str(), 1);
  }
}

TEST(GemmRmsNormCpuTest, BadArgumentsAreNamed) {
  const Device cpu = Device::Cpu();
  auto empty = [&](Shape s, DType t) { return Tensor::Empty(s, t, cpu).value(); };
  Tensor x = empty({4, 8}, DType::kF32), wf = empty({6, 9}, DType::kF32), out = empty({4, 6}, DType::kF32);
  Tensor rstd = empty({4}, DType::kF32);
  absl::Status s = GemmRmsNormForward(x, wf, kEps, out, rstd, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("w_folded must be [N, 8] to match x f32[4,8]@cpu, found f32[6,9]@cpu"), std::string::npos)
      << s;
  Tensor w = empty({6, 8}, DType::kF32), out_bad = empty({4, 7}, DType::kF32);
  s = GemmRmsNormForward(x, w, kEps, out_bad, rstd, Stream::Cpu());
  EXPECT_NE(s.message().find("out: expected contiguous f32[4,6]@cpu, found f32[4,7]@cpu"), std::string::npos) << s;
  Tensor g16 = empty({8}, DType::kBF16);
  s = GemmRmsNormFoldWeight(w, g16, w, Stream::Cpu());
  EXPECT_NE(s.message().find("w_norm: expected contiguous f32[8]@cpu, found bf16[8]@cpu"), std::string::npos) << s;
  Tensor g = empty({8}, DType::kF32), dw16 = empty({6, 8}, DType::kBF16), dg = empty({8}, DType::kF32);
  Tensor dx = empty({4, 8}, DType::kF32);
  s = GemmRmsNormBackward(out, x, w, g, w, rstd, dx, dw16, dg, Stream::Cpu());
  EXPECT_NE(s.message().find("dw: expected contiguous f32[6,8]@cpu, found bf16[6,8]@cpu"), std::string::npos) << s;
}

TEST(GemmRmsNormCudaTest, MatchesUnfusedDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (GemmRmsNormGemm gemm :
       {GemmRmsNormGemm::kCublasEpilogue, GemmRmsNormGemm::kRowScalePass, GemmRmsNormGemm::kWgmma}) {
    for (const Case& c : Cases()) CheckAgainstReference(c, Device::Cuda(0), gemm);
    CheckAgainstReference({256, 2048, 768, DType::kBF16}, Device::Cuda(0), gemm);  // the Llama-1B hidden size
  }
  CheckAgainstReference({21, 48, 30, DType::kBF16}, Device::Cuda(0), GemmRmsNormGemm::kCublasEpilogue,
                        /*rstd_given=*/true);
  // Shapes the wgmma kernel takes (M % 128, N % 256, K % 64), with and without a given rstd.
  CheckAgainstReference({384, 1024, 512, DType::kBF16}, Device::Cuda(0), GemmRmsNormGemm::kWgmma);
  CheckAgainstReference({128, 64, 256, DType::kBF16}, Device::Cuda(0), GemmRmsNormGemm::kWgmma, /*rstd_given=*/true);
}

// With kWgmma on a shape the kernel covers, the forward's output is WgmmaGemm's, bit for bit: the
// option reaches the kernel rather than falling back to cuBLASLt unnoticed.
TEST(GemmRmsNormCudaTest, WgmmaOptionRunsTheWgmmaKernel) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s = Stream::Create(dev).value();
  const int64_t m = 256, k = 512, n = 512;
  const DType t = DType::kBF16;
  Tensor x = RandomTensor({m, k}, t, dev, Rng()), wf = RandomTensor({n, k}, t, dev, Rng());
  Tensor out = Tensor::Empty({m, n}, t, dev).value(), direct = Tensor::Empty({m, n}, t, dev).value();
  Tensor rstd = Tensor::Empty({m}, DType::kF32, dev).value();
  Poison(out);
  Poison(direct);
  GemmRmsNormOptions opts;
  opts.gemm = GemmRmsNormGemm::kWgmma;
  ASSERT_TRUE(GemmRmsNormForward(x, wf, kEps, out, rstd, s, opts).ok());
  const absl::Status st = WgmmaGemm(x, wf, rstd.view(), direct, s);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(s.Synchronize().ok());
  const std::vector<double> a = ToHost(out), b = ToHost(direct);
  EXPECT_EQ(a, b);
  EXPECT_EQ(RelativeError(a, b), 0.0);  // and neither is NaN (poison)
}

// The Llama block's sequence, residual add -> RMSNorm -> Linear, both ways: unfused (AddRmsNormForward
// writes h, y and rstd; the GEMM reads y) and fused (AddRmsNormStatsForward writes h and rstd only;
// the GEMM reads h with the folded weight and rstd as its row scale). The two round differently (y
// and w_folded are bf16), so they agree to bf16 accuracy, not bit for bit; with rstd misapplied (or
// the norm weight not folded) they would differ by O(1). `variant`: SG_WGMMA_GEMM_VARIANT, or null.
void CheckBlockFusedMatchesUnfused(const Device& dev, int64_t m, int64_t k, int64_t n, GemmRmsNormGemm gemm,
                                   const char* variant) {
  SCOPED_TRACE(std::string(dev.ToString()) + " " + std::to_string(m) + "x" + std::to_string(n) + "x" +
               std::to_string(k) + (variant != nullptr ? std::string(" variant ") + variant : std::string()));
  Stream s = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  const DType t = DType::kBF16;
  auto& rng = Rng();
  Tensor x = RandomTensor({m, k}, t, dev, rng), delta = RandomTensor({m, k}, t, dev, rng);
  Tensor g = RandomTensor({k}, t, dev, rng), w = RandomTensor({n, k}, t, dev, rng);
  auto empty = [&](Shape shape, DType dt) {
    Tensor e = Tensor::Empty(shape, dt, dev).value();
    Poison(e);
    return e;
  };
  Tensor h = empty({m, k}, t), y = empty({m, k}, t), rstd = empty({m}, DType::kF32), out = empty({m, n}, t);
  Tensor h2 = empty({m, k}, t), rstd2 = empty({m}, DType::kF32), wf = empty({n, k}, t), out2 = empty({m, n}, t);
  ASSERT_TRUE(AddRmsNormForward(x, delta, g, kEps, h, y, rstd, s).ok());
  ASSERT_TRUE(MatmulForward(y, w, std::nullopt, out, s).ok());

  if (variant != nullptr) {
    ASSERT_EQ(setenv("SG_WGMMA_GEMM_VARIANT", variant, 1), 0);
  }
  ASSERT_TRUE(AddRmsNormStatsForward(x, delta, kEps, h2, rstd2, s).ok());
  ASSERT_TRUE(GemmRmsNormFoldWeight(w, g, wf, s).ok());
  GemmRmsNormOptions opts;
  opts.rstd_given = true;
  opts.gemm = gemm;
  const absl::Status st = GemmRmsNormForward(h2, wf, kEps, out2, rstd2, s, opts);
  if (variant != nullptr) {
    ASSERT_EQ(unsetenv("SG_WGMMA_GEMM_VARIANT"), 0);
  }
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(ToHost(h2), ToHost(h));
  EXPECT_EQ(ToHost(rstd2), ToHost(rstd));
  // bf16 roundings of y, w_folded and out: each ~2^-9 relative; L2 over the output well below 1e-2.
  EXPECT_LT(RelativeError(ToHost(out2), ToHost(out)), 1e-2);
}

TEST(GemmRmsNormCpuTest, LlamaBlockFusedMatchesUnfused) {
  CheckBlockFusedMatchesUnfused(Device::Cpu(), 24, 64, 48, GemmRmsNormGemm::kCublasEpilogue, nullptr);
}

TEST(GemmRmsNormCudaTest, LlamaBlockFusedMatchesUnfused) {
  SG_SKIP_WITHOUT_CUDA();
  CheckBlockFusedMatchesUnfused(Device::Cuda(0), 24, 64, 48, GemmRmsNormGemm::kCublasEpilogue, nullptr);
  for (const char* variant : {"registers", "tma_store", "cluster"}) {
    CheckBlockFusedMatchesUnfused(Device::Cuda(0), 512, 2048, 512, GemmRmsNormGemm::kWgmma, variant);
  }
}

// dw and dw_norm are reduced in a fixed order: two backward runs give identical bits.
TEST(GemmRmsNormCudaTest, WeightGradientsAreDeterministic) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s = Stream::Create(dev).value();
  const int64_t m = 1031, k = 512, n = 1000;
  const DType t = DType::kBF16;
  Tensor x = RandomTensor({m, k}, t, dev, Rng()), w = RandomTensor({n, k}, t, dev, Rng());
  Tensor g = RandomTensor({k}, t, dev, Rng()), dout = RandomTensor({m, n}, t, dev, Rng());
  Tensor wf = Tensor::Empty({n, k}, t, dev).value(), out = Tensor::Empty({m, n}, t, dev).value();
  Tensor rstd = Tensor::Empty({m}, DType::kF32, dev).value(), dx = Tensor::Empty({m, k}, t, dev).value();
  Tensor dw1 = Tensor::Empty({n, k}, DType::kF32, dev).value(), dw2 = Tensor::Empty({n, k}, DType::kF32, dev).value();
  Tensor dg1 = Tensor::Empty({k}, DType::kF32, dev).value(), dg2 = Tensor::Empty({k}, DType::kF32, dev).value();
  ASSERT_TRUE(GemmRmsNormFoldWeight(w, g, wf, s).ok());
  ASSERT_TRUE(GemmRmsNormForward(x, wf, kEps, out, rstd, s).ok());
  ASSERT_TRUE(GemmRmsNormBackward(dout, x, w, g, wf, rstd, dx, dw1, dg1, s).ok());
  ASSERT_TRUE(GemmRmsNormBackward(dout, x, w, g, wf, rstd, dx, dw2, dg2, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(ToHost(dw1), ToHost(dw2));
  EXPECT_EQ(ToHost(dg1), ToHost(dg2));
}

}  // namespace
}  // namespace sg::kernels
