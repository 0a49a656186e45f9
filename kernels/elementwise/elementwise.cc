#include "kernels/elementwise/elementwise.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise_internal.h"

namespace sg::kernels {
namespace {

using elementwise_internal::Axpby;

absl::Status CheckFloat(const char* op, const char* what, const TensorView& t) {
  SG_CHECK_ARG(IsFloating(t.dtype()), op, ": ", what, " must be f32, bf16 or f16, found ", t.ToString());
  SG_CHECK_ARG(t.is_contiguous(), op, ": ", what, " must be contiguous, found ", t.ToString());
  return absl::OkStatus();
}

// `t` matches `ref` in element count and device (and dtype when `same_dtype`).
absl::Status CheckLike(const char* op, const char* what, const TensorView& t, const TensorView& ref,
                       bool same_dtype) {
  SG_RETURN_IF_ERROR(CheckFloat(op, what, t));
  SG_CHECK_ARG(t.numel() == ref.numel() && t.device() == ref.device() && (!same_dtype || t.dtype() == ref.dtype()),
               op, ": ", what, " must have ", ref.numel(), " elements of ",
               same_dtype ? DTypeName(ref.dtype()) : "a floating type", " on ", ref.device().ToString(),
               ", found ", t.ToString());
  return absl::OkStatus();
}

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

absl::Status RunAxpby(const char* op, const Axpby& p, const TensorView& a, const void* b,
                      const TensorView& out, const Stream& stream) {
  if (p.n == 0) return absl::OkStatus();
  if (a.device().is_cpu()) {
    elementwise_internal::AxpbyCpu(p, a.raw(), b, out.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return elementwise_internal::AxpbyCuda(p, a.raw(), b, out.raw(), stream.native());
#else
  return NoCuda(op);
#endif
}

}  // namespace

absl::Status Add(const TensorView& a, const TensorView& b, const TensorView& out, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckFloat("Add", "a", a));
  SG_RETURN_IF_ERROR(CheckLike("Add", "b", b, a, true));
  SG_RETURN_IF_ERROR(CheckLike("Add", "out", out, a, true));
  return RunAxpby("Add", Axpby{a.numel(), a.dtype(), 1.f, 1.f}, a, b.raw(), out, stream);
}

absl::Status Scale(const TensorView& x, float alpha, const TensorView& out, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckFloat("Scale", "x", x));
  SG_RETURN_IF_ERROR(CheckLike("Scale", "out", out, x, true));
  return RunAxpby("Scale", Axpby{x.numel(), x.dtype(), alpha, 0.f}, x, nullptr, out, stream);
}

absl::Status AddScaled(const TensorView& x, float alpha, const TensorView& y, const TensorView& out,
                       const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckFloat("AddScaled", "x", x));
  SG_RETURN_IF_ERROR(CheckLike("AddScaled", "y", y, x, true));
  SG_RETURN_IF_ERROR(CheckLike("AddScaled", "out", out, x, true));
  return RunAxpby("AddScaled", Axpby{x.numel(), x.dtype(), alpha, 1.f}, x, y.raw(), out, stream);
}

absl::Status Cast(const TensorView& src, const TensorView& out, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckFloat("Cast", "src", src));
  SG_RETURN_IF_ERROR(CheckLike("Cast", "out", out, src, false));
  SG_CHECK_ARG(src.dtype() == out.dtype() || src.raw() != out.raw(),
               "Cast: out may not alias src when the dtypes differ, found ", src.ToString(), " -> ",
               out.ToString());
  if (src.numel() == 0) return absl::OkStatus();
  if (src.device().is_cpu()) {
    elementwise_internal::CastCpu(src.numel(), src.dtype(), out.dtype(), src.raw(), out.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return elementwise_internal::CastCuda(src.numel(), src.dtype(), out.dtype(), src.raw(), out.raw(),
                                        stream.native());
#else
  return NoCuda("Cast");
#endif
}

absl::Status Fill(const TensorView& out, float value, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckFloat("Fill", "out", out));
  if (out.numel() == 0) return absl::OkStatus();
  if (out.device().is_cpu()) {
    elementwise_internal::FillCpu(out.numel(), out.dtype(), value, out.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return elementwise_internal::FillCuda(out.numel(), out.dtype(), value, out.raw(), stream.native());
#else
  return NoCuda("Fill");
#endif
}

absl::Status SumRows(const TensorView& x, const TensorView& out, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckFloat("SumRows", "x", x));
  SG_CHECK_ARG(x.rank() >= 1 && x.numel() > 0, "SumRows: x must be non-empty, found ", x.ToString());
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  SG_RETURN_IF_ERROR(ExpectTensor(out, "SumRows out", DType::kF32, {cols}, x.device()));
  if (x.device().is_cpu()) {
    elementwise_internal::SumRowsCpu(rows, cols, x.dtype(), x.raw(), out.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return elementwise_internal::SumRowsCuda(rows, cols, x.dtype(), x.raw(), out.data<float>(),
                                           x.device().ordinal, stream.native());
#else
  return NoCuda("SumRows");
#endif
}

}  // namespace sg::kernels
