// Device-side uniform fill for kernels/core/testing.h: large benchmark inputs are generated where
// they live instead of drawing billions of values on the host and copying them over.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/core/status.h"
#include "kernels/core/testing_cuda.h"

namespace sg::testing {
namespace {

// splitmix64: a counter-based generator, so every element is independent of the launch shape.
__device__ __forceinline__ float Uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
}

template <typename T> __device__ T Convert(float v);
template <> __device__ float Convert(float v) { return v; }
template <> __device__ __nv_bfloat16 Convert(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __half Convert(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void FillUniformKernel(T* out, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = Convert<T>(scale * (2.0f * Uniform(seed, uint64_t(i)) - 1.0f));
  }
}

__global__ void SpinUntilFlagKernel(const volatile int* flag, int64_t limit_ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    if (*flag != 0) return;
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (int64_t(now - start) < limit_ns);
}

}  // namespace

absl::Status SpinUntilFlagCuda(const volatile int* flag, int64_t limit_ns, void* stream) {
  SpinUntilFlagKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, limit_ns);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(SpinUntilFlagKernel);
  return absl::OkStatus();
}

absl::Status FillUniformCuda(void* data, DType dtype, int64_t n, uint64_t seed, float scale, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 132 * 16));
  if (n == 0) return absl::OkStatus();
  switch (dtype) {
    case DType::kF32: FillUniformKernel<<<blocks, 256, 0, s>>>(static_cast<float*>(data), n, seed, scale); break;
    case DType::kBF16: FillUniformKernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(data), n, seed, scale); break;
    case DType::kF16: FillUniformKernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(data), n, seed, scale); break;
    default: return absl::InvalidArgumentError("FillUniformCuda: floating dtypes only");
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(FillUniformKernel);
  SG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

}  // namespace sg::testing
