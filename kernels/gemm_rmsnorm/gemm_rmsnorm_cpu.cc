// CPU reference for the elementwise/reduction steps of GEMM + RMSNorm: f64 accumulation, rows over
// the thread pool, column sums over fixed row chunks added in chunk order (deterministic).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/gemm_rmsnorm/gemm_rmsnorm_internal.h"

namespace sg::kernels::gemm_rmsnorm_internal {
namespace {

template <typename T>
void FoldWeight(int64_t n, int64_t k, const T* w, const T* g, T* wf) {
  ParallelFor(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < k; ++c) wf[r * k + c] = FromFloat<T>(ToFloat(w[r * k + c]) * ToFloat(g[c]));
  });
}

template <typename T>
void Rstd(int64_t rows, int64_t dim, const T* x, float eps, float* rstd) {
  ParallelFor(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(ToFloat(x[r * dim + i])) * ToFloat(x[r * dim + i]);
      rstd[r] = float(1.0 / std::sqrt(ss / double(dim) + eps));
    }
  });
}

template <typename T>
void NormBackward(int64_t rows, int64_t dim, const T* dz, const T* x, const float* rstd, T* dx, T* xhat) {
  ParallelFor(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t base = r * dim;
      const double rs = rstd[r];
      double dot = 0;
      for (int64_t i = 0; i < dim; ++i) dot += double(ToFloat(dz[base + i])) * ToFloat(x[base + i]);
      const double mean = dot / double(dim);
      for (int64_t i = 0; i < dim; ++i) {
        const double xi = ToFloat(x[base + i]);
        dx[base + i] = FromFloat<T>(float(rs * (ToFloat(dz[base + i]) - xi * rs * rs * mean)));
        xhat[base + i] = FromFloat<T>(float(rs * xi));
      }
    }
  });
}

template <typename T>
void WeightGrad(int64_t n, int64_t k, const T* w, const T* g, float* G, float* dg) {
  const int64_t chunk_rows = std::max<int64_t>(1, (n + 63) / 64);
  const int64_t chunks = (n + chunk_rows - 1) / chunk_rows;
  std::vector<double> partial(size_t(chunks * k), 0.0);
  ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double* pg = partial.data() + c * k;
      for (int64_t r = c * chunk_rows; r < std::min(n, (c + 1) * chunk_rows); ++r) {
        for (int64_t j = 0; j < k; ++j) {
          pg[j] += double(ToFloat(w[r * k + j])) * G[r * k + j];
          G[r * k + j] *= ToFloat(g[j]);
        }
      }
    }
  });
  for (int64_t j = 0; j < k; ++j) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[size_t(c * k + j)];
    dg[j] = float(s);
  }
}

template <typename T> const T* In(const void* p) { return static_cast<const T*>(p); }
template <typename T> T* Out(void* p) { return static_cast<T*>(p); }

}  // namespace

void FoldWeightCpu(int64_t n, int64_t k, DType t, const void* w, const void* g, void* wf) {
  if (t == DType::kBF16) return FoldWeight(n, k, In<BFloat16>(w), In<BFloat16>(g), Out<BFloat16>(wf));
  FoldWeight(n, k, In<float>(w), In<float>(g), Out<float>(wf));
}

void RstdCpu(int64_t rows, int64_t dim, DType t, const void* x, float eps, float* rstd) {
  if (t == DType::kBF16) return Rstd(rows, dim, In<BFloat16>(x), eps, rstd);
  Rstd(rows, dim, In<float>(x), eps, rstd);
}

void NormBackwardCpu(int64_t rows, int64_t dim, DType t, const void* dz, const void* x, const float* rstd, void* dx,
                     void* xhat) {
  if (t == DType::kBF16) {
    return NormBackward(rows, dim, In<BFloat16>(dz), In<BFloat16>(x), rstd, Out<BFloat16>(dx), Out<BFloat16>(xhat));
  }
  NormBackward(rows, dim, In<float>(dz), In<float>(x), rstd, Out<float>(dx), Out<float>(xhat));
}

void WeightGradCpu(int64_t n, int64_t k, DType t, const void* w, const void* g, float* G, float* dg) {
  if (t == DType::kBF16) return WeightGrad(n, k, In<BFloat16>(w), In<BFloat16>(g), G, dg);
  WeightGrad(n, k, In<float>(w), In<float>(g), G, dg);
}

}  // namespace sg::kernels::gemm_rmsnorm_internal
