// Fused softmax cross-entropy over the vocabulary: the mean loss and its gradient with respect to
// the logits in one pass over the logits, without an f32 copy of them.
//
//   // logits: [tokens, vocab] bf16, f16 or f32; targets: i32 or i64 [tokens]
//   // loss: f32 scalar, valid: i32 scalar (device tensors, written on `stream`, no host sync)
//   SG_RETURN_IF_ERROR(sg::kernels::CrossEntropyForwardBackward(logits, targets, loss, valid,
//                                                               /*dlogits=*/logits, {}, stream));
//
// loss = (1 / valid) * sum over tokens i with targets[i] != ignore_index of
//        logsumexp(logits[i, :]) - logits[i, targets[i]]           (0 when valid == 0)
// dlogits[i, j] = grad_scale / valid * (softmax(logits[i, :])_j - [j == targets[i]]), zero rows for
// ignored tokens: the gradient of grad_scale * loss. All arithmetic in f32; dlogits is rounded once
// to the logits' dtype and may be the logits tensor itself (in place, as llm.c does).
// Out-of-range targets (not ignore_index, outside [0, vocab)): InvalidArgument on the CPU; on CUDA
// (no host sync to report it) that token's loss is NaN, so the mean loss is NaN.
//
// CUDA: one block per token row. Rows of up to 32768 bf16 / 16384 f32 logits (vocab a multiple of
// 8 / 4) are held in registers: read once from HBM, written once. Longer or unaligned rows run an
// online max/sum-exp over the row in 16-byte chunks and re-read it (mostly from L2) to write dlogits.
#ifndef SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_H_
#define SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  // Multiplies dlogits: the upstream gradient of the loss (e.g. 1 / gradient-accumulation steps).
  float grad_scale = 1.f;
  // Optional: a one-element f32 on the logits' device that also multiplies dlogits, read when the
  // kernel runs (not when it is launched), so a captured CUDA graph uses its current value: e.g. a
  // data-parallel rank's token share written before each replay, or the dynamic loss scale of f16
  // training. Null: grad_scale alone.
  const float* grad_scale_from = nullptr;
};

// Writes loss (f32, one element) and valid (i32, one element: tokens not ignored), and dlogits
// (logits' shape and dtype; may alias logits).
absl::Status CrossEntropyForwardBackward(const TensorView& logits, const TensorView& targets, const TensorView& loss,
                                         const TensorView& valid, const TensorView& dlogits,
                                         const CrossEntropyOptions& options, const Stream& stream);

// The loss and valid count only (evaluation): the same kernels without the dlogits writes.
absl::Status CrossEntropyForward(const TensorView& logits, const TensorView& targets, const TensorView& loss,
                                 const TensorView& valid, const CrossEntropyOptions& options, const Stream& stream);

// The same computation over blocks of rows, for a caller that produces the logits a block at a time
// (the compiler's chunked LM head, which never holds [tokens, vocab] logits at once):
//
//   CrossEntropyCount(targets, valid, o, s);                        // all tokens
//   for each block b of rows:                                        // logits[b], targets[b]
//     CrossEntropyRows(logits_b, targets_b, valid, row_loss_b, dlogits_b, o, s);
//   CrossEntropyFinish(row_loss, valid, loss, s);                    // every row's loss
//
// gives bitwise the loss, valid and dlogits of CrossEntropyForwardBackward over all the rows.
// row_loss: f32 [rows of the block] (its rows of an f32 [tokens] buffer); dlogits may alias the
// block's logits.
absl::Status CrossEntropyCount(const TensorView& targets, const TensorView& valid, const CrossEntropyOptions& options,
                               const Stream& stream);
absl::Status CrossEntropyRows(const TensorView& logits, const TensorView& targets, const TensorView& valid,
                              const TensorView& row_loss, const TensorView& dlogits, const CrossEntropyOptions& options,
                              const Stream& stream);
absl::Status CrossEntropyFinish(const TensorView& row_loss, const TensorView& valid, const TensorView& loss,
                                const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_CROSS_ENTROPY_CROSS_ENTROPY_H_
