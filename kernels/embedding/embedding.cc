#include "kernels/embedding/embedding.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/embedding/embedding_internal.h"

namespace sg::kernels {
namespace {

using embedding_internal::Problem;

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

template <typename I>
absl::Status CheckIds(const char* op, const I* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    SG_CHECK_ARG(ids[i] >= 0 && ids[i] < vocab, op, ": tokens[", i, "] = ", ids[i], " is outside the vocabulary [0, ",
                 vocab, ")");
  }
  return absl::OkStatus();
}

// Checks tokens and the table (or dtable) shape; `rows_tensor` is [..., dim] of `dtype`.
absl::StatusOr<Problem> Check(const char* op, const TensorView& tokens, const TensorView& table, DType table_dtype,
                              const TensorView& rows_tensor, const char* rows_name) {
  SG_CHECK_ARG((tokens.dtype() == DType::kI32 || tokens.dtype() == DType::kI64) && tokens.is_contiguous(), op,
               ": tokens must be contiguous i32 or i64, found ", tokens.ToString());
  SG_CHECK_ARG(table.rank() == 2 && table.numel() > 0, op, ": table must be non-empty [vocab, dim], found ",
               table.ToString());
  SG_CHECK_ARG(table.dtype() == table_dtype, op, ": table must be ", DTypeName(table_dtype), ", found ",
               table.ToString());
  SG_CHECK_ARG(table.is_contiguous() && table.device() == tokens.device(), op, ": table must be contiguous on ",
               tokens.device().ToString(), ", found ", table.ToString());
  Problem p;
  p.tokens = tokens.numel();
  p.vocab = table.dim(0);
  p.dim = table.dim(1);
  p.tokens_i64 = tokens.dtype() == DType::kI64;
  p.dtype = rows_tensor.dtype();
  SG_CHECK_ARG(IsFloating(p.dtype), op, ": ", rows_name, " must be f32, bf16 or f16, found ",
               rows_tensor.ToString());
  Shape rows_shape = tokens.shape();
  rows_shape.push_back(p.dim);
  SG_RETURN_IF_ERROR(ExpectTensor(rows_tensor, absl::StrCat(op, " ", rows_name), p.dtype, rows_shape, tokens.device()));
  if (tokens.device().is_cpu()) {
    SG_RETURN_IF_ERROR(p.tokens_i64 ? CheckIds(op, tokens.data<int64_t>(), p.tokens, p.vocab)
                                    : CheckIds(op, tokens.data<int32_t>(), p.tokens, p.vocab));
  }
  return p;
}

}  // namespace

absl::Status EmbeddingForward(const TensorView& tokens, const TensorView& table, const TensorView& out,
                              const Stream& stream) {
  SG_CHECK_ARG(IsFloating(table.dtype()),
               "EmbeddingForward: table must be f32, bf16 or f16, found ", table.ToString());
  SG_ASSIGN_OR_RETURN(Problem p, Check("EmbeddingForward", tokens, table, table.dtype(), out, "out"));
  SG_CHECK_ARG(out.dtype() == table.dtype(), "EmbeddingForward: out must have the table's dtype ",
               DTypeName(table.dtype()), ", found ", out.ToString());
  if (p.tokens == 0) return absl::OkStatus();
  if (tokens.device().is_cpu()) {
    embedding_internal::ForwardCpu(p, tokens.raw(), table.raw(), out.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return embedding_internal::ForwardCuda(p, tokens.raw(), table.raw(), out.raw(), stream.native());
#else
  return NoCuda("EmbeddingForward");
#endif
}

absl::Status EmbeddingBackward(const TensorView& dout, const TensorView& tokens, const TensorView& dtable,
                               const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, Check("EmbeddingBackward", tokens, dtable, DType::kF32, dout, "dout"));
  SG_CHECK_ARG(p.tokens < (int64_t(1) << 31) && p.vocab < (int64_t(1) << 31) - 1,
               "EmbeddingBackward: at most 2^31 - 1 tokens and vocabulary rows, found ", p.tokens, " tokens, vocab ",
               p.vocab);
  if (tokens.device().is_cpu()) {
    embedding_internal::BackwardCpu(p, dout.raw(), tokens.raw(), dtable.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return embedding_internal::BackwardCuda(p, dout.raw(), tokens.raw(), dtable.data<float>(),
                                          tokens.device().ordinal, stream.native());
#else
  return NoCuda("EmbeddingBackward");
#endif
}

}  // namespace sg::kernels
