// CUDA versions of comm/reduce.h: element-wise reduce and scale, f32 and bf16 (accumulating in f32).
// Memory-bound: each thread handles a 16-byte vector per iteration of a grid-stride loop; the ring
// collectives call them once per received chunk, so they must run near HBM bandwidth.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "comm/reduce.h"
#include "kernels/core/status.h"

namespace sg::comm {
namespace {

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

template <typename T, bool kMax>
__global__ void ReduceKernel(T* __restrict__ dst, const T* __restrict__ src, int64_t n) {
  constexpr int kVec = 16 / sizeof(T);
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t vec_n = n / kVec;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vec_n; v += stride) {
    // 16-byte loads when the pointers allow (the launcher checks alignment).
    uint4 a = reinterpret_cast<const uint4*>(dst)[v];
    uint4 b = reinterpret_cast<const uint4*>(src)[v];
    T* pa = reinterpret_cast<T*>(&a);
    const T* pb = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float x = Load(pa, k), y = Load(pb, k);
      Store(pa, k, kMax ? fmaxf(x, y) : x + y);
    }
    reinterpret_cast<uint4*>(dst)[v] = a;
  }
  for (int64_t i = vec_n * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = Load(dst, i), y = Load(src, i);
    Store(dst, i, kMax ? fmaxf(x, y) : x + y);
  }
}

template <typename T, bool kMax>
__global__ void ReduceKernelScalar(T* __restrict__ dst, const T* __restrict__ src, int64_t n) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = Load(dst, i), y = Load(src, i);
    Store(dst, i, kMax ? fmaxf(x, y) : x + y);
  }
}

template <typename T>
__global__ void ScaleKernel(T* __restrict__ x, int64_t n, float s) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Store(x, i, Load(x, i) * s);
  }
}

constexpr int kThreads = 512;

int Blocks(int64_t work) {
  // Enough blocks to fill an H200 (132 SMs x 4), no more: the loops are grid-stride.
  return int(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, 132 * 4)));
}

template <typename T>
absl::Status LaunchReduce(ReduceOp op, T* dst, const T* src, int64_t n, cudaStream_t s) {
  bool aligned = (reinterpret_cast<uintptr_t>(dst) % 16 == 0) && (reinterpret_cast<uintptr_t>(src) % 16 == 0);
  int64_t work = aligned ? n / (16 / sizeof(T)) + 1 : n;
  bool is_max = op == ReduceOp::kMax;
  if (aligned) {
    if (is_max) ReduceKernel<T, true><<<Blocks(work), kThreads, 0, s>>>(dst, src, n);
    else ReduceKernel<T, false><<<Blocks(work), kThreads, 0, s>>>(dst, src, n);
  } else {
    if (is_max) ReduceKernelScalar<T, true><<<Blocks(work), kThreads, 0, s>>>(dst, src, n);
    else ReduceKernelScalar<T, false><<<Blocks(work), kThreads, 0, s>>>(dst, src, n);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ReduceKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReduceIntoDevice(ReduceOp op, DType dtype, void* dst, const void* src, int64_t n,
                              const Stream& stream) {
  SG_CHECK_ARG(IsReducibleDType(dtype), "device reduce: expected dtype f32 or bf16, found ",
               DTypeName(dtype));
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  if (dtype == DType::kF32) {
    return LaunchReduce(op, static_cast<float*>(dst), static_cast<const float*>(src), n, s);
  }
  return LaunchReduce(op, static_cast<__nv_bfloat16*>(dst), static_cast<const __nv_bfloat16*>(src),
                      n, s);
}

absl::Status ScaleInPlaceDevice(DType dtype, void* x, int64_t n, float scale, const Stream& stream) {
  SG_CHECK_ARG(IsReducibleDType(dtype), "device scale: expected dtype f32 or bf16, found ",
               DTypeName(dtype));
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  if (dtype == DType::kF32) {
    ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<float*>(x), n, scale);
  } else {
    ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(x), n, scale);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ScaleKernel);
  return absl::OkStatus();
}

}  // namespace sg::comm
