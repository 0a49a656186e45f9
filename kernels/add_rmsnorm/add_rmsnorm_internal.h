// Per-device implementations behind add_rmsnorm.h; arguments are already checked by add_rmsnorm.cc.
#ifndef SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_INTERNAL_H_
#define SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::add_rmsnorm_internal {

struct Problem {
  int64_t rows = 0;
  int64_t dim = 0;
  DType dtype = DType::kF32;
  float eps = 0;
};

void ForwardCpu(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y, float* rstd);
void BackwardCpu(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                 const float* rstd, void* dh, float* dw);

absl::Status ForwardCuda(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y,
                         float* rstd, void* stream);
absl::Status BackwardCuda(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                          const float* rstd, void* dh, float* dw, int device, void* stream);

}  // namespace sg::kernels::add_rmsnorm_internal

#endif  // SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_INTERNAL_H_
