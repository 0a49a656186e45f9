// GPU unit test of the v5 backward's wgmma building blocks (attention_wgmma_probe.h): each product
// of the probe against a double-precision CPU matmul of the same bf16 inputs. A wrong descriptor,
// swizzle or fragment mapping gives O(1) errors in the product that uses it, so the failing
// EXPECT names the building block. The bf16 rounding of S^T (the A operand of the later products)
// is taken from the probe's own f32 S^T, so the later checks see only f32 accumulation error.
// (Built without CUDA the test body is empty: it skips.)
#include "kernels/attention/attention_wgmma_probe.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/dtype.h"
#include "kernels/core/testing.h"

namespace sg::kernels {
namespace {

using sg::testing::FromHost;
using sg::testing::Poison;
using sg::testing::RelativeError;
using sg::testing::ToHost;
using Vec = std::vector<double>;

[[maybe_unused]] Vec RandomBf16(int64_t n) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = BFloat16::FromFloat(float(u(sg::testing::Rng()))).ToFloat();
  return v;
}

[[maybe_unused]] double RoundBf16(double x) { return BFloat16::FromFloat(float(x)).ToFloat(); }

class WgmmaProbeTest : public ::testing::TestWithParam<int> {};

TEST_P(WgmmaProbeTest, ProductsMatchCpuMatmul) {
  SG_SKIP_WITHOUT_CUDA();
#ifdef SG_WITH_CUDA
  const int d = GetParam(), n = internal::kWgmmaProbeKeys, m = internal::WgmmaProbeQueries(d);
  const Device gpu = Device::Cuda(0);
  Stream stream = Stream::Create(gpu).value();
  const Vec k = RandomBf16(int64_t(n) * d), q = RandomBf16(int64_t(m) * d);
  Tensor kt = FromHost(k, {n, d}, DType::kBF16, gpu), qt = FromHost(q, {m, d}, DType::kBF16, gpu);
  Tensor st = Tensor::Empty({n, m}, DType::kF32, gpu).value();
  Tensor pv = Tensor::Empty({n, d}, DType::kF32, gpu).value();
  Tensor dq = Tensor::Empty({m, d}, DType::kF32, gpu).value();
  Poison(st);
  Poison(pv);
  Poison(dq);
  const absl::Status status = internal::RunWgmmaBwdProbeCuda(
      d, kt.view().raw(), qt.view().raw(), st.view().data<float>(), pv.view().data<float>(),
      dq.view().data<float>(), stream.native());
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(stream.Synchronize().ok());
  const Vec st_got = ToHost(st), pv_got = ToHost(pv), dq_got = ToHost(dq);

  // S^T = K Q^T (IssueQK, keys as M, both operands K-major).
  Vec st_want(size_t(n) * m, 0.0);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < d; ++c) st_want[size_t(j) * m + i] += k[size_t(j) * d + c] * q[size_t(i) * d + c];
    }
  }
  EXPECT_LT(RelativeError(st_got, st_want), 1e-5) << "S^T = K Q^T (IssueQK)";

  // P^T Q with P^T = bf16(S^T) from registers (PackP, IssuePV: RS, MN-major B).
  Vec p(st_got.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = RoundBf16(st_got[i]);
  Vec pv_want(size_t(n) * d, 0.0);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < d; ++c) pv_want[size_t(j) * d + c] += p[size_t(j) * m + i] * q[size_t(i) * d + c];
    }
  }
  EXPECT_LT(RelativeError(pv_got, pv_want), 1e-5) << "P^T dO (PackP, IssuePV)";

  // dQ = P K through shared memory (StoreDsT, IssueDq: transposed A and B, StoreDq), read back
  // through the dq workspace swizzle: element (i, c) at i d + ((c / 8) ^ (i % 8)) 8 + c % 8.
  Vec dq_want(size_t(m) * d, 0.0), dq_unswizzled(size_t(m) * d);
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < d; ++c) {
      for (int j = 0; j < n; ++j) dq_want[size_t(i) * d + c] += p[size_t(j) * m + i] * k[size_t(j) * d + c];
      dq_unswizzled[size_t(i) * d + c] = dq_got[size_t(i) * d + (((c / 8) ^ (i % 8)) * 8) + c % 8];
    }
  }
  EXPECT_LT(RelativeError(dq_unswizzled, dq_want), 1e-5) << "dS K (StoreDsT, IssueDq, StoreDq)";
#endif
}

INSTANTIATE_TEST_SUITE_P(HeadDims, WgmmaProbeTest, ::testing::Values(64, 128),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "D" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace sg::kernels
