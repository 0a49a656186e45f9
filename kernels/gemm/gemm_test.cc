// GEMM against a double-precision triple loop over the same (rounded) inputs, on the CPU (Eigen) and
// on CUDA (cuBLASLt): every transpose pair, every dtype combination, bias, residual, in-place
// accumulation, per-row scale (both CUDA paths), strided batches, shared b, and row strides wider
// than the rows. Operands live inside wider backing buffers whose padding is poisoned, so an
// out-of-bounds read shows up as NaN and an out-of-bounds write as a changed pad.
#include "kernels/gemm/gemm.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

struct Case {
  int64_t batch;  // 0: plain matrices (rank 2)
  int64_t m, n, k;
  bool ta, tb;
  DType ab, d;
  bool bias = false, residual = false, in_place = false, row_scale = false;
  float alpha = 1.0f, beta = 0.0f;
  int64_t pad = 0;       // extra columns in every operand's row stride
  bool b_shared = false;  // rank-2 b with a batched a
  bool row_scale_epilogue = true;
};

std::string Name(const Case& c) {
  return "b" + std::to_string(c.batch) + "_" + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
         std::to_string(c.k) + (c.ta ? "_T" : "_N") + (c.tb ? "T" : "N") + "_" + std::string(DTypeName(c.ab)) +
         "->" + std::string(DTypeName(c.d)) + (c.bias ? "_bias" : "") + (c.residual ? "_res" : "") +
         (c.in_place ? "_inplace" : "") + (c.row_scale ? (c.row_scale_epilogue ? "_rs" : "_rs_pass") : "") +
         "_pad" + std::to_string(c.pad) + (c.b_shared ? "_bshared" : "");
}

// A [batch?, rows, cols] operand stored inside a [batch?, rows, cols + pad] buffer.
struct Operand {
  Tensor buf;
  TensorView view;
  int64_t batch, rows, cols, ld;
  double At(const std::vector<double>& host, int64_t b, int64_t r, int64_t c) const {
    return host[size_t((b * rows + r) * ld + c)];
  }
};

Operand MakeOperand(int64_t batch, int64_t rows, int64_t cols, int64_t pad, DType dtype, Device dev, bool random,
                    float scale = 1.0f) {
  Operand o;
  o.batch = batch == 0 ? 1 : batch;
  o.rows = rows;
  o.cols = cols;
  o.ld = cols + pad;
  Shape full = batch == 0 ? Shape{rows, o.ld} : Shape{batch, rows, o.ld};
  if (random) {
    o.buf = RandomTensor(full, dtype, dev, Rng(), scale);
  } else {
    o.buf = Tensor::Empty(full, dtype, dev).value();
    Poison(o.buf);
  }
  Shape shape = batch == 0 ? Shape{rows, cols} : Shape{batch, rows, cols};
  Strides strides = batch == 0 ? Strides{o.ld, 1} : Strides{rows * o.ld, o.ld, 1};
  o.view = TensorView(o.buf.view().raw(), dtype, shape, strides, dev);
  return o;
}

