#include "kernels/core/device.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", ordinal);
}

namespace {

struct CudaProbe {
  int count = 0;
  std::string reason;
};

const CudaProbe& Probe() {
  static const CudaProbe probe = [] {
    CudaProbe p;
#ifdef SG_WITH_CUDA
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      p.reason = absl::StrCat("no CUDA device: ", cudaGetErrorString(err));
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
    } else if (n == 0) {
      p.reason = "no CUDA device: the driver reports 0 devices";
    }
    p.count = err == cudaSuccess ? n : 0;
#else
    p.reason = "built without CUDA (no nvcc found, or --config=nocuda)";
#endif
    return p;
  }();
  return probe;
}

// OK when `ordinal` names a usable CUDA device; else FailedPrecondition (no device: why) or
// InvalidArgument (out of range), each naming `what`.
absl::Status CheckOrdinal(const char* what, int ordinal) {
  const int count = Probe().count;
  if (count == 0) return absl::FailedPreconditionError(absl::StrCat(what, ": ", Probe().reason));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": device ordinal in [0, ", count, "), found ", ordinal));
  }
  return absl::OkStatus();
}

}  // namespace

int CudaDeviceCount() { return Probe().count; }
std::string CudaUnavailableReason() { return Probe().reason; }

absl::StatusOr<int64_t> CudaDeviceMemoryBytes(int ordinal) {
  SG_RETURN_IF_ERROR(CheckOrdinal("CudaDeviceMemoryBytes", ordinal));
#ifdef SG_WITH_CUDA
  cudaDeviceProp prop;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  return int64_t(prop.totalGlobalMem);
#else
  return absl::FailedPreconditionError("CudaDeviceMemoryBytes: built without CUDA");
#endif
}

absl::StatusOr<std::string> CudaDevicePciBusId(int ordinal) {
  SG_RETURN_IF_ERROR(CheckOrdinal("CudaDevicePciBusId", ordinal));
#ifdef SG_WITH_CUDA
  char id[64] = {};
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(id, int(sizeof(id)), ordinal));
  return std::string(id);
#else
  return absl::FailedPreconditionError("CudaDevicePciBusId: built without CUDA");
#endif
}

absl::Status RequireSm90(const std::string& what) {
#ifdef SG_WITH_CUDA
  constexpr int kMaxDevices = 64;
  static std::atomic<int> capability[kMaxDevices] = {};  // 10 * major + minor; 0 = not read yet
  int device = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int cc = device < kMaxDevices ? capability[device].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cc = 10 * major + minor;
    if (device < kMaxDevices) capability[device].store(cc, std::memory_order_relaxed);
  }
  if (cc != 90) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": needs an sm_90 GPU, found compute capability ", cc / 10, ".", cc % 10));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(absl::StrCat(what, ": built without CUDA"));
#endif
}

}  // namespace sg
