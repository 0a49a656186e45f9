// Elementwise helpers against a double-precision loop on the same (rounded) inputs, on the CPU and
// (when a GPU is present) CUDA, at odd sizes that exercise the 16-byte packs, the unaligned path and
// the tail. Fresh random inputs; outputs poisoned before each run.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/elementwise/elementwise.h"

namespace sg::kernels {
namespace {

using testing::Poison;
using testing::RandomTensor;
using testing::RelativeError;
using testing::Rng;
using testing::ToHost;

// One rounding of an f32 result to the dtype: f32 ~1e-7 relative, bf16 2^-9, f16 2^-11 (in L2 norm).
double Tolerance(DType t) { return t == DType::kF32 ? 1e-6 : t == DType::kBF16 ? 4e-3 : 1e-3; }

const std::vector<int64_t>& Sizes() {
  static const std::vector<int64_t> sizes = {1, 7, 8, 9, 1000, 4097, 65536 + 13};
  return sizes;
}

std::vector<Device> Devices() {
  std::vector<Device> d = {Device::Cpu()};
  if (CudaAvailable()) d.push_back(Device::Cuda(0));
  return d;
}

Stream StreamFor(Device d) { return d.is_cpu() ? Stream::Cpu() : Stream::Create(d).value(); }

void CheckArithmetic(Device device, DType dtype, int64_t n) {
  SCOPED_TRACE(device.ToString() + " " + std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
  Stream s = StreamFor(device);
  auto& rng = Rng();
  Tensor a = RandomTensor({n}, dtype, device, rng, 3.0f);
  Tensor b = RandomTensor({n}, dtype, device, rng, 3.0f);
  Tensor out = Tensor::Empty({n}, dtype, device).value();
  const std::vector<double> ha = ToHost(a), hb = ToHost(b);
  std::vector<double> want(static_cast<size_t>(n));
  const double tol = Tolerance(dtype);

  Poison(out);
  ASSERT_TRUE(Add(a, b, out, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  for (size_t i = 0; i < want.size(); ++i) want[i] = ha[i] + hb[i];
  EXPECT_LT(RelativeError(ToHost(out), want), tol) << "Add";

  Poison(out);
  ASSERT_TRUE(Scale(a, -1.75f, out, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  for (size_t i = 0; i < want.size(); ++i) want[i] = -1.75 * ha[i];
  EXPECT_LT(RelativeError(ToHost(out), want), tol) << "Scale";

  // In place: b += 0.3 * a.
  ASSERT_TRUE(AddScaled(a, 0.3f, b, b, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  for (size_t i = 0; i < want.size(); ++i) want[i] = hb[i] + double(0.3f) * ha[i];
  EXPECT_LT(RelativeError(ToHost(b), want), tol) << "AddScaled";

  Poison(out);
  ASSERT_TRUE(Fill(out, 2.5f, s).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(ToHost(out), std::vector<double>(size_t(n), 2.5)) << "Fill";
}

TEST(ElementwiseTest, ArithmeticMatchesDoubleLoop) {
  for (Device d : Devices())
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t n : Sizes()) CheckArithmetic(d, t, n);
}

// An unaligned view (offset by one element) takes the scalar path and must give the same result.
TEST(ElementwiseTest, UnalignedViews) {
  for (Device d : Devices()) {
    Stream s = StreamFor(d);
    const int64_t n = 4099;
    Tensor a = RandomTensor({n + 1}, DType::kBF16, d, Rng());
    Tensor out = Tensor::Empty({n + 1}, DType::kF32, d).value();
    Poison(out);
    TensorView av = a.view().Slice0(1, n + 1).value(), ov = out.view().Slice0(1, n + 1).value();
    ASSERT_TRUE(Cast(av, ov, s).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    EXPECT_EQ(ToHost(ov), ToHost(av)) << d.ToString();  // bf16 -> f32 is exact
  }
}

// Every pair of floating dtypes; the expected value is the source rounded once to the target type.
TEST(ElementwiseTest, CastMatchesRounding) {
  for (Device d : Devices()) {
    Stream s = StreamFor(d);
    for (DType from : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (int64_t n : {int64_t(13), int64_t(40000 + 5)}) {
          SCOPED_TRACE(d.ToString() + " " + std::string(DTypeName(from)) + "->" + std::string(DTypeName(to)));
          Tensor src = RandomTensor({n}, from, d, Rng(), 100.0f);
          Tensor out = Tensor::Empty({n}, to, d).value();
          Poison(out);
          ASSERT_TRUE(Cast(src, out, s).ok());
          ASSERT_TRUE(s.Synchronize().ok());
          // Round the source on the host through the same host conversion the tests trust.
          Tensor want = testing::FromHost(ToHost(src), {n}, to, Device::Cpu());
          EXPECT_EQ(ToHost(out), ToHost(want));
        }
      }
    }
  }
}

TEST(ElementwiseTest, SumRowsMatchesDoubleLoop) {
  struct Case { int64_t rows, cols; DType dtype; };
  for (Device d : Devices()) {
    Stream s = StreamFor(d);
    for (Case c : {Case{1, 1, DType::kF32}, Case{3, 7, DType::kBF16}, Case{130, 2048, DType::kBF16},
                   Case{1000, 24, DType::kF32}, Case{77, 1001, DType::kF16}}) {
      SCOPED_TRACE(d.ToString() + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols));
      Tensor x = RandomTensor({c.rows, c.cols}, c.dtype, d, Rng());
      Tensor out = Tensor::Empty({c.cols}, DType::kF32, d).value();
      Poison(out);
      ASSERT_TRUE(SumRows(x, out, s).ok());
      ASSERT_TRUE(s.Synchronize().ok());
      const std::vector<double> hx = ToHost(x);
      std::vector<double> want(size_t(c.cols), 0.0);
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t j = 0; j < c.cols; ++j) want[size_t(j)] += hx[size_t(r * c.cols + j)];
      // f32 sums of up to 1000 terms of size 1: ~1e-6 relative.
      EXPECT_LT(RelativeError(ToHost(out), want), 1e-5);
    }
  }
}

TEST(ElementwiseTest, BadArgumentsAreNamed) {
  Tensor a = Tensor::Empty({4, 8}, DType::kF32, Device::Cpu()).value();
  Tensor b = Tensor::Empty({33}, DType::kF32, Device::Cpu()).value();
  Tensor i = Tensor::Empty({32}, DType::kI32, Device::Cpu()).value();
  absl::Status st = Add(a, b, a, Stream::Cpu());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("b must have 32 elements of f32 on cpu, found f32[33]@cpu"), std::string::npos) << st;
  st = Cast(i, a, Stream::Cpu());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("src must be f32, bf16 or f16, found i32[32]@cpu"), std::string::npos) << st;
  EXPECT_EQ(SumRows(a, b, Stream::Cpu()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ElementwiseTest, CudaTensorsWithoutCudaBuildFail) {
#ifdef SG_WITH_CUDA
  GTEST_SKIP() << "built with CUDA";
#else
  TensorView x(reinterpret_cast<void*>(0x100), DType::kF32, {8}, Device::Cuda(0));
  EXPECT_EQ(Add(x, x, x, Stream::Cpu()).code(), absl::StatusCode::kFailedPrecondition);
#endif
}

}  // namespace
}  // namespace sg::kernels
