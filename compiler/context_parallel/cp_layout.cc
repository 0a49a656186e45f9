#include "compiler/context_parallel/cp_layout.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::compiler {

absl::StatusOr<CpLayout> CpLayout::Create(int64_t seq, int cp) {
  SG_CHECK_ARG(seq >= 1, "context parallel layout: seq must be >= 1, found ", seq);
  SG_CHECK_ARG(cp >= 1, "context parallel layout: cp must be >= 1, found ", cp);
  return CpLayout(seq, cp);
}

int64_t CpLayout::ChunkSize(int i) const {
  const int64_t n = num_chunks();
  return seq_ / n + (i < seq_ % n ? 1 : 0);
}

int64_t CpLayout::ChunkBegin(int i) const {
  const int64_t n = num_chunks(), base = seq_ / n, extra = seq_ % n;
  return i * base + std::min<int64_t>(i, extra);
}

int64_t CpLayout::LocalSeq(int rank) const {
  const auto c = Chunks(rank);
  return ChunkSize(c[0]) + ChunkSize(c[1]);
}

absl::Status CopySeqRange(const TensorView& src, int64_t src_begin, const TensorView& dst,
                          int64_t dst_begin, int64_t count, int seq_dim, const Stream& stream) {
  SG_CHECK_ARG(src.is_contiguous() && dst.is_contiguous(), "copy of sequence rows: tensors must be contiguous, found ",
               src.ToString(), " and ", dst.ToString());
  SG_CHECK_ARG(src.dtype() == dst.dtype() && src.device() == dst.device() && src.rank() == dst.rank(),
               "copy of sequence rows: expected one dtype, device and rank, found ", src.ToString(), " and ",
               dst.ToString());
  SG_CHECK_ARG(seq_dim >= 0 && seq_dim < src.rank(), "copy of sequence rows: seq_dim ", seq_dim,
               " out of range for ", src.ToString());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < src.rank(); ++d) {
    if (d == seq_dim) continue;
    SG_CHECK_ARG(src.dim(d) == dst.dim(d), "copy of sequence rows: dimension ", d, " differs: ",
                 src.ToString(), " vs ", dst.ToString());
    (d < seq_dim ? outer : inner) *= src.dim(d);
  }
  SG_CHECK_ARG(count >= 0 && src_begin >= 0 && dst_begin >= 0 && src_begin + count <= src.dim(seq_dim) &&
                   dst_begin + count <= dst.dim(seq_dim),
               "copy of sequence rows: rows [", src_begin, ", ", src_begin + count, ") -> [", dst_begin, ", ",
               dst_begin + count, ") out of range for ", src.ToString(), " -> ", dst.ToString());
  if (count == 0 || outer == 0 || inner == 0) return absl::OkStatus();
  const size_t elem = size_t(SizeOf(src.dtype()));
  const size_t width = size_t(count * inner) * elem;
  const size_t src_pitch = size_t(src.dim(seq_dim) * inner) * elem;
  const size_t dst_pitch = size_t(dst.dim(seq_dim) * inner) * elem;
  const char* s = static_cast<const char*>(src.raw()) + size_t(src_begin * inner) * elem;
  char* d = static_cast<char*>(dst.raw()) + size_t(dst_begin * inner) * elem;
  if (src.device().is_cpu()) {
    for (int64_t o = 0; o < outer; ++o) std::memcpy(d + size_t(o) * dst_pitch, s + size_t(o) * src_pitch, width);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(d, dst_pitch, s, src_pitch, width, size_t(outer),
                                            cudaMemcpyDeviceToDevice,
                                            static_cast<cudaStream_t>(stream.native())));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      absl::StrCat("copy of sequence rows: ", src.ToString(), " is on a device but this build has no CUDA"));
#endif
}

namespace {

absl::Status CheckSeq(const TensorView& t, int seq_dim, int64_t want, absl::string_view what) {
  SG_CHECK_ARG(seq_dim >= 0 && seq_dim < t.rank() && t.dim(seq_dim) == want, what, ": expected ", want,
               " rows in dimension ", seq_dim, ", found ", t.ToString());
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardSequence(const TensorView& full, const CpLayout& layout, int rank, int seq_dim,
                           const TensorView& local, const Stream& stream) {
  SG_CHECK_ARG(rank >= 0 && rank < layout.cp(), "shard sequence: rank must be in [0, ", layout.cp(), "), found ", rank);
  SG_RETURN_IF_ERROR(CheckSeq(full, seq_dim, layout.seq(), "shard sequence: full tensor"));
  SG_RETURN_IF_ERROR(CheckSeq(local, seq_dim, layout.LocalSeq(rank), "shard sequence: local tensor"));
  int64_t row = 0;
  for (int c : layout.Chunks(rank)) {
    SG_RETURN_IF_ERROR(CopySeqRange(full, layout.ChunkBegin(c), local, row, layout.ChunkSize(c), seq_dim, stream));
    row += layout.ChunkSize(c);
  }
  return absl::OkStatus();
}

absl::Status UnshardSequence(const TensorView& local, const CpLayout& layout, int rank, int seq_dim,
                             const TensorView& full, const Stream& stream) {
  SG_CHECK_ARG(rank >= 0 && rank < layout.cp(), "unshard sequence: rank must be in [0, ", layout.cp(), "), found ", rank);
  SG_RETURN_IF_ERROR(CheckSeq(full, seq_dim, layout.seq(), "unshard sequence: full tensor"));
  SG_RETURN_IF_ERROR(CheckSeq(local, seq_dim, layout.LocalSeq(rank), "unshard sequence: local tensor"));
  int64_t row = 0;
  for (int c : layout.Chunks(rank)) {
    SG_RETURN_IF_ERROR(CopySeqRange(local, row, full, layout.ChunkBegin(c), layout.ChunkSize(c), seq_dim, stream));
    row += layout.ChunkSize(c);
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler
