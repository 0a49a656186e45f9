// Per-device implementations behind add_rmsnorm.h; arguments are already checked by add_rmsnorm.cc.
// The CUDA entry points run RMSNorm's kernels (kernels/rmsnorm/rmsnorm_launch.h) with the add /
// residual term switched on, and take their launch configuration so the benchmark can sweep it.
#ifndef SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_INTERNAL_H_
#define SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"
#include "kernels/rmsnorm/rmsnorm_launch.h"

namespace sg::kernels::add_rmsnorm_internal {

using rmsnorm_launch::LaunchConfig;

struct Problem {
  int64_t rows = 0;
  int64_t dim = 0;
  DType dtype = DType::kF32;
  float eps = 0;
};

// y null: h and rstd only (w unused, may be null).
void ForwardCpu(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y, float* rstd);
void BackwardCpu(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                 const float* rstd, void* dh, float* dw);

absl::Status ForwardCuda(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y,
                         float* rstd, int device, void* stream, const LaunchConfig& cfg = {});
absl::Status BackwardCuda(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                          const float* rstd, void* dh, float* dw, int device, void* stream,
                          const LaunchConfig& cfg = {});

}  // namespace sg::kernels::add_rmsnorm_internal

#endif  // SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_INTERNAL_H_
