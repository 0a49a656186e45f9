// Vocabulary-parallel (Megatron) embedding and softmax cross-entropy: each tensor-parallel rank
// holds rows [vocab_start, vocab_start + local_vocab) of the embedding table and of the LM head,
// so of the logits' last dim. These are the per-rank kernels; the collectives between them are
// the caller's (compiler/tensor_parallel.h runs them on its comm stream):
//
//   VocabParallelEmbeddingForward(tokens, table_shard, start, out, s);  // then all-reduce(sum) out
//   VocabParallelCrossEntropyStats(logits_shard, targets, start, o, stats, s);        // f32 [3, rows]
//   all-gather stats over the tp group into gathered                                 // f32 [T, 3, rows]
//   VocabParallelCrossEntropyFinish(logits_shard, targets, start, gathered, dloss, o, loss, dlogits, s);
//
// The full-vocabulary logits never exist on one rank: each rank sends 3 floats per token. One
// all-gather of (local max, local sum-exp, local target logit) stands in for Megatron's
// all-reduce(max) + all-reduce(sum) + all-reduce(target logit): every rank then combines the T
// triples itself (max m = max_r m_r, sum-exp s = sum_r s_r exp(m_r - m), target t = sum_r t_r,
// only the owner's t_r nonzero), one collective instead of three, of the same tiny size.
#ifndef SGTRAIN_KERNELS_VOCAB_PARALLEL_VOCAB_PARALLEL_H_
#define SGTRAIN_KERNELS_VOCAB_PARALLEL_VOCAB_PARALLEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// out[i, :] = table[tokens[i] - vocab_start, :] when that row is in this shard, else zeros.
// tokens: i32/i64 [...]; table: [local_vocab, dim] f32 or bf16; out: tokens' shape + [dim],
// table's dtype. local_vocab may be 0 (out all zeros). Summing out over the ranks gives the
// full lookup.
absl::Status VocabParallelEmbeddingForward(const TensorView& tokens, const TensorView& table, int64_t vocab_start,
                                           const TensorView& out, const Stream& stream);

// dtable[v, :] = sum of dout[i, :] over tokens i == vocab_start + v (f32, overwritten; rows of
// unused ids zero), deterministic: on CUDA the ids are shifted into the shard (others to -1) and
// kernels/embedding's sorted backward runs, which drops out-of-range ids.
absl::Status VocabParallelEmbeddingBackward(const TensorView& dout, const TensorView& tokens, int64_t vocab_start,
                                            const TensorView& dtable, const Stream& stream);

struct VocabParallelCrossEntropyOptions {
  int64_t vocab = 0;  // the full vocabulary: targets outside [0, vocab) are an error (CPU)
  int64_t ignore_index = -100;
};

// Per token row i of this rank's logits [rows, local_vocab] (f32 or bf16): stats[0, i] = max_j
// logits[i, j] (-inf for local_vocab 0), stats[1, i] = sum_j exp(logits[i, j] - stats[0, i]),
// stats[2, i] = logits[i, targets[i] - vocab_start] when this rank owns the target, else 0.
// stats: f32 [3, rows]. targets: i32/i64 [rows].
absl::Status VocabParallelCrossEntropyStats(const TensorView& logits, const TensorView& targets, int64_t vocab_start,
                                            const VocabParallelCrossEntropyOptions& options, const TensorView& stats,
                                            const Stream& stream);

// With gathered = every rank's stats in rank order (f32 [T, 3, rows]): loss (f32 scalar) = the
// mean over non-ignored tokens of logsumexp - target logit (0 when all are ignored); when dlogits
// is non-empty (logits' shape and dtype, may alias logits), dlogits[i, j] = dloss / valid *
// (softmax_j - [vocab_start + j == target]) with zero rows for ignored tokens. dloss: f32 scalar
// on the device (the loss cotangent, e.g. a data-parallel rank's token share), read by the kernel;
// empty: 1. The loss is the same on every rank.
absl::Status VocabParallelCrossEntropyFinish(const TensorView& logits, const TensorView& targets, int64_t vocab_start,
                                             const TensorView& gathered, const TensorView& dloss,
                                             const VocabParallelCrossEntropyOptions& options, const TensorView& loss,
                                             const TensorView& dlogits, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_VOCAB_PARALLEL_VOCAB_PARALLEL_H_
