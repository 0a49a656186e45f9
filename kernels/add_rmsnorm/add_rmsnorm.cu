// CUDA fused residual add + RMSNorm: RMSNorm's kernels (kernels/rmsnorm/rmsnorm_launch.h, which
// describes the layout) with the add switched on in the forward (x and delta read once, h and y
// written once, h kept in registers between the sum of squares and the output) and the residual
// gradient dh_in added in the backward (dy, dh_in and h read once, dh written once).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/add_rmsnorm/add_rmsnorm_internal.h"
#include "kernels/rmsnorm/rmsnorm_launch.h"

namespace sg::kernels::add_rmsnorm_internal {
namespace {

template <typename T>
absl::Status Forward(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y,
                     float* rstd, int device, cudaStream_t s, const LaunchConfig& cfg) {
  return rmsnorm_launch::Forward<T, /*kAdd=*/true>(cfg, p.rows, p.dim, p.eps, static_cast<const T*>(x),
                                                    static_cast<const T*>(delta), static_cast<const T*>(w),
                                                    static_cast<T*>(h), static_cast<T*>(y), rstd, device, s);
}

template <typename T>
absl::Status Backward(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                      const float* rstd, void* dh, float* dw, int device, cudaStream_t s, const LaunchConfig& cfg) {
  return rmsnorm_launch::Backward<T, /*kResidual=*/true>(cfg, p.rows, p.dim, static_cast<const T*>(dy),
                                                          static_cast<const T*>(dh_in), static_cast<const T*>(h),
                                                          static_cast<const T*>(w), rstd, static_cast<T*>(dh), dw,
                                                          device, s);
}

}  // namespace

absl::Status ForwardCuda(const Problem& p, const void* x, const void* delta, const void* w, void* h, void* y,
                         float* rstd, int device, void* stream, const LaunchConfig& cfg) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Forward<__nv_bfloat16>(p, x, delta, w, h, y, rstd, device, s, cfg);
  if (p.dtype == DType::kF16) return Forward<__half>(p, x, delta, w, h, y, rstd, device, s, cfg);
  return Forward<float>(p, x, delta, w, h, y, rstd, device, s, cfg);
}

absl::Status BackwardCuda(const Problem& p, const void* dy, const void* dh_in, const void* h, const void* w,
                          const float* rstd, void* dh, float* dw, int device, void* stream, const LaunchConfig& cfg) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Backward<__nv_bfloat16>(p, dy, dh_in, h, w, rstd, dh, dw, device, s, cfg);
  if (p.dtype == DType::kF16) return Backward<__half>(p, dy, dh_in, h, w, rstd, dh, dw, device, s, cfg);
  return Backward<float>(p, dy, dh_in, h, w, rstd, dh, dw, device, s, cfg);
}

}  // namespace sg::kernels::add_rmsnorm_internal
