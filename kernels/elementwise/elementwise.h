// Elementwise helpers the training graph needs between the big kernels: add, scale, add-scaled
// (axpy), dtype casts, fill, and a column sum over rows. Floating tensors only (f32, bf16, f16);
// arithmetic is done in f32 and rounded once to the output dtype.
//
//   SG_RETURN_IF_ERROR(sg::kernels::Add(a, b, out, stream));            // out = a + b
//   SG_RETURN_IF_ERROR(sg::kernels::AddScaled(x, -0.5f, y, y, stream));  // y += -0.5 * x
//   SG_RETURN_IF_ERROR(sg::kernels::Cast(master_f32, weights_bf16, stream));
//
// Tensors must be contiguous, on one device, with equal element counts (shapes may differ, e.g.
// [16384, 2048] and [8, 2048, 2048]). An output may alias an input of the same dtype (in-place
// update). CPU tensors run the reference loops; CUDA tensors run 16-byte vectorized kernels on
// `stream` (a scalar path handles unaligned views and the tail).
#ifndef SGTRAIN_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
#define SGTRAIN_KERNELS_ELEMENTWISE_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// out = a + b. a, b, out share one dtype.
absl::Status Add(const TensorView& a, const TensorView& b, const TensorView& out, const Stream& stream);

// out = alpha * x. x and out share one dtype.
absl::Status Scale(const TensorView& x, float alpha, const TensorView& out, const Stream& stream);

// out = y + alpha * x (axpy; out may be y). x, y, out share one dtype.
absl::Status AddScaled(const TensorView& x, float alpha, const TensorView& y, const TensorView& out,
                       const Stream& stream);

// out = src converted to out's dtype (round to nearest even; f32 -> bf16/f16 may overflow to inf).
absl::Status Cast(const TensorView& src, const TensorView& out, const Stream& stream);

// Every element of out = value (rounded to out's dtype).
absl::Status Fill(const TensorView& out, float value, const Stream& stream);

// out[c] = sum over rows r of x[r, c], for x viewed as [rows, cols] with cols = x.dim(-1); out is
// f32 [cols], overwritten. Deterministic: fixed row blocks summed in a fixed order (no atomics).
absl::Status SumRows(const TensorView& x, const TensorView& out, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
