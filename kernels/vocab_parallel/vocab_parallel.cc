#include "kernels/vocab_parallel/vocab_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/embedding/embedding.h"
#include "kernels/vocab_parallel/vocab_parallel_internal.h"

namespace sg::kernels {
namespace {

using vocab_parallel_internal::CeProblem;

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

absl::Status CheckIds(const char* op, const TensorView& ids, Device device) {
  SG_CHECK_ARG((ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64) && ids.is_contiguous() &&
                   ids.device() == device,
               op, ": token ids must be contiguous i32 or i64 on ", device.ToString(), ", found ", ids.ToString());
  return absl::OkStatus();
}

absl::Status CheckFloat(const char* op, const char* what, const TensorView& t) {
  SG_CHECK_ARG((t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) && t.is_contiguous(), op, ": ", what,
               " must be contiguous f32 or bf16, found ", t.ToString());
  return absl::OkStatus();
}

// The shared checks of the cross-entropy pair; fills p.
absl::Status CheckCe(const char* op, const TensorView& logits, const TensorView& targets, int64_t start,
                     const VocabParallelCrossEntropyOptions& o, CeProblem* p) {
  SG_CHECK_ARG(logits.rank() == 2, op, ": logits must be [tokens, local vocab], found ", logits.ToString());
  SG_RETURN_IF_ERROR(CheckFloat(op, "logits", logits));
  p->rows = logits.dim(0);
  p->local_vocab = logits.dim(1);
  p->vocab_start = start;
  p->dtype = logits.dtype();
  p->ignore_index = o.ignore_index;
  SG_CHECK_ARG(start >= 0 && start + p->local_vocab <= o.vocab, op, ": the shard [", start, ", ",
               start + p->local_vocab, ") must lie inside the vocabulary [0, ", o.vocab, ")");
  SG_RETURN_IF_ERROR(CheckIds(op, targets, logits.device()));
  SG_CHECK_ARG(targets.numel() == p->rows, op, ": expected ", p->rows, " targets, found ", targets.ToString());
  p->targets_i64 = targets.dtype() == DType::kI64;
  if (logits.device().is_cpu()) {
    for (int64_t i = 0; i < p->rows; ++i) {
      const int64_t t = p->targets_i64 ? targets.data<int64_t>()[i] : int64_t(targets.data<int32_t>()[i]);
      SG_CHECK_ARG(t == o.ignore_index || (t >= 0 && t < o.vocab), op, ": targets[", i, "] = ", t,
                   " is neither ignore_index (", o.ignore_index, ") nor in the vocabulary [0, ", o.vocab, ")");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VocabParallelEmbeddingForward(const TensorView& tokens, const TensorView& table, int64_t vocab_start,
                                           const TensorView& out, const Stream& stream) {
  const char* op = "VocabParallelEmbeddingForward";
  SG_CHECK_ARG(table.rank() == 2 && vocab_start >= 0, op, ": table must be [local vocab, dim] with vocab_start >= 0, found ",
               table.ToString(), " from ", vocab_start);
  SG_RETURN_IF_ERROR(CheckFloat(op, "table", table));
  SG_RETURN_IF_ERROR(CheckIds(op, tokens, table.device()));
  Shape want = tokens.shape();
  want.push_back(table.dim(1));
  SG_RETURN_IF_ERROR(ExpectTensor(out, absl::StrCat(op, " out"), table.dtype(), want, table.device()));
  if (table.device().is_cpu()) {
    vocab_parallel_internal::EmbeddingForwardCpu(tokens.numel(), tokens.dtype() == DType::kI64, tokens.raw(),
                                                 table.dim(0), table.dim(1), table.dtype(), vocab_start, table.raw(),
                                                 out.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  // Shifted ids (others -1): kernels/embedding's CUDA path writes zero rows for them.
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(table.device()));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(std::max<int64_t>(tokens.numel(), 1) * 4));
  const TensorView local(scratch, DType::kI32, tokens.shape(), table.device());
  absl::Status st = vocab_parallel_internal::ShiftIdsCuda(tokens.numel(), tokens.dtype() == DType::kI64, tokens.raw(),
                                                          vocab_start, table.dim(0), local.data<int32_t>(),
                                                          stream.native());
  if (st.ok()) st = EmbeddingForward(local, table, out, stream);
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
#else
  (void)stream;
  return NoCuda(op);
#endif
}

absl::Status VocabParallelEmbeddingBackward(const TensorView& dout, const TensorView& tokens, int64_t vocab_start,
                                            const TensorView& dtable, const Stream& stream) {
  const char* op = "VocabParallelEmbeddingBackward";
  SG_CHECK_ARG(dtable.rank() == 2 && dtable.dtype() == DType::kF32 && dtable.is_contiguous() && vocab_start >= 0, op,
               ": dtable must be contiguous f32 [local vocab, dim] with vocab_start >= 0, found ", dtable.ToString(),
               " from ", vocab_start);
  SG_RETURN_IF_ERROR(CheckFloat(op, "dout", dout));
  SG_RETURN_IF_ERROR(CheckIds(op, tokens, dtable.device()));
  Shape want = tokens.shape();
  want.push_back(dtable.dim(1));
  SG_RETURN_IF_ERROR(ExpectTensor(dout, absl::StrCat(op, " dout"), dout.dtype(), want, dtable.device()));
  if (dtable.device().is_cpu()) {
    vocab_parallel_internal::EmbeddingBackwardCpu(tokens.numel(), tokens.dtype() == DType::kI64, tokens.raw(),
                                                  dtable.dim(0), dtable.dim(1), dout.dtype(), vocab_start, dout.raw(),
                                                  dtable.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(dtable.device()));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(std::max<int64_t>(tokens.numel(), 1) * 4));
  const TensorView local(scratch, DType::kI32, tokens.shape(), dtable.device());
  absl::Status st = vocab_parallel_internal::ShiftIdsCuda(tokens.numel(), tokens.dtype() == DType::kI64, tokens.raw(),
                                                          vocab_start, dtable.dim(0), local.data<int32_t>(),
                                                          stream.native());
  if (st.ok()) st = EmbeddingBackward(dout, local, dtable, stream);
  alloc->Free(scratch);
  return st;
#else
  (void)stream;
  return NoCuda(op);
#endif
}

absl::Status VocabParallelCrossEntropyStats(const TensorView& logits, const TensorView& targets, int64_t vocab_start,
                                            const VocabParallelCrossEntropyOptions& o, const TensorView& stats,
                                            const Stream& stream) {
  const char* op = "VocabParallelCrossEntropyStats";
  CeProblem p;
  SG_RETURN_IF_ERROR(CheckCe(op, logits, targets, vocab_start, o, &p));
  SG_RETURN_IF_ERROR(ExpectTensor(stats, absl::StrCat(op, " stats"), DType::kF32, {3, p.rows}, logits.device()));
  if (logits.device().is_cpu()) {
    vocab_parallel_internal::StatsCpu(p, logits.raw(), targets.raw(), stats.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return vocab_parallel_internal::StatsCuda(p, logits.raw(), targets.raw(), stats.data<float>(),
                                            logits.device().ordinal, stream.native());
#else
  (void)stream;
  return NoCuda(op);
#endif
}

absl::Status VocabParallelCrossEntropyFinish(const TensorView& logits, const TensorView& targets, int64_t vocab_start,
                                             const TensorView& gathered, const TensorView& dloss,
                                             const VocabParallelCrossEntropyOptions& o, const TensorView& loss,
                                             const TensorView& dlogits, const Stream& stream) {
  const char* op = "VocabParallelCrossEntropyFinish";
  CeProblem p;
  SG_RETURN_IF_ERROR(CheckCe(op, logits, targets, vocab_start, o, &p));
  const Device d = logits.device();
  SG_CHECK_ARG(gathered.dtype() == DType::kF32 && gathered.device() == d && gathered.is_contiguous() &&
                   p.rows > 0 && gathered.numel() % (3 * p.rows) == 0 && gathered.numel() > 0,
               op, ": gathered must be f32 [ranks, 3, ", p.rows, "] on ", d.ToString(), ", found ", gathered.ToString());
  p.ranks = gathered.numel() / (3 * p.rows);
  SG_CHECK_ARG(loss.numel() == 1 && loss.dtype() == DType::kF32 && loss.device() == d, op,
               ": loss must be a one-element f32 tensor on ", d.ToString(), ", found ", loss.ToString());
  // Empty: no buffer (a default TensorView is a scalar shape with no data), or no elements.
  const bool no_dloss = dloss.raw() == nullptr || dloss.numel() == 0;
  SG_CHECK_ARG(no_dloss || (dloss.numel() == 1 && dloss.dtype() == DType::kF32 && dloss.device() == d), op,
               ": dloss must be empty or a one-element f32 tensor on ", d.ToString(), ", found ", dloss.ToString());
  void* grad = nullptr;
  if (dlogits.raw() != nullptr) {
    SG_RETURN_IF_ERROR(ExpectTensor(dlogits, absl::StrCat(op, " dlogits"), p.dtype, logits.shape(), d));
    grad = dlogits.raw();
  }
  const float* seed = no_dloss ? nullptr : dloss.data<float>();
  if (d.is_cpu()) {
    vocab_parallel_internal::FinishCpu(p, logits.raw(), targets.raw(), gathered.data<float>(), seed,
                                       loss.data<float>(), grad);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return vocab_parallel_internal::FinishCuda(p, logits.raw(), targets.raw(), gathered.data<float>(), seed,
                                             loss.data<float>(), grad, d.ordinal, stream.native());
#else
  (void)stream;
  return NoCuda(op);
#endif
}

}  // namespace sg::kernels
