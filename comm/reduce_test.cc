// The reductions of comm/reduce.h against a double-precision loop: host ReduceInto, and the device
// ReduceDevice (out of place, in place, unaligned pointers, fused scale, odd lengths that leave a
// tail after the 16-byte vectors). The device cases skip without CUDA.
#include "comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/core/tensor.h"
#include "kernels/core/testing.h"

namespace sg::comm {
namespace {

std::vector<double> Reference(ReduceOp op, const std::vector<double>& a, const std::vector<double>& b,
                              double scale) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = (op == ReduceOp::kMax ? std::max(a[i], b[i]) : a[i] + b[i]) * scale;
  return r;
}

// Generated on the host and copied synchronously, so the device data is in place on return.
Tensor Random(int64_t n, DType dtype, Device device) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(sg::testing::Rng());
  return sg::testing::FromHost(v, {n}, dtype, device);
}

double Tolerance(DType dtype) { return dtype == DType::kF32 ? 1e-6 : std::ldexp(1.0, -7); }

TEST(ReduceTest, HostMatchesReference) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      Tensor a = Random(1003, dtype, Device::Cpu());
      Tensor b = Random(1003, dtype, Device::Cpu());
      std::vector<double> want = Reference(op, sg::testing::ToHost(a), sg::testing::ToHost(b), 1.0);
      ASSERT_TRUE(ReduceInto(op, dtype, a.view().raw(), b.view().raw(), a.numel()).ok());
      EXPECT_LT(sg::testing::MaxAbsError(sg::testing::ToHost(a), want), 2 * Tolerance(dtype))
          << DTypeName(dtype) << " " << ReduceOpName(op);
    }
  }
}

// Cases: {elements, element offset of a, b and dst into their buffers (0 keeps 16-byte alignment),
// dst aliases a}.
struct DeviceCase {
  int64_t n;
  int64_t offset;
  bool in_place;
};

TEST(ReduceTest, DeviceMatchesReference) {
  SG_SKIP_WITHOUT_CUDA();
  const Device dev = Device::Cuda(0);
  Stream stream = Stream::Create(dev).value();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (DeviceCase c : {DeviceCase{1, 0, false}, DeviceCase{1001, 0, false}, DeviceCase{1001, 1, true},
                         DeviceCase{(int64_t(1) << 22) + 5, 0, true}, DeviceCase{(int64_t(1) << 20) + 3, 3, false}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        for (float scale : {1.0f, 0.5f}) {
          const int64_t len = c.n + c.offset;
          Tensor a = Random(len, dtype, dev);
          Tensor b = Random(len, dtype, dev);
          Tensor d = Tensor::Empty({len}, dtype, dev).value();
          sg::testing::Poison(d);
          std::vector<double> ha = sg::testing::ToHost(a), hb = sg::testing::ToHost(b);
          std::vector<double> sa(ha.begin() + c.offset, ha.end()), sb(hb.begin() + c.offset, hb.end());
          std::vector<double> want = Reference(op, sa, sb, scale);
          const int64_t off = c.offset * SizeOf(dtype);
          char* pa = static_cast<char*>(a.view().raw()) + off;
          char* pb = static_cast<char*>(b.view().raw()) + off;
          char* pd = c.in_place ? pa : static_cast<char*>(d.view().raw()) + off;
          absl::Status s = ReduceDevice(op, dtype, pd, pa, pb, c.n, scale, stream);
          ASSERT_TRUE(s.ok()) << s;
          ASSERT_TRUE(stream.Synchronize().ok());
          std::vector<double> got = sg::testing::ToHost(TensorView(pd, dtype, {c.n}, dev));
          EXPECT_LT(sg::testing::MaxAbsError(got, want), 2 * Tolerance(dtype))
              << DTypeName(dtype) << " " << ReduceOpName(op) << " n " << c.n << " offset " << c.offset
              << (c.in_place ? " in place" : "") << " scale " << scale;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sg::comm
