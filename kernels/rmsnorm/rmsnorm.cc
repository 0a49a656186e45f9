#include "kernels/rmsnorm/rmsnorm.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/rmsnorm/rmsnorm_internal.h"

namespace sg::kernels {
namespace {

using rmsnorm_internal::Problem;

absl::StatusOr<Problem> CheckArgs(const char* op, const TensorView& x, const TensorView& weight) {
  SG_CHECK_ARG(x.rank() >= 1 && x.numel() > 0, op, ": x must be non-empty, found ", x.ToString());
  SG_CHECK_ARG(IsFloating(x.dtype()), op,
               ": x must be f32, bf16 or f16, found ", x.ToString());
  SG_CHECK_ARG(x.is_contiguous(), op, ": x must be contiguous, found ", x.ToString());
  Problem p;
  p.dim = x.dim(-1);
  p.rows = x.numel() / p.dim;
  p.dtype = x.dtype();
  SG_RETURN_IF_ERROR(ExpectTensor(weight, absl::StrCat(op, " weight"), x.dtype(), {p.dim}, x.device()));
  return p;
}

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

}  // namespace

absl::Status RmsNormForward(const TensorView& x, const TensorView& weight, float eps,
                            const TensorView& y, const TensorView& rstd, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, CheckArgs("RmsNormForward", x, weight));
  p.eps = eps;
  SG_CHECK_ARG(eps >= 0, "RmsNormForward: eps must be >= 0, found ", eps);
  SG_RETURN_IF_ERROR(ExpectTensor(y, "RmsNormForward y", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "RmsNormForward rstd", DType::kF32, {p.rows}, x.device()));
  if (x.device().is_cpu()) {
    rmsnorm_internal::ForwardCpu(p, x.raw(), weight.raw(), y.raw(), rstd.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return rmsnorm_internal::ForwardCuda(p, x.raw(), weight.raw(), y.raw(), rstd.data<float>(),
                                       x.device().ordinal, stream.native());
#else
  return NoCuda("RmsNormForward");
#endif
}

absl::Status RmsNormBackward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                             const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                             const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, CheckArgs("RmsNormBackward", x, weight));
  SG_RETURN_IF_ERROR(ExpectTensor(dy, "RmsNormBackward dy", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dx, "RmsNormBackward dx", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "RmsNormBackward rstd", DType::kF32, {p.rows}, x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dweight, "RmsNormBackward dweight", DType::kF32, {p.dim}, x.device()));
  if (x.device().is_cpu()) {
    rmsnorm_internal::BackwardCpu(p, dy.raw(), x.raw(), weight.raw(), rstd.data<float>(), dx.raw(),
                                  dweight.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return rmsnorm_internal::BackwardCuda(p, dy.raw(), x.raw(), weight.raw(), rstd.data<float>(), dx.raw(),
                                        dweight.data<float>(), x.device().ordinal, stream.native(),
                                        rmsnorm_launch::PlainBackwardConfig(p.dim, SizeOf(p.dtype)));
#else
  return NoCuda("RmsNormBackward");
#endif
}

}  // namespace sg::kernels
