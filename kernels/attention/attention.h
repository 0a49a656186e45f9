// Scaled dot-product attention (flash attention): forward, backward, and the block/merge steps that
// ring attention (context parallelism) is built from.
//
//   sg::kernels::AttentionOptions opt;
//   opt.causal = true;
//   SG_RETURN_IF_ERROR(AttentionForward(q, k, v, opt, out, lse, stream));
//   SG_RETURN_IF_ERROR(AttentionBackward(q, k, v, out, dout, lse, opt, dq, dk, dv, stream));
//
// Layout: q, out, dout, dq are [batch, seq_q, heads, head_dim]; k, v, dk, dv are
// [batch, seq_k, kv_heads, head_dim] with kv_heads dividing heads (grouped-query attention: query
// head h reads key/value head h / (heads / kv_heads)). lse and delta are f32 [batch, heads, seq_q].
// All tensors contiguous and on one device. CPU: f32, bf16 or f16 (f64 accumulation, the
// reference). CUDA: the flash kernels for bf16 or f16 (IEEE half) at head_dim 64 or 128, f32
// softmax statistics, any sequence lengths; f16 runs on the kernel families v4 and v5 only (the older
// families are Unimplemented for f16). Every other case up to head_dim kAttentionMaxHeadDim (f32 data,
// a head of 8 or 96) runs plain deterministic kernels (attention_generic.cu), correct but without
// tensor cores or tiling, 100-160x slower than the flash kernels at a 1B model's shape: for tests,
// small models and f32 checks, not for training at scale. SG_ATTENTION_KERNEL=generic forces them;
// SG_ATTENTION_KERNEL=v2|v3|v4|v5 picks the kernel family at each call (unset: v5, the fastest measured: the Hopper forward SG_ATTN_FWD_VARIANT=ws|
// wgmma names (unset: ws, warp-specialized; attention_fwd_v4.h) with the Hopper wgmma backward,
// sm_90 only; v4 is that forward with v3's backward; v3 the mma.sync family for GPUs without sm_90a
// features; v2 the kernels every family falls back to where its own cannot run: scale <= 0, more
// than 65535 tiles of 128 queries or keys; attention_internal.h says more); anything else is
// InvalidArgument.
//
// Ring attention: with queries at global positions [q_offset, q_offset + seq_q) and one key/value
// block at [k_offset, k_offset + seq_k):
//   for each kv block j: AttentionForward(q, k_j, v_j, {causal, scale, q0, k0_j}, out_j, lse_j)
//                        AttentionMerge(out, lse, out_j, lse_j, out, lse)   // running result
//   backward: AttentionBackwardDelta(out, dout, delta) once, then for each block
//             AttentionBlockBackward(q, k_j, v_j, dout, lse, delta, opt_j, dq_j, dk_j, dv_j)
//             and dq = sum_j dq_j, dk_j / dv_j go back to the block's owner.
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_H_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// The widest head the CUDA kernels take (the generic ones; the flash kernels take 64 and 128).
inline constexpr int64_t kAttentionMaxHeadDim = 256;

struct AttentionOptions {
  // Mask key positions greater than the query position (key_pos > query_pos). Positions are
  // q_offset + i for query row i and k_offset + j for key row j, so with zero offsets and
  // seq_q != seq_k the mask is aligned at the top-left (query 0 sees key 0 only).
  bool causal = false;
  // Multiplies q.k before the softmax; 1/sqrt(head_dim) when unset.
  std::optional<double> scale;
  int64_t q_offset = 0;
  int64_t k_offset = 0;
};

// out = softmax(scale * q k^T + mask) v per head; lse[b, h, i] = log sum_j exp(scale * q_i.k_j)
// over unmasked keys (natural log). A query row whose keys are all masked gets out = 0 and
// lse = -inf (valid input to AttentionMerge). out and lse are overwritten.
// InvalidArgument on shape/dtype/device mismatch; FailedPrecondition for CUDA tensors in a build
// without CUDA; Unimplemented on CUDA for head_dim > kAttentionMaxHeadDim.
absl::Status AttentionForward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options, const TensorView& out,
                              const TensorView& lse, const Stream& stream);

// Gradients of AttentionForward: dq, dk, dv (overwritten; dk/dv sum over the query heads of a
// group). `out` and `lse` are the forward's results. Recomputes probabilities tile by tile (no
// seq x seq matrix in memory). Equivalent to AttentionBackwardDelta + AttentionBlockBackward.
// On CUDA, dq is accumulated in f32 with atomics, so its last bits may vary run to run; dk and dv
// are deterministic.
absl::Status AttentionBackward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout,
                               const TensorView& lse, const AttentionOptions& options,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const Stream& stream);

// delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d] (f32), the backward's row term.
// For ring attention, `out` and `dout` are the merged (global) output and its gradient.
absl::Status AttentionBackwardDelta(const TensorView& out, const TensorView& dout,
                                    const TensorView& delta, const Stream& stream);

// The backward contribution of one key/value block given the global lse and delta: dq (this
// block's part; sum over blocks), dk and dv of this block. options carry the block's offsets.
absl::Status AttentionBlockBackward(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& dout, const TensorView& lse,
                                    const TensorView& delta, const AttentionOptions& options,
                                    const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv, const Stream& stream);

// Combines two partial attentions of the same queries over disjoint key sets:
//   lse = logaddexp(lse_a, lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
// Rows with lse_a = lse_b = -inf give out = 0, lse = -inf. out/lse may alias out_a/lse_a (or the
// b side) for a running merge. All outs share a dtype (f32, bf16 or f16) and shape [batch, seq, heads,
// head_dim]; lses are f32 [batch, heads, seq].
absl::Status AttentionMerge(const TensorView& out_a, const TensorView& lse_a,
                            const TensorView& out_b, const TensorView& lse_b,
                            const TensorView& out, const TensorView& lse, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_H_
