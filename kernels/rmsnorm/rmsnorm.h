// RMSNorm over the last dimension, forward and backward: the template every kernel package follows.
//
//   // x, y: [rows, dim] (f32, bf16 or f16); weight: [dim] (x's dtype); rstd: f32 [rows]
//   SG_RETURN_IF_ERROR(sg::kernels::RmsNormForward(x, weight, 1e-5f, y, rstd, stream));
//   SG_RETURN_IF_ERROR(sg::kernels::RmsNormBackward(dy, x, weight, rstd, dx, dweight, stream));
//
// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), accumulated in f32. Leading
// dimensions are flattened into rows. Tensors on the CPU run the reference implementation; tensors
// on a CUDA device run the CUDA kernels on `stream`.
#ifndef SGTRAIN_KERNELS_RMSNORM_RMSNORM_H_
#define SGTRAIN_KERNELS_RMSNORM_RMSNORM_H_

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// Writes y (x's shape and dtype) and rstd (f32, one per row, saved for the backward).
// InvalidArgument on mismatched shapes, dtypes or devices; FailedPrecondition for CUDA tensors in a
// build without CUDA.
absl::Status RmsNormForward(const TensorView& x, const TensorView& weight, float eps,
                            const TensorView& y, const TensorView& rstd, const Stream& stream);

// Given dy and the forward's x, weight and rstd, writes dx (x's dtype) and dweight (f32 [dim],
// overwritten, not accumulated). dweight is a deterministic sum over rows (no atomics).
absl::Status RmsNormBackward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                             const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                             const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_RMSNORM_RMSNORM_H_
