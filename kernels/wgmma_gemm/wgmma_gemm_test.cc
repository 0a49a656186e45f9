// WgmmaGemm against a double-precision CPU matmul with the row scale, on fresh random bf16 inputs
// (outputs poisoned first), plus the one-tile probes: inputs built so that every output element is
// an integer naming the operand element that reached it (exact in bf16 up to 256), so a wrong TMA
// box, swizzle, descriptor, accumulator mapping or k-block order is reported as "row 5 read B row
// 37" rather than only as a large error. CUDA tests skip without a GPU; the argument checks run on
// the CPU.
#include "kernels/wgmma_gemm/wgmma_gemm.h"

#include <stdlib.h>

#include <cmath>
#include <functional>
#include <random>
#include <sstream>
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
using Vec = std::vector<double>;

TEST(WgmmaGemmTest, BadArgumentsAreNamed) {
  const Device cpu = Device::Cpu();
  auto empty = [&](Shape s, DType t) { return Tensor::Empty(s, t, cpu).value(); };
  Tensor a = empty({128, 64}, DType::kBF16), b = empty({256, 64}, DType::kBF16), d = empty({128, 256}, DType::kBF16);
  Tensor b_bad = empty({256, 32}, DType::kBF16);
  absl::Status s = WgmmaGemm(a, b_bad, std::nullopt, d, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("b must be [N, 64] to match a bf16[128,64]@cpu, found bf16[256,32]@cpu"),
            std::string::npos)
      << s;
  Tensor d_bad = empty({128, 255}, DType::kBF16);
  s = WgmmaGemm(a, b, std::nullopt, d_bad, Stream::Cpu());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("d must be [..., 256] with 128 rows"), std::string::npos) << s;
  Tensor d_f32 = empty({128, 256}, DType::kF32);
  s = WgmmaGemm(a, b, std::nullopt, d_f32, Stream::Cpu());
  EXPECT_NE(s.message().find("d must have a's dtype bf16, found f32[128,256]@cpu"), std::string::npos) << s;
  Tensor scale_bad = empty({127}, DType::kF32);
  s = WgmmaGemm(a, b, scale_bad, d, Stream::Cpu());
  EXPECT_NE(s.message().find("row_scale must be a contiguous f32 [128] on cpu, found f32[127]@cpu"), std::string::npos)
      << s;
}

// Valid products the kernel does not cover are Unimplemented, so callers fall back to cuBLASLt.
TEST(WgmmaGemmTest, OutsideTheKernelIsUnimplemented) {
  const Device cpu = Device::Cpu();
  auto empty = [](Shape s, DType t, Device dev) { return Tensor::Empty(s, t, dev).value(); };
  Tensor a = empty({128, 64}, DType::kBF16, cpu), b = empty({256, 64}, DType::kBF16, cpu);
  Tensor d = empty({128, 256}, DType::kBF16, cpu);
  EXPECT_EQ(WgmmaGemm(a, b, std::nullopt, d, Stream::Cpu()).code(), absl::StatusCode::kUnimplemented);
  if (!CudaAvailable()) return;
  const Device gpu = Device::Cuda(0);
  Stream st = Stream::Create(gpu).value();
  struct Bad {
    int64_t m, n, k;
    DType t;
  };
  for (const Bad& c : {Bad{100, 256, 64, DType::kBF16}, Bad{128, 128, 64, DType::kBF16},
                       Bad{128, 256, 32, DType::kBF16}, Bad{128, 256, 64, DType::kF32}}) {
    Tensor ga = empty({c.m, c.k}, c.t, gpu), gb = empty({c.n, c.k}, c.t, gpu), gd = empty({c.m, c.n}, c.t, gpu);
    const absl::Status s = WgmmaGemm(ga, gb, std::nullopt, gd, st);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << c.m << "x" << c.n << "x" << c.k << ": " << s;
  }
}

// --- one-tile probes -------------------------------------------------------------------------------------

struct Probe {
  const char* name;  // which part of the kernel a mismatch points at
  int64_t m, n, k;
  std::function<double(int64_t, int64_t)> a, b;  // a(i, k), b(j, k): small integers
  std::function<double(int64_t)> scale;          // row scale, or null for none
  std::function<double(int64_t, int64_t)> want;  // d(i, j)
  const char* meaning;                           // what a wrong value names
};

