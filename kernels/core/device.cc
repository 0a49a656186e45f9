#include "kernels/core/device.h"

#include "absl/strings/str_cat.h"

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

}  // namespace

int CudaDeviceCount() { return Probe().count; }
std::string CudaUnavailableReason() { return Probe().reason; }

}  // namespace sg
