// Fused residual add + RMSNorm, the form a Llama block uses between its attention and MLP halves:
//
//   // x, delta, h, y: [rows, dim] (f32, bf16 or f16, one dtype); weight: [dim]; rstd: f32 [rows]
//   SG_RETURN_IF_ERROR(AddRmsNormForward(x, delta, weight, 1e-5f, h, y, rstd, stream));
//   SG_RETURN_IF_ERROR(AddRmsNormBackward(dy, dh_in, h, weight, rstd, dh, dweight, stream));
//
// Forward: h = x + delta (the new residual stream, rounded to x's dtype) and y = h * rstd * weight
// with rstd = 1 / sqrt(mean(h^2) + eps), computed from the rounded h so the backward, which only
// sees h, differentiates exactly what the forward computed. One pass: x and delta are read once,
// h and y written once (instead of an add kernel writing h and a norm kernel reading it back).
//
// Backward: h feeds both the norm and the next residual, so its total gradient is
// dh = dh_in + RMSNormBackward(dy), where dh_in is the gradient arriving along the residual stream.
// Because h = x + delta, dh is also the gradient of x and of delta: the caller uses it for both.
// dweight is a deterministic sum over rows (f32, overwritten, no atomics).
//
// h may be x itself (in-place residual update) and dh may be dh_in; other outputs must not overlap
// inputs. Leading dimensions are flattened into rows.
#ifndef SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_H_
#define SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_H_

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// Writes h and y (x's shape and dtype) and rstd (f32, one per row). InvalidArgument on mismatched
// shapes, dtypes or devices; FailedPrecondition for CUDA tensors in a build without CUDA.
absl::Status AddRmsNormForward(const TensorView& x, const TensorView& delta, const TensorView& weight, float eps,
                               const TensorView& h, const TensorView& y, const TensorView& rstd,
                               const Stream& stream);

// h = x + delta and rstd of h, as AddRmsNormForward computes them, without y: for a consumer that
// applies the norm itself -- the fused RMSNorm + GEMM (kernels/gemm_rmsnorm) with the norm weight
// folded into its W and rstd as the GEMM's row scale -- which saves y's write and re-read.
//   SG_RETURN_IF_ERROR(AddRmsNormStatsForward(x, delta, 1e-5f, h, rstd, stream));
//   GemmRmsNormOptions o; o.rstd_given = true;
//   SG_RETURN_IF_ERROR(GemmRmsNormForward(h, w_folded, 1e-5f, out, rstd, stream, o));
// Errors as AddRmsNormForward's.
absl::Status AddRmsNormStatsForward(const TensorView& x, const TensorView& delta, float eps, const TensorView& h,
                                    const TensorView& rstd, const Stream& stream);

// Given dy, the residual gradient dh_in and the forward's h, weight and rstd, writes dh (h's dtype)
// and dweight (f32 [dim]).
absl::Status AddRmsNormBackward(const TensorView& dy, const TensorView& dh_in, const TensorView& h,
                                const TensorView& weight, const TensorView& rstd, const TensorView& dh,
                                const TensorView& dweight, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_ADD_RMSNORM_ADD_RMSNORM_H_
