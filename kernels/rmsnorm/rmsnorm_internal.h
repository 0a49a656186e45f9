// Per-device implementations behind rmsnorm.h; arguments are already checked by rmsnorm.cc. The CUDA
// entry points take the kernels' launch configuration so the benchmark and the tests can run every
// layout; rmsnorm.cc passes the default one.
#ifndef SGTRAIN_KERNELS_RMSNORM_RMSNORM_INTERNAL_H_
#define SGTRAIN_KERNELS_RMSNORM_RMSNORM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"
#include "kernels/rmsnorm/rmsnorm_launch.h"

namespace sg::kernels::rmsnorm_internal {

using rmsnorm_launch::LaunchConfig;

struct Problem {
  int64_t rows = 0;
  int64_t dim = 0;
  DType dtype = DType::kF32;
  float eps = 0;
};

void ForwardCpu(const Problem& p, const void* x, const void* w, void* y, float* rstd);
void BackwardCpu(const Problem& p, const void* dy, const void* x, const void* w, const float* rstd,
                 void* dx, float* dw);

absl::Status ForwardCuda(const Problem& p, const void* x, const void* w, void* y, float* rstd, int device,
                         void* stream, const LaunchConfig& cfg = {});
absl::Status BackwardCuda(const Problem& p, const void* dy, const void* x, const void* w,
                          const float* rstd, void* dx, float* dw, int device, void* stream,
                          const LaunchConfig& cfg = {});

}  // namespace sg::kernels::rmsnorm_internal

#endif  // SGTRAIN_KERNELS_RMSNORM_RMSNORM_INTERNAL_H_
