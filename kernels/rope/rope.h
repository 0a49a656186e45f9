// Rotary position embedding (RoPE) in the Hugging Face Llama convention, forward and backward,
// applied to q and k together (their head counts may differ), in place or out of place.
//
//   // q: [batch, seq, q_heads, head_dim], k: [batch, seq, kv_heads, head_dim], bf16, f16 or f32
//   sg::kernels::RopeOptions opt;  opt.theta = 500000.f;  opt.position_offset = shard * seq;
//   SG_RETURN_IF_ERROR(sg::kernels::RopeForward(q, k, q, k, opt, stream));     // in place
//   SG_RETURN_IF_ERROR(sg::kernels::RopeBackward(dq, dk, dq, dk, opt, stream));
//
// Convention ("rotate_half"): element i of the first half of each head is paired with element
// i + head_dim/2. With inv_freq_i = 1 / theta^(2i / head_dim) and angle = pos * inv_freq_i (both
// computed in f32, as Hugging Face does before casting cos/sin):
//   out_i          = x_i cos(angle) - x_{i+d/2} sin(angle)
//   out_{i+d/2}    = x_{i+d/2} cos(angle) + x_i sin(angle)
// The rotation is done in f32 and rounded once to the tensor's dtype (Hugging Face rounds cos/sin
// to bf16 first; the difference is within bf16 rounding). The backward is the rotation by -angle.
// Position of token (b, s): positions[b, s] or positions[s] when given, else position_offset + s.
#ifndef SGTRAIN_KERNELS_ROPE_ROPE_H_
#define SGTRAIN_KERNELS_ROPE_ROPE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

struct RopeOptions {
  float theta = 10000.f;
  // First position of this sequence shard; ignored when `positions` is given.
  int64_t position_offset = 0;
  // Optional explicit positions, i32 or i64, [seq] (shared by the batch) or [batch, seq]. Absent
  // when default-constructed. On the CPU a negative position is an error; CUDA does not check.
  TensorView positions;
  // Optional precomputed tables from RopeTable, f32 [max_positions, head_dim / 2] each; when given,
  // cos/sin are read instead of computed. Positions must be < max_positions (CPU: error; CUDA:
  // clamped to the last row, no out-of-bounds read).
  TensorView cos, sin;
};

// Rotates q into q_out and k into k_out (each may alias its input). k and k_out may both be absent
// (default-constructed TensorView) to rotate q only. head_dim must be even.
absl::Status RopeForward(const TensorView& q, const TensorView& k, const TensorView& q_out,
                         const TensorView& k_out, const RopeOptions& options, const Stream& stream);

// Gradients through RopeForward: rotates dq_out/dk_out by -angle into dq/dk (which may alias them).
absl::Status RopeBackward(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dq,
                          const TensorView& dk, const RopeOptions& options, const Stream& stream);

// Fills cos and sin (f32 [max_positions, head_dim / 2]) with cos/sin(p * inv_freq_i), computed as
// RopeForward would, for RopeOptions::cos/sin.
absl::Status RopeTable(float theta, const TensorView& cos, const TensorView& sin, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_ROPE_ROPE_H_