constexpr WgmmaGemmVariant kVariants[] = {WgmmaGemmVariant::kRegisterStores, WgmmaGemmVariant::kTmaStore,
                                          WgmmaGemmVariant::kClusterMulticast};
const char* VariantName(WgmmaGemmVariant v) {
  switch (v) {
    case WgmmaGemmVariant::kRegisterStores:
      return "registers";
    case WgmmaGemmVariant::kTmaStore:
      return "tma_store";
    case WgmmaGemmVariant::kClusterMulticast:
      return "cluster";
    case WgmmaGemmVariant::kFromEnv:
      break;
  }
  return "from_env";
}

void RunProbe(const Probe& p, WgmmaGemmVariant variant) {
  SCOPED_TRACE(std::string(p.name) + ", " + std::to_string(p.m) + " rows, variant " + VariantName(variant));
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  Vec a(size_t(p.m * p.k)), b(size_t(p.n * p.k)), scale(size_t(p.m));
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t c = 0; c < p.k; ++c) a[size_t(i * p.k + c)] = p.a(i, c);
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t c = 0; c < p.k; ++c) b[size_t(j * p.k + c)] = p.b(j, c);
  for (int64_t i = 0; i < p.m; ++i) scale[size_t(i)] = p.scale ? p.scale(i) : 1.0;
  Tensor ta = FromHost(a, {p.m, p.k}, DType::kBF16, gpu), tb = FromHost(b, {p.n, p.k}, DType::kBF16, gpu);
  Tensor ts = FromHost(scale, {p.m}, DType::kF32, gpu);
  Tensor td = Tensor::Empty({p.m, p.n}, DType::kBF16, gpu).value();
  Poison(td);
  std::optional<TensorView> row_scale;
  if (p.scale) row_scale = ts.view();
  const absl::Status s = WgmmaGemm(ta, tb, row_scale, td, stream, variant);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(stream.Synchronize().ok());
  const Vec got = ToHost(td);
  int64_t wrong = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      const double g = got[size_t(i * p.n + j)], w = p.want(i, j);
      if (g == w) continue;  // integers below 256: exact, or the layout is wrong
      if (++wrong <= 8)
        first << "\n  d[" << i << "][" << j << "] = " << g << ", want " << w << " (" << p.meaning << ")";
    }
  }
  EXPECT_EQ(wrong, 0) << wrong << " of " << p.m * p.n << " outputs wrong; first:" << first.str();
}

double Delta(int64_t x, int64_t y) { return x == y ? 1.0 : 0.0; }

