// CPU reference for RoPE: the f32 angle and rotation formulas the CUDA kernels use, tokens spread
// over the thread pool. In-place is safe: each pair (i, i + d/2) is read before it is written.
#include <cmath>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/rope/rope_internal.h"

namespace sg::kernels::rope_internal {
namespace {

float InvFreq(float theta, int64_t i, int64_t head_dim) {
  return 1.f / std::pow(theta, float(2 * i) / float(head_dim));
}

int64_t PositionOf(const Problem& p, int64_t token) {
  const int64_t b = token / p.seq, s = token % p.seq;
  if (p.positions == nullptr) return p.offset + s;
  const int64_t i = p.positions_per_batch ? b * p.seq + s : s;
  return p.positions_i64 ? static_cast<const int64_t*>(p.positions)[i] : static_cast<const int32_t*>(p.positions)[i];
}

template <typename T>
void RotateHeads(const Problem& p, const T* in, T* out, int64_t heads, int64_t token, const float* c,
                 const float* s) {
  const int64_t half = p.head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* x = in + (token * heads + h) * p.head_dim;
    T* y = out + (token * heads + h) * p.head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = ToFloat(x[i]), x2 = ToFloat(x[i + half]);
      y[i] = FromFloat<T>(x1 * c[i] - x2 * s[i]);
      y[i + half] = FromFloat<T>(x2 * c[i] + x1 * s[i]);
    }
  }
}

template <typename T>
void Apply(const Problem& p, const Buffers& b) {
  const int64_t half = p.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = InvFreq(p.theta, i, p.head_dim);
  ParallelFor(p.batch * p.seq, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = PositionOf(p, t);
      for (int64_t i = 0; i < half; ++i) {
        if (p.cos != nullptr) {
          c[size_t(i)] = p.cos[pos * half + i];
          s[size_t(i)] = p.sin[pos * half + i];
        } else {
          const float angle = float(pos) * inv[size_t(i)];
          c[size_t(i)] = std::cos(angle);
          s[size_t(i)] = std::sin(angle);
        }
        s[size_t(i)] *= p.sign;
      }
      RotateHeads(p, static_cast<const T*>(b.q), static_cast<T*>(b.q_out), p.q_heads, t, c.data(), s.data());
      if (p.k_heads > 0) {
        RotateHeads(p, static_cast<const T*>(b.k), static_cast<T*>(b.k_out), p.k_heads, t, c.data(), s.data());
      }
    }
  });
}

}  // namespace

void ApplyCpu(const Problem& p, const Buffers& b) {
  if (p.dtype == DType::kBF16) {
    Apply<BFloat16>(p, b);
  } else if (p.dtype == DType::kF16) {
    Apply<Half>(p, b);
  } else {
    Apply<float>(p, b);
  }
}

void TableCpu(float theta, int64_t rows, int64_t half, float* cos, float* sin) {
  ParallelFor(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(r) * InvFreq(theta, i, 2 * half);
        cos[r * half + i] = std::cos(angle);
        sin[r * half + i] = std::sin(angle);
      }
    }
  });
}

}  // namespace sg::kernels::rope_internal
