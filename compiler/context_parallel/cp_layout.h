// The load-balanced sequence layout of context parallelism: a sequence of `seq` positions is cut
// into 2*cp chunks and rank r holds chunks r and 2*cp-1-r, back to back, so under a causal mask
// every rank has the same attention work (an early chunk sees few keys, its partner many).
//
//   SG_ASSIGN_OR_RETURN(CpLayout layout, CpLayout::Create(/*seq=*/1001, /*cp=*/4));
//   int64_t local = layout.LocalSeq(rank);                    // rows this rank holds
//   SG_RETURN_IF_ERROR(ShardSequence(full_q, layout, rank, /*seq_dim=*/1, local_q, stream));
//
// Chunks are as equal as possible when 2*cp does not divide seq: the first seq % (2*cp) chunks are
// one longer (no padding, so no masked rows to undo). A chunk may be empty when seq < 2*cp.
#ifndef SGTRAIN_COMPILER_CONTEXT_PARALLEL_CP_LAYOUT_H_
#define SGTRAIN_COMPILER_CONTEXT_PARALLEL_CP_LAYOUT_H_

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

class CpLayout {
 public:
  // InvalidArgument unless seq >= 1 and cp >= 1.
  static absl::StatusOr<CpLayout> Create(int64_t seq, int cp);

  int64_t seq() const { return seq_; }
  int cp() const { return cp_; }
  int num_chunks() const { return 2 * cp_; }
  // Chunk i covers global positions [ChunkBegin(i), ChunkBegin(i) + ChunkSize(i)).
  int64_t ChunkSize(int i) const;
  int64_t ChunkBegin(int i) const;
  // The two chunks of `rank`, in the order they are stored locally: {rank, 2*cp-1-rank}.
  std::array<int, 2> Chunks(int rank) const { return {rank, 2 * cp_ - 1 - rank}; }
  // Local rows of `rank`: the sizes of its two chunks.
  int64_t LocalSeq(int rank) const;
  // Local row where `rank`'s second chunk starts (= the first chunk's size).
  int64_t SecondChunkRow(int rank) const { return ChunkSize(rank); }

 private:
  CpLayout(int64_t seq, int cp) : seq_(seq), cp_(cp) {}
  int64_t seq_;
  int cp_;
};

// Copies rows [src_begin, src_begin + count) of dimension `seq_dim` of `src` into rows
// [dst_begin, dst_begin + count) of the same dimension of `dst`. Both contiguous, one dtype and
// device, equal in every other dimension. One strided copy (cudaMemcpy2DAsync on CUDA, ordered on
// `stream`). InvalidArgument naming the mismatch.
absl::Status CopySeqRange(const TensorView& src, int64_t src_begin, const TensorView& dst,
                          int64_t dst_begin, int64_t count, int seq_dim, const Stream& stream);

// full (seq_dim has layout.seq() rows) -> local (seq_dim has layout.LocalSeq(rank) rows): the rows
// of `rank`'s two chunks.
absl::Status ShardSequence(const TensorView& full, const CpLayout& layout, int rank, int seq_dim,
                           const TensorView& local, const Stream& stream);
// The inverse: writes `rank`'s local rows into their places in `full` (other rows untouched).
absl::Status UnshardSequence(const TensorView& local, const CpLayout& layout, int rank, int seq_dim,
                             const TensorView& full, const Stream& stream);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_CONTEXT_PARALLEL_CP_LAYOUT_H_