void RunCase(const Case& c, Device dev) {
  SCOPED_TRACE(Name(c) + " on " + dev.ToString());
  Stream stream = dev.is_cpu() ? Stream::Cpu() : Stream::Create(dev).value();
  const int64_t bt = c.batch == 0 ? 1 : c.batch;
  Operand a = c.ta ? MakeOperand(c.batch, c.k, c.m, c.pad, c.ab, dev, true)
                   : MakeOperand(c.batch, c.m, c.k, c.pad, c.ab, dev, true);
  const int64_t b_batch = c.b_shared ? 0 : c.batch;
  Operand b = c.tb ? MakeOperand(b_batch, c.n, c.k, c.pad, c.ab, dev, true)
                   : MakeOperand(b_batch, c.k, c.n, c.pad, c.ab, dev, true);
  Operand d = MakeOperand(c.batch, c.m, c.n, c.pad, c.d, dev, /*random=*/c.in_place);
  GemmArgs g;
  g.a = a.view;
  g.b = b.view;
  g.d = d.view;
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.row_scale_in_epilogue = c.row_scale_epilogue;
  Operand res;
  if (c.residual) {
    res = MakeOperand(c.batch, c.m, c.n, c.pad, c.d, dev, true);
    g.c = res.view;
  }
  Tensor bias, rs;
  if (c.bias) g.bias = (bias = RandomTensor({c.n}, c.d, dev, Rng())).view();
  if (c.row_scale) {
    std::vector<double> s(size_t(c.m));
    std::uniform_real_distribution<double> u(0.5, 2.0);
    for (double& v : s) v = u(Rng());
    g.row_scale = (rs = FromHost(s, {c.m}, DType::kF32, dev)).view();
  }

  const std::vector<double> ha = ToHost(a.buf), hb = ToHost(b.buf), d_before = ToHost(d.buf);
  const std::vector<double> hres = c.residual ? ToHost(res.buf) : std::vector<double>();
  const std::vector<double> hbias = c.bias ? ToHost(bias) : std::vector<double>();
  const std::vector<double> hrs = c.row_scale ? ToHost(rs) : std::vector<double>();

  absl::Status st = Gemm(g, stream);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(stream.Synchronize().ok());
  const std::vector<double> hd = ToHost(d.buf);

  std::vector<double> got, want;
  for (int64_t bi = 0; bi < bt; ++bi) {
    const int64_t bb = c.b_shared ? 0 : bi;
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double av = c.ta ? a.At(ha, bi, kk, i) : a.At(ha, bi, i, kk);
          const double bv = c.tb ? b.At(hb, bb, j, kk) : b.At(hb, bb, kk, j);
          acc += av * bv;
        }
        double v = c.alpha * acc * (c.row_scale ? hrs[size_t(i)] : 1.0);
        if (c.residual) v += c.beta * res.At(hres, bi, i, j);
        if (c.in_place) v += c.beta * d.At(d_before, bi, i, j);
        if (c.bias) v += hbias[size_t(j)];
        want.push_back(v);
        got.push_back(d.At(hd, bi, i, j));
      }
      for (int64_t j = c.n; j < d.ld; ++j) {  // the pad must be left alone
        const double before = d.At(d_before, bi, i, j), after = d.At(hd, bi, i, j);
        ASSERT_TRUE((std::isnan(before) && std::isnan(after)) || before == after) << "pad written at " << i << "," << j;
      }
    }
  }
  // f32 outputs: f32 accumulation over k <= ~300 terms (~1e-6); bf16 outputs: one (two on the
  // row-scale pass) bf16 roundings of the result, ~1e-3 in L2.
  const double tol = c.d == DType::kF32 ? 2e-5 : 1e-2;
  EXPECT_LT(RelativeError(got, want), tol);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      cases.push_back({0, 37, 53, 29, ta, tb, f32, f32});
      cases.push_back({0, 64, 48, 80, ta, tb, bf16, bf16});
      cases.push_back({0, 33, 17, 71, ta, tb, bf16, f32});
      cases.push_back({3, 19, 24, 40, ta, tb, bf16, bf16});
      cases.push_back({0, 64, 48, 80, ta, tb, DType::kF16, DType::kF16});
      cases.push_back({0, 33, 17, 71, ta, tb, DType::kF16, f32});
    }
  }
  Case c = {0, 45, 64, 96, false, true, bf16, bf16};
  c.bias = true;
  cases.push_back(c);  // Linear forward with bias
  c.d = f32;
  cases.push_back(c);
  c = {0, 40, 72, 56, false, true, bf16, bf16};
  c.residual = true;
  c.beta = 1.0f;
  cases.push_back(c);  // residual add
  c.bias = true;
  c.alpha = 0.5f;
  c.beta = -0.75f;
  cases.push_back(c);
  c = {0, 48, 32, 40, true, false, bf16, f32};
  c.in_place = true;
  c.beta = 1.0f;
  cases.push_back(c);  // dW accumulation into f32 gradients
  c = {0, 31, 23, 17, false, false, f32, f32};
  c.in_place = true;
  c.beta = 0.5f;
  cases.push_back(c);
  for (bool epi : {true, false}) {
    c = {0, 57, 64, 48, false, true, bf16, bf16};
    c.row_scale = true;
    c.row_scale_epilogue = epi;
    cases.push_back(c);  // the GEMM+RMSNorm form
    c = {2, 24, 40, 32, false, true, bf16, f32};
    c.row_scale = true;
    c.row_scale_epilogue = epi;
    c.b_shared = true;  // not flattened: the row scale is per batch entry's rows
    cases.push_back(c);
    c = {0, 13, 21, 11, true, false, f32, f32};
    c.row_scale = true;
    c.alpha = 2.0f;  // alpha != 1 takes the separate pass
    c.row_scale_epilogue = epi;
    cases.push_back(c);
  }
  c = {4, 24, 32, 40, false, true, bf16, bf16};
  c.b_shared = true;  // flattened into one [96, 40] x [40, 32] product
  c.bias = true;
  cases.push_back(c);
  c = {3, 21, 16, 24, true, false, bf16, bf16};
  c.b_shared = true;  // transposed a: stays a strided batch with b's stride 0
  cases.push_back(c);
  c = {0, 40, 24, 32, false, false, bf16, bf16};
  c.pad = 8;  // 16-byte-aligned wider rows
  cases.push_back(c);
  c = {2, 17, 25, 19, true, true, bf16, f32};
  c.pad = 3;  // misaligned rows
  c.residual = true;
  c.beta = 1.0f;
  cases.push_back(c);
  c = {0, 1, 1, 1, false, false, f32, f32};
  cases.push_back(c);
  return cases;
}

