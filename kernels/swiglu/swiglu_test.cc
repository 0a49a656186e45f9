// SwiGLU against a double-precision loop (forward and analytic backward), central finite
// differences of sum(out * g) (backward), and the CPU reference for CUDA; the packed [gate | up]
// form against the separate form. Fresh random inputs; outputs poisoned before each run.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/swiglu/swiglu.h"

namespace sg::kernels {
namespace {

using testing::FromHost;
using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

double SiLU(double g) { return g / (1 + std::exp(-g)); }

struct Ref {
  std::vector<double> out, dgate, dup;
};

Ref DoubleReference(const std::vector<double>& g, const std::vector<double>& u, const std::vector<double>& d) {
  Ref r;
  for (size_t i = 0; i < g.size(); ++i) {
    const double s = 1 / (1 + std::exp(-g[i]));
    r.out.push_back(SiLU(g[i]) * u[i]);
    r.dgate.push_back(d[i] * u[i] * (s + g[i] * s * (1 - s)));
    r.dup.push_back(d[i] * SiLU(g[i]));
  }
  return r;
}

// f32: a few f32 roundings (~1e-6); bf16: one bf16 rounding of each output (2^-9, ~3e-3 in L2).
double Tolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

struct Case {
  int64_t rows, cols;
  DType dtype;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {{1, 1, DType::kF32},    {3, 7, DType::kF32},    {5, 16, DType::kF32},
                                          {17, 344, DType::kF32}, {1, 9, DType::kBF16},   {9, 24, DType::kBF16},
                                          {33, 1000, DType::kBF16}, {64, 5632, DType::kBF16}, {33, 1000, DType::kF16}};
  return cases;
}

void CheckSeparate(const Case& c, Device device) {
  SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + std::string(DTypeName(c.dtype)) +
               " on " + device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  auto& rng = Rng();
  Tensor g = RandomTensor({c.rows, c.cols}, c.dtype, device, rng, 4.0f);
  Tensor u = RandomTensor({c.rows, c.cols}, c.dtype, device, rng, 2.0f);
  Tensor d = RandomTensor({c.rows, c.cols}, c.dtype, device, rng, 1.0f);
  Tensor out = Tensor::Empty(g.shape(), c.dtype, device).value();
  Tensor dg = Tensor::Empty(g.shape(), c.dtype, device).value();
  Tensor du = Tensor::Empty(g.shape(), c.dtype, device).value();
  for (const Tensor* t : {&out, &dg, &du}) Poison(*t);
  ASSERT_TRUE(SwiGluForward(g, u, out, s).ok());
  ASSERT_TRUE(SwiGluBackward(d, g, u, dg, du, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  const Ref ref = DoubleReference(ToHost(g), ToHost(u), ToHost(d));
  EXPECT_LT(RelativeError(ToHost(out), ref.out), Tolerance(c.dtype)) << "out";
  EXPECT_LT(RelativeError(ToHost(dg), ref.dgate), Tolerance(c.dtype)) << "dgate";
  EXPECT_LT(RelativeError(ToHost(du), ref.dup), Tolerance(c.dtype)) << "dup";
}

// Packed [gate | up] must give what the separate form gives on the same halves, bit for bit
// (same formula, same rounding), also in place (dgate_up over gate_up).
void CheckPacked(const Case& c, Device device) {
  SCOPED_TRACE("packed " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " on " + device.ToString());
  Stream s = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
  auto& rng = Rng();
  Tensor gu = RandomTensor({c.rows, 2 * c.cols}, c.dtype, device, rng, 4.0f);
  Tensor d = RandomTensor({c.rows, c.cols}, c.dtype, device, rng, 1.0f);
  Tensor out = Tensor::Empty({c.rows, c.cols}, c.dtype, device).value();
  Poison(out);
  ASSERT_TRUE(SwiGluPackedForward(gu, out, s).ok());
  const std::vector<double> hgu = ToHost(gu);
  std::vector<double> hg, hu;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.cols; ++j) {
      hg.push_back(hgu[size_t(r * 2 * c.cols + j)]);
      hu.push_back(hgu[size_t(r * 2 * c.cols + c.cols + j)]);
    }
  }
  ASSERT_TRUE(SwiGluPackedBackward(d, gu, gu, s).ok());  // in place
  ASSERT_TRUE(s.Synchronize().ok());
  const Ref ref = DoubleReference(hg, hu, ToHost(d));
  const std::vector<double> hdgu = ToHost(gu);
  std::vector<double> dg, du;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.cols; ++j) {
      dg.push_back(hdgu[size_t(r * 2 * c.cols + j)]);
      du.push_back(hdgu[size_t(r * 2 * c.cols + c.cols + j)]);
    }
  }
  EXPECT_LT(RelativeError(ToHost(out), ref.out), Tolerance(c.dtype)) << "out";
  EXPECT_LT(RelativeError(dg, ref.dgate), Tolerance(c.dtype)) << "dgate";
  EXPECT_LT(RelativeError(du, ref.dup), Tolerance(c.dtype)) << "dup";
}

