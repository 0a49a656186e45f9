// The one CUDA kernel of the GEMM package: the row-scale pass used when cuBLASLt cannot apply a
// per-row alpha vector itself (see gemm_cublaslt.cc). One block per row, 16-byte accesses when the
// row allows them. It reads and writes d once more, which is why the epilogue path is preferred.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/core/status.h"
#include "kernels/gemm/gemm_internal.h"

namespace sg::kernels::gemm_internal {
namespace {

template <typename T> __device__ __forceinline__ float Get(const T& v);
template <> __device__ __forceinline__ float Get(const float& v) { return v; }
template <> __device__ __forceinline__ float Get(const __nv_bfloat16& v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float Get(const __half& v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T Make(float v);
template <> __device__ __forceinline__ float Make(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 Make(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half Make(float v) { return __float2half_rn(v); }

// d[row, :] *= scale[row % rows] for row in [0, batch * rows).
template <typename T>
__global__ void ScaleRowsKernel(T* __restrict__ d, int64_t rows, int64_t cols, int64_t ld, int64_t batch_stride,
                                const float* __restrict__ scale) {
  const int64_t r = blockIdx.x % rows;
  const int64_t b = blockIdx.x / rows;
  T* row = d + b * batch_stride + r * ld;
  const float s = scale[r];
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = (reinterpret_cast<uintptr_t>(row) % 16 == 0) && (cols % kVec == 0);
  if (vec_ok) {
    uint4* v = reinterpret_cast<uint4*>(row);
    for (int64_t i = threadIdx.x; i < cols / kVec; i += blockDim.x) {
      uint4 u = v[i];
      T* e = reinterpret_cast<T*>(&u);
#pragma unroll
      for (int j = 0; j < kVec; ++j) e[j] = Make<T>(Get(e[j]) * s);
      v[i] = u;
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) row[i] = Make<T>(Get(row[i]) * s);
  }
}

}  // namespace

absl::Status ScaleRowsCuda(void* d, DType dtype, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                           int64_t batch_stride, const float* scale, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = unsigned(batch * rows);
  if (dtype == DType::kBF16) {
    ScaleRowsKernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(d), rows, cols, ld,
                                                           batch_stride, scale);
  } else if (dtype == DType::kF16) {
    ScaleRowsKernel<__half><<<blocks, 256, 0, s>>>(static_cast<__half*>(d), rows, cols, ld, batch_stride, scale);
  } else {
    ScaleRowsKernel<float><<<blocks, 256, 0, s>>>(static_cast<float*>(d), rows, cols, ld, batch_stride, scale);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ScaleRowsKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::gemm_internal
