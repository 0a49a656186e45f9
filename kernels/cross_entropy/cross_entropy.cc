#include "kernels/cross_entropy/cross_entropy.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cross_entropy/cross_entropy_internal.h"

namespace sg::kernels {
namespace {

using cross_entropy_internal::Problem;

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

absl::Status CheckScalar(const char* op, const char* what, const TensorView& t, DType dtype, Device device) {
  SG_CHECK_ARG(t.numel() == 1 && t.rank() <= 1 && t.dtype() == dtype && t.device() == device && t.raw() != nullptr,
               op, ": ", what, " must be a one-element ", DTypeName(dtype), " tensor on ", device.ToString(),
               ", found ", t.ToString());
  return absl::OkStatus();
}

template <typename I>
absl::Status CheckTargets(const char* op, const I* t, int64_t n, int64_t vocab, int64_t ignore) {
  for (int64_t i = 0; i < n; ++i) {
    SG_CHECK_ARG(t[i] == ignore || (t[i] >= 0 && t[i] < vocab), op, ": targets[", i, "] = ", t[i],
                 " is neither ignore_index (", ignore, ") nor in the vocabulary [0, ", vocab, ")");
  }
  return absl::OkStatus();
}

absl::Status CheckTargetsTensor(const char* op, const TensorView& targets, int64_t rows, Device device) {
  SG_CHECK_ARG((targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64) && targets.rank() == 1 &&
                   targets.dim(0) == rows && targets.is_contiguous() && targets.device() == device,
               op, ": targets must be contiguous i32 or i64 [", rows, "]@", device.ToString(), ", found ",
               targets.ToString());
  return absl::OkStatus();
}

// The problem of logits [rows, vocab] and targets [rows], checked (on the CPU the targets' values
// too); dlogits, when given, must match the logits.
absl::StatusOr<Problem> MakeProblem(const char* op, const TensorView& logits, const TensorView& targets,
                                    const TensorView* dlogits, const CrossEntropyOptions& o) {
  SG_CHECK_ARG(logits.rank() == 2 && logits.numel() > 0, op, ": logits must be non-empty [tokens, vocab], found ",
               logits.ToString());
  SG_CHECK_ARG(IsFloating(logits.dtype()) && logits.is_contiguous(), op,
               ": logits must be contiguous f32, bf16 or f16, found ", logits.ToString());
  Problem p;
  p.rows = logits.dim(0);
  p.vocab = logits.dim(1);
  p.dtype = logits.dtype();
  p.ignore_index = o.ignore_index;
  p.grad_scale = o.grad_scale;
  p.grad_scale_from = o.grad_scale_from;
  SG_RETURN_IF_ERROR(CheckTargetsTensor(op, targets, p.rows, logits.device()));
  p.targets_i64 = targets.dtype() == DType::kI64;
  if (dlogits != nullptr) {
    SG_RETURN_IF_ERROR(ExpectTensor(*dlogits, absl::StrCat(op, " dlogits"), p.dtype, logits.shape(), logits.device()));
  }
  if (logits.device().is_cpu()) {
    SG_RETURN_IF_ERROR(p.targets_i64
                           ? CheckTargets(op, targets.data<int64_t>(), p.rows, p.vocab, p.ignore_index)
                           : CheckTargets(op, targets.data<int32_t>(), p.rows, p.vocab, p.ignore_index));
  } else {
    SG_CHECK_ARG(p.rows < (int64_t(1) << 31) && p.vocab < (int64_t(1) << 31), op,
                 ": at most 2^31 - 1 rows and vocab, found ", logits.ToString());
  }
  return p;
}

absl::Status Run(const char* op, const TensorView& logits, const TensorView& targets, const TensorView& loss,
                 const TensorView& valid, const TensorView* dlogits, const CrossEntropyOptions& o,
                 const Stream& stream) {
  SG_ASSIGN_OR_RETURN(const Problem p, MakeProblem(op, logits, targets, dlogits, o));
  SG_RETURN_IF_ERROR(CheckScalar(op, "loss", loss, DType::kF32, logits.device()));
  SG_RETURN_IF_ERROR(CheckScalar(op, "valid", valid, DType::kI32, logits.device()));
  void* grad = dlogits != nullptr ? dlogits->raw() : nullptr;
  if (logits.device().is_cpu()) {
    cross_entropy_internal::RunCpu(p, logits.raw(), targets.raw(), loss.data<float>(), valid.data<int32_t>(), grad);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return cross_entropy_internal::RunCuda(p, logits.raw(), targets.raw(), loss.data<float>(), valid.data<int32_t>(),
                                         grad, logits.device().ordinal, stream.native());
#else
  return NoCuda(op);
#endif
}

}  // namespace

absl::Status CrossEntropyForwardBackward(const TensorView& logits, const TensorView& targets, const TensorView& loss,
                                         const TensorView& valid, const TensorView& dlogits,
                                         const CrossEntropyOptions& options, const Stream& stream) {
  return Run("CrossEntropyForwardBackward", logits, targets, loss, valid, &dlogits, options, stream);
}

absl::Status CrossEntropyForward(const TensorView& logits, const TensorView& targets, const TensorView& loss,
                                 const TensorView& valid, const CrossEntropyOptions& options, const Stream& stream) {
  return Run("CrossEntropyForward", logits, targets, loss, valid, nullptr, options, stream);
}

absl::Status CrossEntropyCount(const TensorView& targets, const TensorView& valid, const CrossEntropyOptions& options,
                               const Stream& stream) {
  constexpr const char* op = "CrossEntropyCount";
  SG_CHECK_ARG(targets.rank() == 1, op, ": targets must be [tokens], found ", targets.ToString());
  SG_RETURN_IF_ERROR(CheckTargetsTensor(op, targets, targets.dim(0), targets.device()));
  SG_RETURN_IF_ERROR(CheckScalar(op, "valid", valid, DType::kI32, targets.device()));
  Problem p;
  p.rows = targets.dim(0);
  p.ignore_index = options.ignore_index;
  p.targets_i64 = targets.dtype() == DType::kI64;
  if (targets.device().is_cpu()) {
    cross_entropy_internal::CountCpu(p, targets.raw(), valid.data<int32_t>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return cross_entropy_internal::CountCuda(p, targets.raw(), valid.data<int32_t>(), stream.native());
#else
  return NoCuda(op);
#endif
}

absl::Status CrossEntropyRows(const TensorView& logits, const TensorView& targets, const TensorView& valid,
                              const TensorView& row_loss, const TensorView& dlogits, const CrossEntropyOptions& options,
                              const Stream& stream) {
  constexpr const char* op = "CrossEntropyRows";
  SG_ASSIGN_OR_RETURN(const Problem p, MakeProblem(op, logits, targets, &dlogits, options));
  SG_RETURN_IF_ERROR(CheckScalar(op, "valid", valid, DType::kI32, logits.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(row_loss, absl::StrCat(op, " row_loss"), DType::kF32, {p.rows}, logits.device()));
  if (logits.device().is_cpu()) {
    cross_entropy_internal::RowsCpu(p, logits.raw(), targets.raw(), valid.data<int32_t>(), row_loss.data<float>(),
                                    dlogits.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return cross_entropy_internal::RowsCuda(p, logits.raw(), targets.raw(), valid.data<int32_t>(),
                                          row_loss.data<float>(), dlogits.raw(), stream.native());
#else
  return NoCuda(op);
#endif
}

absl::Status CrossEntropyFinish(const TensorView& row_loss, const TensorView& valid, const TensorView& loss,
                                const Stream& stream) {
  constexpr const char* op = "CrossEntropyFinish";
  SG_CHECK_ARG(row_loss.rank() == 1 && row_loss.dtype() == DType::kF32 && row_loss.is_contiguous(), op,
               ": row_loss must be contiguous f32 [tokens], found ", row_loss.ToString());
  SG_RETURN_IF_ERROR(CheckScalar(op, "valid", valid, DType::kI32, row_loss.device()));
  SG_RETURN_IF_ERROR(CheckScalar(op, "loss", loss, DType::kF32, row_loss.device()));
  if (row_loss.device().is_cpu()) {
    cross_entropy_internal::FinishCpu(row_loss.dim(0), row_loss.data<float>(), valid.data<int32_t>(),
                                      loss.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return cross_entropy_internal::FinishCuda(row_loss.dim(0), row_loss.data<float>(), valid.data<int32_t>(),
                                            loss.data<float>(), stream.native());
#else
  return NoCuda(op);
#endif
}

}  // namespace sg::kernels