TEST(GemmCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) RunCase(c, Device::Cpu());
}

TEST(GemmCpuTest, LargerOddShape) { RunCase({0, 301, 259, 333, false, true, DType::kBF16, DType::kF32}, Device::Cpu()); }

// Linear: y = x w^T; the backward products against finite differences of L = sum(g * y).
TEST(GemmCpuTest, MatmulBackwardMatchesFiniteDifferences) {
  const int64_t m = 5, n = 4, k = 3;
  auto& rng = Rng();
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(m * k), w(n * k), gy(m * n);
  for (auto* v : {&x, &w, &gy})
    for (double& e : *v) e = u(rng);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    double l = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double y = 0;
        for (int64_t kk = 0; kk < k; ++kk) y += xx[i * k + kk] * ww[j * k + kk];
        l += gy[i * n + j] * y;
      }
    return l;
  };
  const Device cpu = Device::Cpu();
  Tensor tx = FromHost(x, {m, k}, DType::kF32, cpu), tw = FromHost(w, {n, k}, DType::kF32, cpu);
  Tensor tg = FromHost(gy, {m, n}, DType::kF32, cpu);
  Tensor dx = Tensor::Empty({m, k}, DType::kF32, cpu).value(), dw = Tensor::Empty({n, k}, DType::kF32, cpu).value();
  Poison(dx);
  Poison(dw);
  ASSERT_TRUE(MatmulBackward(tg, tx, tw, dx.view(), dw, /*accumulate_dw=*/false, Stream::Cpu()).ok());
  const std::vector<double> hdx = ToHost(dx), hdw = ToHost(dw);
  const double h = 1e-6;
  for (int64_t i = 0; i < m * k; ++i) {
    std::vector<double> p = x, q = x;
    p[i] += h;
    q[i] -= h;
    EXPECT_NEAR(hdx[i], (loss(p, w) - loss(q, w)) / (2 * h), 1e-5) << "dx[" << i << "]";
  }
  for (int64_t i = 0; i < n * k; ++i) {
    std::vector<double> p = w, q = w;
    p[i] += h;
    q[i] -= h;
    EXPECT_NEAR(hdw[i], (loss(x, p) - loss(x, q)) / (2 * h), 1e-5) << "dw[" << i << "]";
  }
  // Accumulating adds the same gradient again.
  ASSERT_TRUE(MatmulBackward(tg, tx, tw, std::nullopt, dw, /*accumulate_dw=*/true, Stream::Cpu()).ok());
  std::vector<double> twice = hdw;
  for (double& v : twice) v *= 2;
  EXPECT_LT(RelativeError(ToHost(dw), twice), 1e-6);
}

