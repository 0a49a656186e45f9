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
  const float* grad_scale_from = nullptr;  // optional: multiplies grad_scale, read on the device
};

// dlogits may be null (loss only).
void RunCpu(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid, void* dlogits);
absl::Status RunCuda(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid,
                     void* dlogits, int device, void* stream);

// Run's three stages, for callers that split the rows (cross_entropy.h's CrossEntropyCount / Rows /
// Finish): the count of p.rows targets; p.rows rows' losses (f32, into row_loss) and dlogits (may
// be null), scaled by grad_scale / *valid; the mean of `rows` row losses (summed in f64, in a
// fixed order) over *valid.
void CountCpu(const Problem& p, const void* targets, int32_t* valid);
void RowsCpu(const Problem& p, const void* logits, const void* targets, const int32_t* valid, float* row_loss,
             void* dlogits);
void FinishCpu(int64_t rows, const float* row_loss, const int32_t* valid, float* loss);
absl::Status CountCuda(const Problem& p, const void* targets, int32_t* valid, void* stream);
absl::Status RowsCuda(const Problem& p, const void* logits, const void* targets, const int32_t* valid,
                      float* row_loss, void* dlogits, void* stream);
absl::Status FinishCuda(int64_t rows, const float* row_loss, const int32_t* valid, float* loss, void* stream);

}  // namespace sg::kernels::cross_entropy_internal

#endif  // SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_INTERNAL_H_
