// SwiGLU, the Llama MLP activation: out = silu(gate) * up with silu(g) = g * sigmoid(g), forward and
// backward, in f32, bf16 or f16 with f32 arithmetic.
//
//   // gate, up, out: [tokens, ffn]
//   SG_RETURN_IF_ERROR(sg::kernels::SwiGluForward(gate, up, out, stream));
//   SG_RETURN_IF_ERROR(sg::kernels::SwiGluBackward(dout, gate, up, dgate, dup, stream));
//   // One fused up-projection output gate_up: [tokens, 2 * ffn] = [gate | up]
//   SG_RETURN_IF_ERROR(sg::kernels::SwiGluPackedForward(gate_up, out, stream));
//
// All tensors contiguous, one dtype (f32, bf16 or f16), one device. Outputs may alias inputs of the same
// layout (dgate over gate, dup over up, dgate_up over gate_up). CPU tensors run the reference loops;
// CUDA tensors run 16-byte vectorized kernels on `stream`.
#ifndef SGTRAIN_KERNELS_SWIGLU_SWIGLU_H_
#define SGTRAIN_KERNELS_SWIGLU_SWIGLU_H_

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// out = silu(gate) * up; gate, up and out have one shape.
absl::Status SwiGluForward(const TensorView& gate, const TensorView& up, const TensorView& out,
                           const Stream& stream);

// dgate = dout * up * silu'(gate), dup = dout * silu(gate), silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
absl::Status SwiGluBackward(const TensorView& dout, const TensorView& gate, const TensorView& up,
                            const TensorView& dgate, const TensorView& dup, const Stream& stream);

// The same on a packed input [..., 2F] holding gate in [..., :F] and up in [..., F:]; out is [..., F].
absl::Status SwiGluPackedForward(const TensorView& gate_up, const TensorView& out, const Stream& stream);

// dgate_up ([..., 2F], gate_up's layout) from dout [..., F] and the packed forward input.
absl::Status SwiGluPackedBackward(const TensorView& dout, const TensorView& gate_up,
                                  const TensorView& dgate_up, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_SWIGLU_SWIGLU_H_
