#include "comm/reduce.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::comm {
namespace {

template <typename T, typename F>
void Combine(T* dst, const T* src, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FromFloat<T>(f(ToFloat(dst[i]), ToFloat(src[i])));
}

template <typename T>
void Reduce(ReduceOp op, T* dst, const T* src, int64_t n) {
  if (op == ReduceOp::kMax) {
    Combine(dst, src, n, [](float a, float b) { return std::max(a, b); });
  } else {
    Combine(dst, src, n, [](float a, float b) { return a + b; });
  }
}

template <typename T>
void Scale(T* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] = FromFloat<T>(ToFloat(x[i]) * s);
}

absl::Status CheckDType(DType dtype, absl::string_view what) {
  SG_CHECK_ARG(IsReducibleDType(dtype), what, ": expected dtype f32 or bf16, found ",
               DTypeName(dtype));
  return absl::OkStatus();
}

}  // namespace

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

absl::Status ReduceInto(ReduceOp op, DType dtype, void* dst, const void* src, int64_t n) {
  SG_RETURN_IF_ERROR(CheckDType(dtype, "reduce"));
  if (dtype == DType::kF32) {
    Reduce(op, static_cast<float*>(dst), static_cast<const float*>(src), n);
  } else {
    Reduce(op, static_cast<BFloat16*>(dst), static_cast<const BFloat16*>(src), n);
  }
  return absl::OkStatus();
}

absl::Status ScaleInPlace(DType dtype, void* x, int64_t n, float scale) {
  SG_RETURN_IF_ERROR(CheckDType(dtype, "scale"));
  if (dtype == DType::kF32) {
    Scale(static_cast<float*>(x), n, scale);
  } else {
    Scale(static_cast<BFloat16*>(x), n, scale);
  }
  return absl::OkStatus();
}

void WidenBf16(const void* src, float* dst, int64_t n) {
  const BFloat16* s = static_cast<const BFloat16*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = ToFloat(s[i]);
}

#ifndef SG_WITH_CUDA
absl::Status WidenBf16Device(const void*, float*, int64_t, float, const Stream&) {
  return absl::FailedPreconditionError("WidenBf16Device: built without CUDA");
}
absl::Status ReduceIntoDevice(ReduceOp, DType, void*, const void*, int64_t, const Stream&) {
  return absl::FailedPreconditionError("ReduceIntoDevice: built without CUDA");
}
absl::Status ReduceDevice(ReduceOp, DType, void*, const void*, const void*, int64_t, float,
                          const Stream&) {
  return absl::FailedPreconditionError("ReduceDevice: built without CUDA");
}
absl::Status ScaleInPlaceDevice(DType, void*, int64_t, float, const Stream&) {
  return absl::FailedPreconditionError("ScaleInPlaceDevice: built without CUDA");
}
#endif

}  // namespace sg::comm
