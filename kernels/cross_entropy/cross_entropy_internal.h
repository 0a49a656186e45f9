// Per-device implementations behind cross_entropy.h; arguments are already checked.
#ifndef SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_INTERNAL_H_
#define SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::cross_entropy_internal {

struct Problem {
  int64_t rows = 0, vocab = 0;
  DType dtype = DType::kF32;
  bool targets_i64 = false;
  int64_t ignore_index = -100;
  float grad_scale = 1.f;
  const float* grad_scale_from = nullptr;  // CrossEntropyOptions::grad_scale_from
};

// dlogits may be null (loss only).
void RunCpu(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid, void* dlogits);
absl::Status RunCuda(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid,
                     void* dlogits, int device, void* stream);

}  // namespace sg::kernels::cross_entropy_internal

#endif  // SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_INTERNAL_H_
