// CPU reference for the elementwise helpers: one f32 operation per element, rounded once.
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/elementwise/elementwise_internal.h"

namespace sg::kernels::elementwise_internal {
namespace {

constexpr int64_t kGrain = 1 << 14;

template <typename T>
void AxpbyTyped(const elementwise_internal::Axpby& p, const T* a, const T* b, T* out) {
  ParallelFor(p.n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float v = p.alpha * ToFloat(a[i]);
      if (b != nullptr) v += p.beta * ToFloat(b[i]);
      out[i] = FromFloat<T>(v);
    }
  });
}

template <typename From, typename To>
void CastTyped(int64_t n, const From* src, To* out) {
  ParallelFor(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = FromFloat<To>(ToFloat(src[i]));
  });
}

template <typename From>
void CastFrom(int64_t n, DType to, const From* src, void* out) {
  switch (to) {
    case DType::kBF16: return CastTyped(n, src, static_cast<BFloat16*>(out));
    case DType::kF16: return CastTyped(n, src, static_cast<Half*>(out));
    default: return CastTyped(n, src, static_cast<float*>(out));
  }
}

template <typename T>
void SumRowsTyped(int64_t rows, int64_t cols, const T* x, float* out) {
  ParallelFor(cols, 64, [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(size_t(c1 - c0), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = c0; c < c1; ++c) acc[size_t(c - c0)] += ToFloat(x[r * cols + c]);
    }
    for (int64_t c = c0; c < c1; ++c) out[c] = float(acc[size_t(c - c0)]);
  });
}

}  // namespace

void AxpbyCpu(const elementwise_internal::Axpby& p, const void* a, const void* b, void* out) {
  switch (p.dtype) {
    case DType::kBF16:
      return AxpbyTyped(p, static_cast<const BFloat16*>(a), static_cast<const BFloat16*>(b), static_cast<BFloat16*>(out));
    case DType::kF16:
      return AxpbyTyped(p, static_cast<const Half*>(a), static_cast<const Half*>(b), static_cast<Half*>(out));
    default:
      return AxpbyTyped(p, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(out));
  }
}

void CastCpu(int64_t n, DType from, DType to, const void* src, void* out) {
  switch (from) {
    case DType::kBF16: return CastFrom(n, to, static_cast<const BFloat16*>(src), out);
    case DType::kF16: return CastFrom(n, to, static_cast<const Half*>(src), out);
    default: return CastFrom(n, to, static_cast<const float*>(src), out);
  }
}

void FillCpu(int64_t n, DType dtype, float value, void* out) {
  switch (dtype) {
    case DType::kBF16: {
      const BFloat16 v = BFloat16::FromFloat(value);
      for (int64_t i = 0; i < n; ++i) static_cast<BFloat16*>(out)[i] = v;
      return;
    }
    case DType::kF16: {
      const Half v = Half::FromFloat(value);
      for (int64_t i = 0; i < n; ++i) static_cast<Half*>(out)[i] = v;
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(out)[i] = value;
  }
}

void SumRowsCpu(int64_t rows, int64_t cols, DType dtype, const void* x, float* out) {
  switch (dtype) {
    case DType::kBF16: return SumRowsTyped(rows, cols, static_cast<const BFloat16*>(x), out);
    case DType::kF16: return SumRowsTyped(rows, cols, static_cast<const Half*>(x), out);
    default: return SumRowsTyped(rows, cols, static_cast<const float*>(x), out);
  }
}

}  // namespace sg::kernels::elementwise_internal
