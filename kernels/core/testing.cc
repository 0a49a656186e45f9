#include "kernels/core/testing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "kernels/core/status.h"
#include "kernels/core/testing_cuda.h"

namespace sg::testing {

std::mt19937_64& Rng() {
  static std::mt19937_64* rng = [] {
    uint64_t seed;
    if (const char* s = std::getenv("SG_TEST_SEED"); s != nullptr && *s != '\0') {
      seed = std::strtoull(s, nullptr, 10);
    } else {
      seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    std::cerr << "random seed " << seed << " (set SG_TEST_SEED to replay)\n";
    return new std::mt19937_64(seed);
  }();
  return *rng;
}

namespace {

// Waits for all work this process queued on `device`. The helpers' copies go through the legacy
// default stream, which is not ordered with the non-blocking streams kernels run on
// (Stream::Create): without it a copy could read an output before its kernel finished, or poison a
// buffer that a kernel still writes.
void SyncDevice(Device device) {
#ifdef SG_WITH_CUDA
  if (!device.is_cuda()) return;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(device.ordinal);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    ADD_FAILURE() << "cudaDeviceSynchronize on " << device.ToString() << ": " << cudaGetErrorString(e);
  }
  cudaSetDevice(prev);
#else
  (void)device;
#endif
}

template <typename T>
void FillHost(const TensorView& t, const std::vector<double>& v) {
  T* p = t.data<T>();
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      p[i] = T::FromFloat(float(v[i]));
    } else {
      p[i] = T(v[i]);
    }
  }
}

template <typename T>
void ReadHost(const TensorView& t, std::vector<double>& v) {
  const T* p = t.data<T>();
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      v[i] = p[i].ToFloat();
    } else {
      v[i] = double(p[i]);
    }
  }
}

Tensor HostCopy(const TensorView& t) {
  Tensor h = Tensor::Empty(t.shape(), t.dtype(), Device::Cpu()).value();
  if (t.device().is_cpu()) {
    if (t.nbytes() > 0) std::memcpy(h.view().raw(), t.raw(), size_t(t.nbytes()));  // empty: null data
  } else {
    SyncDevice(t.device());
    Stream s = Stream::Cpu();
    absl::Status st = CopyTensor(t, h, s);
    if (!st.ok()) ADD_FAILURE() << st;
  }
  return h;
}

}  // namespace

Tensor FromHost(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  Tensor h = Tensor::Empty(shape, dtype, Device::Cpu()).value();
  switch (dtype) {
    case DType::kF32: FillHost<float>(h, values); break;
    case DType::kBF16: FillHost<BFloat16>(h, values); break;
    case DType::kF16: FillHost<Half>(h, values); break;
    case DType::kI32: FillHost<int32_t>(h, values); break;
    case DType::kI64: FillHost<int64_t>(h, values); break;
  }
  if (device.is_cpu()) return h;
  Tensor d = Tensor::Empty(shape, dtype, device).value();
  // The caching allocator may hand out a block that work queued on another stream still reads
  // (scratch a kernel freed after queueing, which is ordered only on its own stream): let that
  // work finish before the copy overwrites it.
  SyncDevice(device);
  absl::Status st = CopyTensor(h, d, Stream::Cpu());
  if (!st.ok()) ADD_FAILURE() << st;
  return d;
}

Tensor RandomTensor(const Shape& shape, DType dtype, Device device, std::mt19937_64& rng, float scale) {
#ifdef SG_WITH_CUDA
  if (device.is_cuda() && IsFloating(dtype)) {  // generated on the device: benchmarks fill GBs
    Tensor t = Tensor::Empty(shape, dtype, device).value();
    SyncDevice(device);  // as in FromHost: t's block may still be read by work on another stream
    Stream s = Stream::Create(device).value();
    absl::Status st = FillUniformCuda(t.view().raw(), dtype, t.numel(), rng(), scale, s.native());
    if (st.ok()) st = s.Synchronize();  // the caller's kernels run on other streams
    if (!st.ok()) ADD_FAILURE() << st;
    return t;
  }
#endif
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(size_t(NumElements(shape)));
  for (double& x : v) x = u(rng);
  return FromHost(v, shape, dtype, device);
}

void Poison(const TensorView& t) {
  const int byte = IsFloating(t.dtype()) ? 0xff : 0x7f;  // all-ones is NaN in every float type
  if (t.device().is_cpu()) {
    if (t.nbytes() > 0) std::memset(t.raw(), byte, size_t(t.nbytes()));
    return;
  }
  SyncDevice(t.device());
  Tensor h = Tensor::Empty(t.shape(), t.dtype(), Device::Cpu()).value();
  std::memset(h.view().raw(), byte, size_t(t.nbytes()));
  absl::Status st = CopyTensor(h, t, Stream::Cpu());
  if (!st.ok()) ADD_FAILURE() << st;
}

std::vector<double> ToHost(const TensorView& t) {
  Tensor h = HostCopy(t);
  std::vector<double> v(size_t(t.numel()));
  switch (t.dtype()) {
    case DType::kF32: ReadHost<float>(h, v); break;
    case DType::kBF16: ReadHost<BFloat16>(h, v); break;
    case DType::kF16: ReadHost<Half>(h, v); break;
    case DType::kI32: ReadHost<int32_t>(h, v); break;
    case DType::kI64: ReadHost<int64_t>(h, v); break;
  }
  return v;
}

double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double MaxAbsError(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

absl::StatusOr<std::unique_ptr<StreamHold>> StreamHold::Create() {
#ifdef SG_WITH_CUDA
  std::unique_ptr<StreamHold> hold(new StreamHold());
  void* host = nullptr;
  SG_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped));
  hold->host_flag_ = static_cast<volatile int*>(host);
  *hold->host_flag_ = 0;
  void* device = nullptr;
  SG_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&device, host, 0));
  hold->device_flag_ = static_cast<const volatile int*>(device);
  return hold;
#else
  return absl::FailedPreconditionError("StreamHold needs a CUDA build and device");
#endif
}

StreamHold::~StreamHold() {
#ifdef SG_WITH_CUDA
  if (host_flag_ != nullptr) {
    *host_flag_ = 1;  // a kernel still spinning on it ends
    (void)cudaFreeHost(const_cast<int*>(host_flag_));
  }
#endif
}

absl::Status StreamHold::Hold(const Stream& stream, double limit_s) {
#ifdef SG_WITH_CUDA
  *host_flag_ = 0;
  return SpinUntilFlagCuda(device_flag_, int64_t(limit_s * 1e9), stream.native());
#else
  (void)stream, (void)limit_s;
  return absl::FailedPreconditionError("StreamHold needs a CUDA build and device");
#endif
}

void StreamHold::Release() {
  if (host_flag_ != nullptr) *host_flag_ = 1;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  return 0.5 * (*std::max_element(values.begin(), values.begin() + mid) + upper);
}

}  // namespace sg::testing