TEST(GemmCpuTest, BadArgumentsAreNamed) {
  const Device cpu = Device::Cpu();
  auto empty = [&](Shape s, DType t) { return Tensor::Empty(s, t, cpu).value(); };
  Tensor a = empty({4, 8}, DType::kF32), b = empty({9, 5}, DType::kF32), d = empty({4, 5}, DType::kF32);
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.d = d;
  absl::Status s = Gemm(g, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inner dimensions differ: op(a) is [4,8]"), std::string::npos) << s;

  Tensor bb = empty({8, 5}, DType::kBF16);
  g.b = bb;
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("must both be f32, both bf16 or both f16"), std::string::npos) << s;

  Tensor a16 = empty({4, 8}, DType::kBF16), d16 = empty({4, 5}, DType::kBF16), bf = empty({8, 5}, DType::kF32);
  g.a = a;  // f32 inputs cannot produce bf16
  g.b = bf;
  g.d = d16;
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("d must be f32, or the inputs' 16-bit dtype"), std::string::npos) << s;

  g.a = a16;
  g.b = bb;
  g.d = d16;
  Tensor bias = empty({4}, DType::kBF16);
  g.bias = bias.view();
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("Gemm bias: expected contiguous bf16[5]@cpu, found bf16[4]@cpu"), std::string::npos) << s;
  g.bias.reset();
  g.sm_count = -1;
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("sm_count must be >= 0 (0: all SMs), found -1"), std::string::npos) << s;
  g.sm_count = 0;

  g.bias.reset();
  g.c = d16.view();
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("c given but beta == 0"), std::string::npos) << s;
  g.beta = 1.0f;
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("must not alias d"), std::string::npos) << s;

  g.c.reset();
  Tensor rs = empty({4}, DType::kF32);
  g.row_scale = rs.view();
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("row_scale requires beta == 0"), std::string::npos) << s;

  TensorView col(a16.view().raw(), DType::kBF16, {4, 4}, {8, 2}, cpu);  // every other column
  g = GemmArgs();
  g.a = col;
  g.b = bb;
  g.d = d16;
  s = Gemm(g, Stream::Cpu());
  EXPECT_NE(s.message().find("contiguous last dimension"), std::string::npos) << s;
}

TEST(GemmCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) RunCase(c, Device::Cuda(0));
  RunCase({0, 301, 259, 333, false, true, DType::kBF16, DType::kF32}, Device::Cuda(0));
  RunCase({0, 256, 3072, 2048, false, true, DType::kBF16, DType::kBF16}, Device::Cuda(0));  // q/kv projection width
}

// Same key twice (the cached algorithm) and a different stream (its own workspace) agree bit for bit.
TEST(GemmCudaTest, CachedAlgorithmAndSecondStreamAgree) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s1 = Stream::Create(dev).value(), s2 = Stream::Create(dev).value();
  Tensor x = RandomTensor({512, 1024}, DType::kBF16, dev, Rng());
  Tensor w = RandomTensor({768, 1024}, DType::kBF16, dev, Rng());
  Tensor y1 = Tensor::Empty({512, 768}, DType::kBF16, dev).value(), y2 = Tensor::Empty({512, 768}, DType::kBF16, dev).value();
  Tensor y3 = Tensor::Empty({512, 768}, DType::kBF16, dev).value();
  for (const Tensor* t : {&y1, &y2, &y3}) Poison(*t);
  ASSERT_TRUE(MatmulForward(x, w, std::nullopt, y1, s1).ok());
  ASSERT_TRUE(MatmulForward(x, w, std::nullopt, y2, s1).ok());
  ASSERT_TRUE(MatmulForward(x, w, std::nullopt, y3, s2).ok());
  ASSERT_TRUE(s1.Synchronize().ok());
  ASSERT_TRUE(s2.Synchronize().ok());
  EXPECT_EQ(ToHost(y1), ToHost(y2));
  EXPECT_EQ(ToHost(y1), ToHost(y3));
}

