// CUDA RMSNorm: the dtype dispatch onto the kernels shared with add+RMSNorm (rmsnorm_launch.h, which
// describes the layout). Measured bandwidth on H200 against PyTorch: benchmarks/README.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/rmsnorm/rmsnorm_internal.h"
#include "kernels/rmsnorm/rmsnorm_launch.h"

namespace sg::kernels::rmsnorm_internal {
namespace {

template <typename T>
absl::Status Forward(const Problem& p, const void* x, const void* w, void* y, float* rstd, int device,
                     cudaStream_t s, const LaunchConfig& cfg) {
  return rmsnorm_launch::Forward<T, /*kAdd=*/false>(cfg, p.rows, p.dim, p.eps, static_cast<const T*>(x), nullptr,
                                                     static_cast<const T*>(w), nullptr, static_cast<T*>(y), rstd,
                                                     device, s);
}

template <typename T>
absl::Status Backward(const Problem& p, const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                      float* dw, int device, cudaStream_t s, const LaunchConfig& cfg) {
  return rmsnorm_launch::Backward<T, /*kResidual=*/false>(cfg, p.rows, p.dim, static_cast<const T*>(dy), nullptr,
                                                           static_cast<const T*>(x), static_cast<const T*>(w), rstd,
                                                           static_cast<T*>(dx), dw, device, s);
}

}  // namespace

absl::Status ForwardCuda(const Problem& p, const void* x, const void* w, void* y, float* rstd, int device,
                         void* stream, const LaunchConfig& cfg) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Forward<__nv_bfloat16>(p, x, w, y, rstd, device, s, cfg);
  if (p.dtype == DType::kF16) return Forward<__half>(p, x, w, y, rstd, device, s, cfg);
  return Forward<float>(p, x, w, y, rstd, device, s, cfg);
}

absl::Status BackwardCuda(const Problem& p, const void* dy, const void* x, const void* w, const float* rstd,
                          void* dx, float* dw, int device, void* stream, const LaunchConfig& cfg) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Backward<__nv_bfloat16>(p, dy, x, w, rstd, dx, dw, device, s, cfg);
  if (p.dtype == DType::kF16) return Backward<__half>(p, dy, x, w, rstd, dx, dw, device, s, cfg);
  return Backward<float>(p, dy, x, w, rstd, dx, dw, device, s, cfg);
}

}  // namespace sg::kernels::rmsnorm_internal
