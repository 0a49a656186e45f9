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

absl::Status Run(const char* op, const TensorView& logits, const TensorView& targets, const TensorView& loss,
                 const TensorView& valid, const TensorView* dlogits, const CrossEntropyOptions& o,
                 const Stream& stream) {
  SG_CHECK_ARG(logits.rank() == 2 && logits.numel() > 0, op, ": logits must be non-empty [tokens, vocab], found ",
               logits.ToString());
  SG_CHECK_ARG((logits.dtype() == DType::kF32 || logits.dtype() == DType::kBF16) && logits.is_contiguous(), op,
               ": logits must be contiguous f32 or bf16, found ", logits.ToString());
  Problem p;
  p.rows = logits.dim(0);
  p.vocab = logits.dim(1);
  p.dtype = logits.dtype();
  p.ignore_index = o.ignore_index;
  p.grad_scale = o.grad_scale;
  p.grad_scale_from = o.grad_scale_from;
  SG_CHECK_ARG((targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64) && targets.rank() == 1 &&
                   targets.dim(0) == p.rows && targets.is_contiguous() && targets.device() == logits.device(),
               op, ": targets must be contiguous i32 or i64 [", p.rows, "]@", logits.device().ToString(), ", found ",
               targets.ToString());
  p.targets_i64 = targets.dtype() == DType::kI64;
  SG_RETURN_IF_ERROR(CheckScalar(op, "loss", loss, DType::kF32, logits.device()));
  SG_RETURN_IF_ERROR(CheckScalar(op, "valid", valid, DType::kI32, logits.device()));
  void* grad = nullptr;
  if (dlogits != nullptr) {
    SG_RETURN_IF_ERROR(ExpectTensor(*dlogits, absl::StrCat(op, " dlogits"), p.dtype, logits.shape(), logits.device()));
    grad = dlogits->raw();
  }
  if (logits.device().is_cpu()) {
    SG_RETURN_IF_ERROR(p.targets_i64
                           ? CheckTargets(op, targets.data<int64_t>(), p.rows, p.vocab, p.ignore_index)
                           : CheckTargets(op, targets.data<int32_t>(), p.rows, p.vocab, p.ignore_index));
    cross_entropy_internal::RunCpu(p, logits.raw(), targets.raw(), loss.data<float>(), valid.data<int32_t>(), grad);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_CHECK_ARG(p.rows < (int64_t(1) << 31) && p.vocab < (int64_t(1) << 31), op, ": at most 2^31 - 1 rows and vocab, found ",
               logits.ToString());
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

}  // namespace sg::kernels
