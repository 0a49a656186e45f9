// The elementwise and reduction steps of gemm_rmsnorm, per device; the GEMMs go through kernels/gemm.
// Arguments are already checked by gemm_rmsnorm.cc.
#ifndef SGTRAIN_KERNELS_GEMM_RMSNORM_GEMM_RMSNORM_INTERNAL_H_
#define SGTRAIN_KERNELS_GEMM_RMSNORM_GEMM_RMSNORM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::gemm_rmsnorm_internal {

// w_folded[n, k] = w[n, k] * g[k].
void FoldWeightCpu(int64_t n, int64_t k, DType t, const void* w, const void* g, void* w_folded);
// rstd[i] = 1 / sqrt(mean_k x[i, k]^2 + eps).
void RstdCpu(int64_t rows, int64_t dim, DType t, const void* x, float eps, float* rstd);
// dx = r (dz - x r^2 mean(dz x)) and xhat = r x, per row.
void NormBackwardCpu(int64_t rows, int64_t dim, DType t, const void* dz, const void* x, const float* rstd, void* dx,
                     void* xhat);
// dg[k] = sum_n w[n, k] G[n, k], then G[n, k] *= g[k] in place (G becomes dW). Deterministic.
void WeightGradCpu(int64_t n, int64_t k, DType t, const void* w, const void* g, float* G, float* dg);

absl::Status FoldWeightCuda(int64_t n, int64_t k, DType t, const void* w, const void* g, void* w_folded,
                            void* stream);
absl::Status RstdCuda(int64_t rows, int64_t dim, DType t, const void* x, float eps, float* rstd, void* stream);
absl::Status NormBackwardCuda(int64_t rows, int64_t dim, DType t, const void* dz, const void* x, const float* rstd,
                              void* dx, void* xhat, void* stream);
absl::Status WeightGradCuda(int64_t n, int64_t k, DType t, const void* w, const void* g, float* G, float* dg,
                            int device, void* stream);

}  // namespace sg::kernels::gemm_rmsnorm_internal

#endif  // SGTRAIN_KERNELS_GEMM_RMSNORM_GEMM_RMSNORM_INTERNAL_H_
