// CPU reference for SwiGLU: f32 arithmetic per element (the CUDA kernels' formula), rows (or chunks
// of the flat tensor) spread over the thread pool.
#include <algorithm>
#include <cmath>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/swiglu/swiglu_internal.h"

namespace sg::kernels::swiglu_internal {
namespace {

float Sigmoid(float g) { return 1.f / (1.f + std::exp(-g)); }

// Calls fn(in_offset, out_offset, count) over contiguous runs: whole rows, split when long.
template <typename Fn>
void ForRuns(const Problem& p, const Fn& fn) {
  constexpr int64_t kRun = 1 << 14;
  const int64_t runs_per_row = (p.cols + kRun - 1) / kRun;
  ParallelFor(p.rows * runs_per_row, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t r = j / runs_per_row, c0 = (j % runs_per_row) * kRun;
      fn(r * p.in_stride + c0, r * p.cols + c0, std::min(kRun, p.cols - c0));
    }
  });
}

template <typename T>
void Forward(const Problem& p, const T* gate, const T* up, T* out) {
  ForRuns(p, [&](int64_t in, int64_t o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = ToFloat(gate[in + i]);
      out[o + i] = FromFloat<T>(g * Sigmoid(g) * ToFloat(up[in + i]));
    }
  });
}

template <typename T>
void Backward(const Problem& p, const T* dout, const T* gate, const T* up, T* dgate, T* dup) {
  ForRuns(p, [&](int64_t in, int64_t o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = ToFloat(gate[in + i]), u = ToFloat(up[in + i]), d = ToFloat(dout[o + i]);
      const float s = Sigmoid(g);
      dgate[in + i] = FromFloat<T>(d * u * s * (1.f + g * (1.f - s)));
      dup[in + i] = FromFloat<T>(d * g * s);
    }
  });
}

}  // namespace

void ForwardCpu(const Problem& p, const void* gate, const void* up, void* out) {
  if (p.dtype == DType::kBF16) {
    Forward(p, static_cast<const BFloat16*>(gate), static_cast<const BFloat16*>(up), static_cast<BFloat16*>(out));
  } else if (p.dtype == DType::kF16) {
    Forward(p, static_cast<const Half*>(gate), static_cast<const Half*>(up), static_cast<Half*>(out));
  } else {
    Forward(p, static_cast<const float*>(gate), static_cast<const float*>(up), static_cast<float*>(out));
  }
}

void BackwardCpu(const Problem& p, const void* dout, const void* gate, const void* up, void* dgate, void* dup) {
  if (p.dtype == DType::kBF16) {
    using B = BFloat16;
    Backward(p, static_cast<const B*>(dout), static_cast<const B*>(gate), static_cast<const B*>(up),
             static_cast<B*>(dgate), static_cast<B*>(dup));
  } else if (p.dtype == DType::kF16) {
    using H = Half;
    Backward(p, static_cast<const H*>(dout), static_cast<const H*>(gate), static_cast<const H*>(up),
             static_cast<H*>(dgate), static_cast<H*>(dup));
  } else {
    Backward(p, static_cast<const float*>(dout), static_cast<const float*>(gate), static_cast<const float*>(up),
             static_cast<float*>(dgate), static_cast<float*>(dup));
  }
}

}  // namespace sg::kernels::swiglu_internal