// One 128 x 256 tile, one 64-deep k-block (the last probe: four k-blocks, the whole ring), and the
// same on two M-adjacent tiles (M = 256: one pair of the cluster variant, sharing B). With
// a(i, k) = [k == i % 64], d(i, j) = b(j, i % 64): b(j, k) = j shows which B row reached column j,
// b(j, k) = k which k position of B met a's k. Symmetrically for A with b(j, k) = [k == j % 64].
TEST(WgmmaGemmCudaTest, OneTileProbes) {
  SG_SKIP_WITHOUT_CUDA();
  const std::vector<Probe> probes = {
      {"B rows (TMA box of B, B descriptor, accumulator columns)", 128, 256, 64,
       [](int64_t i, int64_t c) { return Delta(c, i % 64); }, [](int64_t j, int64_t) { return double(j); }, nullptr,
       [](int64_t, int64_t j) { return double(j); }, "the value is the B row that reached this column"},
      {"B k order (B swizzle, k16 steps)", 128, 256, 64, [](int64_t i, int64_t c) { return Delta(c, i % 64); },
       [](int64_t, int64_t c) { return double(c); }, nullptr, [](int64_t i, int64_t) { return double(i % 64); },
       "the value is the k of B met by a's k = i % 64"},
      {"A rows (TMA box of A, warpgroup rows, accumulator rows)", 128, 256, 64,
       [](int64_t i, int64_t) { return double(i); }, [](int64_t j, int64_t c) { return Delta(c, j % 64); }, nullptr,
       [](int64_t i, int64_t) { return double(i); }, "the value is the A row that reached this row"},
      {"A k order (A swizzle, k16 steps)", 128, 256, 64, [](int64_t, int64_t c) { return double(c); },
       [](int64_t j, int64_t c) { return Delta(c, j % 64); }, nullptr,
       [](int64_t, int64_t j) { return double(j % 64); }, "the value is the k of A met by b's k = j % 64"},
      {"row scale (epilogue rows)", 128, 256, 64, [](int64_t i, int64_t c) { return Delta(c, i % 64); },
       [](int64_t, int64_t) { return 1.0; }, [](int64_t i) { return double(i + 1); },
       [](int64_t i, int64_t) { return double(i + 1); }, "the value - 1 is the row whose scale was applied"},
      {"k-blocks (ring stages, mbarrier phases)", 128, 256, 256,
       [](int64_t i, int64_t c) { return Delta(c, (2 * i + 1) % 256); }, [](int64_t, int64_t c) { return double(c); },
       nullptr, [](int64_t i, int64_t) { return double((2 * i + 1) % 256); },
       "the value is the k of B met by a's k = (2 i + 1) % 256 (k-block = k / 64)"},
  };
  for (const WgmmaGemmVariant v : kVariants) {
    for (const int64_t m : {128, 256}) {
      for (Probe p : probes) {
        p.m = m;
        RunProbe(p, v);
      }
    }
  }
}

// --- random products against the double reference ----------------------------------------------------

struct Case {
  Shape a_shape;  // [..., K], M = product of the leading dims
  int64_t n;
  bool scaled;
};

void CheckAgainstReference(const Case& c, WgmmaGemmVariant variant) {
  const int64_t k = c.a_shape.back();
  int64_t m = 1;
  for (size_t i = 0; i + 1 < c.a_shape.size(); ++i) m *= c.a_shape[i];
  SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(c.n) + "x" + std::to_string(k) +
               (c.scaled ? " scaled" : " unscaled") + ", variant " + VariantName(variant));
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  auto& rng = Rng();
  Tensor a = RandomTensor(c.a_shape, DType::kBF16, gpu, rng), b = RandomTensor({c.n, k}, DType::kBF16, gpu, rng);
  Vec scale(size_t(m), 1.0);
  std::uniform_real_distribution<double> u(0.25, 4.0);  // 1/rms of activations of scale ~0.25..4
  if (c.scaled) {
    for (double& v : scale) v = u(rng);
  }
  Tensor ts = FromHost(scale, {m}, DType::kF32, gpu);
  Shape d_shape = c.a_shape;
  d_shape.back() = c.n;
  Tensor d = Tensor::Empty(d_shape, DType::kBF16, gpu).value();
  Poison(d);
  std::optional<TensorView> row_scale;
  if (c.scaled) row_scale = ts.view();
  const absl::Status s = WgmmaGemm(a, b, row_scale, d, stream, variant);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(stream.Synchronize().ok());

  const Vec ha = ToHost(a), hb = ToHost(b), got = ToHost(d);
  const Vec hs = ToHost(ts);  // the f32 scale the kernel saw
  Vec want(size_t(m * c.n)), bound(size_t(m * c.n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0, abs_acc = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double p = ha[size_t(i * k + q)] * hb[size_t(j * k + q)];
        acc += p;
        abs_acc += std::fabs(p);
      }
      want[size_t(i * c.n + j)] = hs[size_t(i)] * acc;
      // bf16 rounding of the output (half an ulp: 2^-9 relative, 2^-8 with margin) plus the f32
      // accumulation (generously 2^-16 of the sum of |products|, far below a layout error's O(1)).
      bound[size_t(i * c.n + j)] =
          std::ldexp(std::fabs(hs[size_t(i)] * acc), -8) + std::ldexp(hs[size_t(i)] * abs_acc, -16);
    }
  }
  // L2: bf16 output rounding alone is ~2^-9 / sqrt(3) ~ 1.1e-3 relative.
  EXPECT_LT(RelativeError(got, want), 3e-3);
  int64_t wrong = 0;
  std::ostringstream first;
  for (size_t e = 0; e < want.size(); ++e) {
    if (std::fabs(got[e] - want[e]) <= bound[e]) continue;  // NaN (unwritten) fails here too
    if (++wrong <= 5) {
      first << "\n  d[" << int64_t(e) / c.n << "][" << int64_t(e) % c.n << "] = " << got[e] << ", want " << want[e];
    }
  }
  EXPECT_EQ(wrong, 0) << wrong << " outputs outside the bf16 bound; first:" << first.str();
}

