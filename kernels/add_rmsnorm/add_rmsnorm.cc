#include "kernels/add_rmsnorm/add_rmsnorm.h"

#include "absl/strings/str_cat.h"
#include "kernels/add_rmsnorm/add_rmsnorm_internal.h"
#include "kernels/core/status.h"

namespace sg::kernels {
namespace {

using add_rmsnorm_internal::Problem;

// `t` is the reference tensor (x forward, h backward): its shape, dtype and device fix the others.
absl::StatusOr<Problem> CheckArgs(const char* op, const char* name, const TensorView& t, const TensorView& weight) {
  SG_CHECK_ARG(t.rank() >= 1 && t.numel() > 0, op, ": ", name, " must be non-empty, found ", t.ToString());
  SG_CHECK_ARG(IsFloating(t.dtype()), op, ": ", name, " must be f32, bf16 or f16, found ",
               t.ToString());
  SG_CHECK_ARG(t.is_contiguous(), op, ": ", name, " must be contiguous, found ", t.ToString());
  Problem p;
  p.dim = t.dim(-1);
  p.rows = t.numel() / p.dim;
  p.dtype = t.dtype();
  SG_RETURN_IF_ERROR(ExpectTensor(weight, absl::StrCat(op, " weight"), t.dtype(), {p.dim}, t.device()));
  return p;
}

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

}  // namespace

absl::Status AddRmsNormForward(const TensorView& x, const TensorView& delta, const TensorView& weight, float eps,
                               const TensorView& h, const TensorView& y, const TensorView& rstd,
                               const Stream& stream) {
  constexpr const char* kOp = "AddRmsNormForward";
  SG_ASSIGN_OR_RETURN(Problem p, CheckArgs(kOp, "x", x, weight));
  SG_CHECK_ARG(eps >= 0, kOp, ": eps must be >= 0, found ", eps);
  p.eps = eps;
  SG_RETURN_IF_ERROR(ExpectTensor(delta, "AddRmsNormForward delta", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(h, "AddRmsNormForward h", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(y, "AddRmsNormForward y", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "AddRmsNormForward rstd", DType::kF32, {p.rows}, x.device()));
  SG_CHECK_ARG(y.raw() != x.raw() && y.raw() != delta.raw() && y.raw() != h.raw(), kOp,
               ": y must not alias x, delta or h");
  if (x.device().is_cpu()) {
    add_rmsnorm_internal::ForwardCpu(p, x.raw(), delta.raw(), weight.raw(), h.raw(), y.raw(), rstd.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return add_rmsnorm_internal::ForwardCuda(p, x.raw(), delta.raw(), weight.raw(), h.raw(), y.raw(),
                                           rstd.data<float>(), x.device().ordinal, stream.native());
#else
  return NoCuda(kOp);
#endif
}

absl::Status AddRmsNormStatsForward(const TensorView& x, const TensorView& delta, float eps, const TensorView& h,
                                    const TensorView& rstd, const Stream& stream) {
  constexpr const char* kOp = "AddRmsNormStatsForward";
  SG_CHECK_ARG(x.rank() >= 1 && x.numel() > 0, kOp, ": x must be non-empty, found ", x.ToString());
  SG_CHECK_ARG(IsFloating(x.dtype()), kOp, ": x must be f32, bf16 or f16, found ", x.ToString());
  SG_CHECK_ARG(x.is_contiguous(), kOp, ": x must be contiguous, found ", x.ToString());
  SG_CHECK_ARG(eps >= 0, kOp, ": eps must be >= 0, found ", eps);
  Problem p;
  p.dim = x.dim(-1);
  p.rows = x.numel() / p.dim;
  p.dtype = x.dtype();
  p.eps = eps;
  SG_RETURN_IF_ERROR(ExpectTensor(delta, "AddRmsNormStatsForward delta", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(h, "AddRmsNormStatsForward h", x.dtype(), x.shape(), x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "AddRmsNormStatsForward rstd", DType::kF32, {p.rows}, x.device()));
  if (x.device().is_cpu()) {
    add_rmsnorm_internal::ForwardCpu(p, x.raw(), delta.raw(), nullptr, h.raw(), nullptr, rstd.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return add_rmsnorm_internal::ForwardCuda(p, x.raw(), delta.raw(), nullptr, h.raw(), nullptr, rstd.data<float>(),
                                           x.device().ordinal, stream.native());
#else
  return NoCuda(kOp);
#endif
}

absl::Status AddRmsNormBackward(const TensorView& dy, const TensorView& dh_in, const TensorView& h,
                                const TensorView& weight, const TensorView& rstd, const TensorView& dh,
                                const TensorView& dweight, const Stream& stream) {
  constexpr const char* kOp = "AddRmsNormBackward";
  SG_ASSIGN_OR_RETURN(Problem p, CheckArgs(kOp, "h", h, weight));
  SG_RETURN_IF_ERROR(ExpectTensor(dy, "AddRmsNormBackward dy", h.dtype(), h.shape(), h.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dh_in, "AddRmsNormBackward dh_in", h.dtype(), h.shape(), h.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dh, "AddRmsNormBackward dh", h.dtype(), h.shape(), h.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "AddRmsNormBackward rstd", DType::kF32, {p.rows}, h.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dweight, "AddRmsNormBackward dweight", DType::kF32, {p.dim}, h.device()));
  SG_CHECK_ARG(dh.raw() != dy.raw() && dh.raw() != h.raw(), kOp, ": dh must not alias dy or h (it may alias dh_in)");
  if (h.device().is_cpu()) {
    add_rmsnorm_internal::BackwardCpu(p, dy.raw(), dh_in.raw(), h.raw(), weight.raw(), rstd.data<float>(), dh.raw(),
                                      dweight.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return add_rmsnorm_internal::BackwardCuda(p, dy.raw(), dh_in.raw(), h.raw(), weight.raw(), rstd.data<float>(),
                                            dh.raw(), dweight.data<float>(), h.device().ordinal, stream.native());
#else
  return NoCuda(kOp);
#endif
}

}  // namespace sg::kernels
