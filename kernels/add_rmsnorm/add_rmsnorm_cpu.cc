// CPU reference for the fused residual add + RMSNorm: f32 data, f64 accumulation, rows spread over
// the thread pool; the weight gradient summed per chunk of rows, then over chunks in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/add_rmsnorm/add_rmsnorm_internal.h"
#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"

namespace sg::kernels::add_rmsnorm_internal {
namespace {

template <typename T>
void Forward(const Problem& p, const T* x, const T* delta, const T* w, T* h, T* y, float* rstd) {
  ParallelFor(p.rows, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> hr(size_t(p.dim));
    for (int64_t r = r0; r < r1; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < p.dim; ++i) {
        const int64_t e = r * p.dim + i;
        const T hv = FromFloat<T>(ToFloat(x[e]) + ToFloat(delta[e]));  // the stored (rounded) residual
        hr[size_t(i)] = ToFloat(hv);
        h[e] = hv;
        ss += double(hr[size_t(i)]) * hr[size_t(i)];
      }
      const float rs = float(1.0 / std::sqrt(ss / double(p.dim) + p.eps));
      rstd[r] = rs;
      if (y == nullptr) continue;  // h and rstd only
      for (int64_t i = 0; i < p.dim; ++i) y[r * p.dim + i] = FromFloat<T>(hr[size_t(i)] * rs * ToFloat(w[i]));
    }
  });
}

// dh_i = dh_in_i + rstd * (w_i dy_i - h_i rstd^2 mean_j(w_j dy_j h_j)); dw_i = sum_rows dy_i h_i rstd.
template <typename T>
void Backward(const Problem& p, const T* dy, const T* dh_in, const T* h, const T* w, const float* rstd, T* dh,
              float* dw) {
  const int64_t chunk_rows = std::max<int64_t>(1, (p.rows + 63) / 64);
  const int64_t chunks = (p.rows + chunk_rows - 1) / chunk_rows;
  std::vector<double> partial(size_t(chunks * p.dim), 0.0);
  ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double* pw = partial.data() + c * p.dim;
      for (int64_t r = c * chunk_rows; r < std::min(p.rows, (c + 1) * chunk_rows); ++r) {
        const int64_t base = r * p.dim;
        const double rs = rstd[r];
        double dot = 0;
        for (int64_t i = 0; i < p.dim; ++i) dot += double(ToFloat(w[i])) * ToFloat(dy[base + i]) * ToFloat(h[base + i]);
        const double mean = dot / double(p.dim);
        for (int64_t i = 0; i < p.dim; ++i) {
          const double hi = ToFloat(h[base + i]), dyi = ToFloat(dy[base + i]);
          const double g = ToFloat(dh_in[base + i]) + rs * (ToFloat(w[i]) * dyi - hi * rs * rs * mean);
          dh[base + i] = FromFloat<T>(float(g));
          pw[i] += dyi * hi * rs;
        }
      }
    }
  });
  for (int64_t i = 0; i < p.dim; ++i) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[size_t(c * p.dim + i)];
    dw[i] = float(s);
  }
}

template <typename T>
const T* In(const void* p) { return static_cast<const T*>(p); }
template <typename T>
T* Out(void* p) { return static_cast<T*>(p); }

}  // namespace

void ForwardCpu(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y, float* rstd) {
  if (p.dtype == DType::kBF16) {
    using T = BFloat16;
    Forward(p, In<T>(x), In<T>(delta), In<T>(w), Out<T>(h), Out<T>(y), rstd);
  } else if (p.dtype == DType::kF16) {
    using T = Half;
    Forward(p, In<T>(x), In<T>(delta), In<T>(w), Out<T>(h), Out<T>(y), rstd);
  } else {
    Forward(p, In<float>(x), In<float>(delta), In<float>(w), Out<float>(h), Out<float>(y), rstd);
  }
}

void BackwardCpu(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                 const float* rstd, void* dh, float* dw) {
  if (p.dtype == DType::kBF16) {
    using T = BFloat16;
    Backward(p, In<T>(dy), In<T>(dh_in), In<T>(h), In<T>(w), rstd, Out<T>(dh), dw);
  } else if (p.dtype == DType::kF16) {
    using T = Half;
    Backward(p, In<T>(dy), In<T>(dh_in), In<T>(h), In<T>(w), rstd, Out<T>(dh), dw);
  } else {
    Backward(p, In<float>(dy), In<float>(dh_in), In<float>(h), In<float>(w), rstd, Out<float>(dh), dw);
  }
}

}  // namespace sg::kernels::add_rmsnorm_internal
