// CPU reference for RMSNorm: f32 data, f64 accumulation, rows spread over the thread pool.
#include <cmath>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/rmsnorm/rmsnorm_internal.h"

namespace sg::kernels::rmsnorm_internal {
namespace {

template <typename T>
void Forward(const Problem& p, const T* x, const T* w, T* y, float* rstd) {
  ParallelFor(p.rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * p.dim;
      double ss = 0;
      for (int64_t i = 0; i < p.dim; ++i) ss += double(ToFloat(xr[i])) * ToFloat(xr[i]);
      const float rs = float(1.0 / std::sqrt(ss / double(p.dim) + p.eps));
      rstd[r] = rs;
      for (int64_t i = 0; i < p.dim; ++i) y[r * p.dim + i] = FromFloat<T>(ToFloat(xr[i]) * rs * ToFloat(w[i]));
    }
  });
}

// dx_i = rstd * (w_i dy_i - x_i rstd^2 mean_j(w_j dy_j x_j)); dw_i = sum_rows dy_i x_i rstd.
template <typename T>
void Backward(const Problem& p, const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* dw) {
  // Per-chunk partial weight gradients, summed in chunk order: deterministic for a thread count.
  const int64_t chunk_rows = std::max<int64_t>(1, (p.rows + 63) / 64);
  const int64_t chunks = (p.rows + chunk_rows - 1) / chunk_rows;
  std::vector<double> partial(size_t(chunks * p.dim), 0.0);
  ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double* pw = partial.data() + c * p.dim;
      for (int64_t r = c * chunk_rows; r < std::min(p.rows, (c + 1) * chunk_rows); ++r) {
        const T* xr = x + r * p.dim;
        const T* dyr = dy + r * p.dim;
        const double rs = rstd[r];
        double dot = 0;
        for (int64_t i = 0; i < p.dim; ++i) dot += double(ToFloat(w[i])) * ToFloat(dyr[i]) * ToFloat(xr[i]);
        const double mean = dot / double(p.dim);
        for (int64_t i = 0; i < p.dim; ++i) {
          const double xi = ToFloat(xr[i]), dyi = ToFloat(dyr[i]);
          dx[r * p.dim + i] = FromFloat<T>(float(rs * (ToFloat(w[i]) * dyi - xi * rs * rs * mean)));
          pw[i] += dyi * xi * rs;
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

}  // namespace

void ForwardCpu(const Problem& p, const void* x, const void* w, void* y, float* rstd) {
  if (p.dtype == DType::kBF16) {
    Forward(p, static_cast<const BFloat16*>(x), static_cast<const BFloat16*>(w), static_cast<BFloat16*>(y), rstd);
  } else if (p.dtype == DType::kF16) {
    Forward(p, static_cast<const Half*>(x), static_cast<const Half*>(w), static_cast<Half*>(y), rstd);
  } else {
    Forward(p, static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), rstd);
  }
}

void BackwardCpu(const Problem& p, const void* dy, const void* x, const void* w, const float* rstd,
                 void* dx, float* dw) {
  if (p.dtype == DType::kBF16) {
    Backward(p, static_cast<const BFloat16*>(dy), static_cast<const BFloat16*>(x),
             static_cast<const BFloat16*>(w), rstd, static_cast<BFloat16*>(dx), dw);
  } else if (p.dtype == DType::kF16) {
    Backward(p, static_cast<const Half*>(dy), static_cast<const Half*>(x), static_cast<const Half*>(w), rstd,
             static_cast<Half*>(dx), dw);
  } else {
    Backward(p, static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w), rstd,
             static_cast<float*>(dx), dw);
  }
}

}  // namespace sg::kernels::rmsnorm_internal