TEST(SwiGluCpuTest, MatchesDoubleReference) {
  for (const Case& c : Cases()) CheckSeparate(c, Device::Cpu());
}

TEST(SwiGluCpuTest, PackedMatchesDoubleReference) {
  for (const Case& c : Cases()) CheckPacked(c, Device::Cpu());
}

TEST(SwiGluCpuTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 13;
  std::uniform_real_distribution<double> dist(-3, 3);
  std::vector<double> g(n), u(n), w(n);
  for (auto* v : {&g, &u, &w})
    for (double& e : *v) e = dist(Rng());
  Tensor tg = FromHost(g, {n}, DType::kF32, Device::Cpu()), tu = FromHost(u, {n}, DType::kF32, Device::Cpu());
  Tensor tw = FromHost(w, {n}, DType::kF32, Device::Cpu());
  Tensor dg = Tensor::Empty({n}, DType::kF32, Device::Cpu()).value();
  Tensor du = Tensor::Empty({n}, DType::kF32, Device::Cpu()).value();
  Poison(dg);
  Poison(du);
  ASSERT_TRUE(SwiGluBackward(tw, tg, tu, dg, du, Stream::Cpu()).ok());
  const std::vector<double> hdg = ToHost(dg), hdu = ToHost(du);
  const double h = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    // L = sum_j silu(g_j) u_j w_j; only term i depends on g_i, u_i.
    const double fd_g = (SiLU(g[i] + h) - SiLU(g[i] - h)) / (2 * h) * u[i] * w[i];
    const double fd_u = SiLU(g[i]) * w[i];
    EXPECT_NEAR(hdg[i], fd_g, 1e-4 * (1 + std::abs(fd_g))) << i;  // f32 kernel vs f64 differences
    EXPECT_NEAR(hdu[i], fd_u, 1e-5 * (1 + std::abs(fd_u))) << i;
  }
}

TEST(SwiGluCpuTest, BadArgumentsAreNamed) {
  Tensor g = Tensor::Empty({4, 8}, DType::kBF16, Device::Cpu()).value();
  Tensor u = Tensor::Empty({4, 9}, DType::kBF16, Device::Cpu()).value();
  absl::Status st = SwiGluForward(g, u, g, Stream::Cpu());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("up: expected contiguous bf16[4,8]@cpu, found bf16[4,9]@cpu"), std::string::npos) << st;
  Tensor odd = Tensor::Empty({4, 7}, DType::kBF16, Device::Cpu()).value();
  st = SwiGluPackedForward(odd, g, Stream::Cpu());
  EXPECT_NE(st.message().find("must be even"), std::string::npos) << st;
  Tensor gu = Tensor::Empty({4, 16}, DType::kBF16, Device::Cpu()).value();
  st = SwiGluPackedForward(gu, u, Stream::Cpu());
  EXPECT_NE(st.message().find("out: expected contiguous bf16[4,8]@cpu"), std::string::npos) << st;
}

// Both kernel families (swiglu.cu): the default (the flat kernel where the 16-byte layout allows
// it, the grid-stride kernels for the rest: cols % 8 != 0, unaligned up in the packed form, a
// numel % 8 != 0 separate row with a partial last pack) and SG_SWIGLU_KERNEL=grid (the
// grid-stride kernels for everything, including their 16-byte path).
TEST(SwiGluCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  for (const char* kernel : {"", "grid"}) {
    SCOPED_TRACE(std::string("SG_SWIGLU_KERNEL=") + kernel);
    if (*kernel == 0) {
      unsetenv("SG_SWIGLU_KERNEL");
    } else {
      ASSERT_EQ(setenv("SG_SWIGLU_KERNEL", kernel, 1), 0);
    }
    for (const Case& c : Cases()) {
      CheckSeparate(c, Device::Cuda(0));
      CheckPacked(c, Device::Cuda(0));
    }
    CheckSeparate({16384, 5632, DType::kBF16}, Device::Cuda(0));  // Llama-1B MLP width
    CheckPacked({4099, 5632, DType::kBF16}, Device::Cuda(0));     // several grid-stride steps
    CheckSeparate({3, 1001, DType::kBF16}, Device::Cuda(0));      // one flat row, numel % 8 != 0
    CheckPacked({3, 1001, DType::kBF16}, Device::Cuda(0));        // rows not 16-byte aligned
  }
  unsetenv("SG_SWIGLU_KERNEL");
}

}  // namespace
}  // namespace sg::kernels