// GemmArgs::sm_count (cuBLASLt planning for fewer SMs, for a GEMM beside another stream's work):
// the same product as planning for all of them, up to the f32 summation order of another algorithm;
// both against the CPU's.
TEST(GemmCudaTest, SmCountTargetGivesTheSameProduct) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream s = Stream::Create(dev).value();
  Tensor a = RandomTensor({1000, 768}, DType::kBF16, dev, Rng()), b = RandomTensor({640, 768}, DType::kBF16, dev, Rng());
  Tensor all = Tensor::Empty({1000, 640}, DType::kF32, dev).value(), some = Tensor::Empty({1000, 640}, DType::kF32, dev).value();
  Poison(all);
  Poison(some);
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.trans_b = true;
  g.d = all;
  ASSERT_TRUE(Gemm(g, s).ok());
  g.d = some;
  g.sm_count = 64;
  ASSERT_TRUE(Gemm(g, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  Tensor ha = FromHost(ToHost(a), {1000, 768}, DType::kBF16, Device::Cpu());
  Tensor hb = FromHost(ToHost(b), {640, 768}, DType::kBF16, Device::Cpu());
  Tensor want = Tensor::Empty({1000, 640}, DType::kF32, Device::Cpu()).value();
  GemmArgs c = g;
  c.a = ha;
  c.b = hb;
  c.d = want;
  ASSERT_TRUE(Gemm(c, Stream::Cpu()).ok());
  const std::vector<double> w = ToHost(want);
  EXPECT_LT(RelativeError(ToHost(all), w), 1e-5);
  EXPECT_LT(RelativeError(ToHost(some), w), 1e-5);
}

// The Linear backward on CUDA against the CPU implementation, with f32 gradient accumulation.
TEST(GemmCudaTest, MatmulBackwardMatchesCpu) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0), cpu = Device::Cpu();
  Stream s = Stream::Create(dev).value();
  const int64_t m = 777, n = 384, k = 320;
  Tensor x = RandomTensor({3, m / 3, k}, DType::kBF16, cpu, Rng());
  Tensor w = RandomTensor({n, k}, DType::kBF16, cpu, Rng());
  Tensor dy = RandomTensor({3, m / 3, n}, DType::kBF16, cpu, Rng());
  Tensor dw0 = RandomTensor({n, k}, DType::kF32, cpu, Rng());  // existing gradient
  auto to_dev = [&](const Tensor& t) { return FromHost(ToHost(t), t.shape(), t.dtype(), dev); };
  Tensor gx = to_dev(x), gw = to_dev(w), gdy = to_dev(dy), gdw = to_dev(dw0);
  Tensor cdw_host = FromHost(ToHost(dw0), {n, k}, DType::kF32, cpu);
  Tensor gdx = Tensor::Empty(x.shape(), DType::kBF16, dev).value(), cdx = Tensor::Empty(x.shape(), DType::kBF16, cpu).value();
  Poison(gdx);
  Poison(cdx);
  ASSERT_TRUE(MatmulBackward(gdy, gx, gw, gdx.view(), gdw, /*accumulate_dw=*/true, s).ok());
  ASSERT_TRUE(MatmulBackward(dy, x, w, cdx.view(), cdw_host, /*accumulate_dw=*/true, Stream::Cpu()).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_LT(RelativeError(ToHost(gdx), ToHost(cdx)), 1e-2);  // bf16 output
  EXPECT_LT(RelativeError(ToHost(gdw), ToHost(cdw_host)), 1e-5);  // f32 accumulation both sides
}

}  // namespace
}  // namespace sg::kernels
