// Token embedding: a row gather forward and a deterministic scatter-add backward.
//
//   // tokens: i32 or i64 [batch, seq]; table: [vocab, dim] (f32, bf16 or f16); out: [batch, seq, dim]
//   SG_RETURN_IF_ERROR(sg::kernels::EmbeddingForward(tokens, table, out, stream));
//   // dout: [batch, seq, dim] (table's dtype); dtable: f32 [vocab, dim], overwritten
//   SG_RETURN_IF_ERROR(sg::kernels::EmbeddingBackward(dout, tokens, dtable, stream));
//
// Out-of-range token ids (< 0 or >= vocab): the CPU path returns InvalidArgument naming the first
// one. The CUDA path cannot report them without a host synchronization, so it stays memory-safe
// instead: such a token's output row is all zeros and its gradient is dropped (never an
// out-of-bounds access). Validate ids upstream (the tokenizer/data loader) if that matters.
#ifndef SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_H_
#define SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_H_

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// out[..., :] = table[tokens[...], :]. out has tokens' shape plus [dim] and table's dtype.
absl::Status EmbeddingForward(const TensorView& tokens, const TensorView& table, const TensorView& out,
                              const Stream& stream);

// dtable[v, :] = sum of dout[i, :] over the tokens i with tokens[i] == v, summed in f32 in token
// order (i ascending): 0 + dout[i0, :] + dout[i1, :] + ..., so the result is bitwise reproducible
// and bitwise equal between CPU and CUDA; rows of unused ids are zero. On CUDA no float atomics:
// each row's token positions are gathered in ascending order first (counted and scattered, then
// each run sorted; by default `stream` prepares and sums the rows with tokens while a side stream
// of the device zeroes the others, joined before return, so the call stays one stream's work to its
// caller and capturable in a CUDA graph; other preparations, SG_EMBEDDING_BWD=atomic /
// rows: on one stream), then each column's terms are added in that order. (SG_EMBEDDING_BWD selects
// the CUDA kernel per call, for benchmarks: see embedding.cu.) The side stream is one per device,
// shared by every caller: calls from several host threads are safe (serialized on it), but while one
// thread captures a CUDA graph through it, another must not call it eagerly on that device (as with
// any work joined into a capture). The first call on a device creates it; a first call made while
// capturing runs the one-stream preparation instead (the same result, bit for bit).
absl::Status EmbeddingBackward(const TensorView& dout, const TensorView& tokens, const TensorView& dtable,
                               const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_H_