TEST(WgmmaGemmCudaTest, MatchesDoubleReference) {
  SG_SKIP_WITHOUT_CUDA();
  const std::vector<Case> cases = {
      {{128, 64}, 256, true},      // one tile, one k-block
      {{256, 2048}, 512, true},    // 4 tiles, 32 k-blocks (8 passes over the ring)
      {{128, 8192}, 256, true},    // one tile, 128 k-blocks
      {{384, 512}, 768, false},    // no row scale
      {{2, 192, 192}, 512, true},  // leading dims (M = 384), K = 3 k-blocks (not a multiple of the ring)
      {{2048, 64}, 4096, true},    // 256 tiles (128 pairs over two groups of 8 tile rows): several per block
  };
  for (const WgmmaGemmVariant v : kVariants) {
    for (const Case& c : cases) CheckAgainstReference(c, v);
  }
}

// The variants differ only in how the tile reaches memory and who loads B: the same accumulation
// and rounding, so their outputs must agree bit for bit (on a problem of many pairs and k-blocks).
TEST(WgmmaGemmCudaTest, VariantsAgreeBitwise) {
  SG_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  auto& rng = Rng();
  const int64_t m = 1024, n = 1536, k = 640;
  Tensor a = RandomTensor({m, k}, DType::kBF16, gpu, rng), b = RandomTensor({n, k}, DType::kBF16, gpu, rng);
  Tensor scale = RandomTensor({m}, DType::kF32, gpu, rng);
  std::vector<Vec> outs;
  for (const WgmmaGemmVariant v : kVariants) {
    Tensor d = Tensor::Empty({m, n}, DType::kBF16, gpu).value();
    Poison(d);
    const absl::Status s = WgmmaGemm(a, b, scale.view(), d, stream, v);
    ASSERT_TRUE(s.ok()) << VariantName(v) << ": " << s;
    ASSERT_TRUE(stream.Synchronize().ok());
    outs.push_back(ToHost(d));
  }
  for (size_t v = 1; v < outs.size(); ++v) {
    int64_t differ = 0;
    for (size_t e = 0; e < outs[0].size(); ++e) {
      if (!(outs[v][e] == outs[0][e])) ++differ;  // NaN (a poisoned, unwritten element) differs too
    }
    EXPECT_EQ(differ, 0) << VariantName(kVariants[v]) << " differs from registers in " << differ << " of "
                         << outs[0].size() << " outputs";
  }
}

TEST(WgmmaGemmTest, VariantFromEnvironment) {
  const Device cpu = Device::Cpu();
  auto empty = [&](Shape s) { return Tensor::Empty(s, DType::kBF16, cpu).value(); };
  Tensor a = empty({128, 64}), b = empty({256, 64}), d = empty({128, 256});
  ASSERT_EQ(setenv("SG_WGMMA_GEMM_VARIANT", "fastest", 1), 0);
  const absl::Status bad = WgmmaGemm(a, b, std::nullopt, d, Stream::Cpu());
  ASSERT_EQ(setenv("SG_WGMMA_GEMM_VARIANT", "tma_store", 1), 0);
  const absl::Status good = WgmmaGemm(a, b, std::nullopt, d, Stream::Cpu());
  ASSERT_EQ(unsetenv("SG_WGMMA_GEMM_VARIANT"), 0);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("must be registers, tma_store or cluster (or unset), found 'fastest'"),
            std::string::npos)
      << bad;
  EXPECT_EQ(good.code(), absl::StatusCode::kUnimplemented) << good;  // a valid name: on to the CPU check
}

}  // namespace
}  // namespace sg::kernels
