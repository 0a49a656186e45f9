// CUDA versions of comm/reduce.h: element-wise reduce (out of place, optionally scaled) and scale,
// f32 and bf16 (accumulating in f32). Memory-bound: each thread moves 16-byte vectors, several
// independent ones in flight per loop iteration. The ring collectives call the reduction once per
// received chunk while NCCL moves the next chunk, so the grid is capped at half the SMs: a grid that
// fills every SM (the first version launched 4 x 512-thread blocks per SM) keeps the next NCCL
// kernel from starting until the whole reduction is done, serializing transfer and reduction.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "comm/reduce.h"
#include "kernels/core/status.h"

namespace sg::comm {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors per operand in flight per thread

__device__ __forceinline__ float Load(const float* p, int i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void Store(float* p, int i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int i, float v) { p[i] = __float2bfloat16(v); }

template <bool kMax, bool kScale>
__device__ __forceinline__ float Op(float x, float y, float scale) {
  float r = kMax ? fmaxf(x, y) : x + y;
  return kScale ? r * scale : r;
}

// x = op(x, y) * scale, element-wise over one 16-byte vector of T.
template <typename T, bool kMax, bool kScale>
__device__ __forceinline__ void CombineVec(uint4& x, const uint4& y, float scale) {
  constexpr int kVec = 16 / sizeof(T);
  T* px = reinterpret_cast<T*>(&x);
  const T* py = reinterpret_cast<const T*>(&y);
#pragma unroll
  for (int k = 0; k < kVec; ++k) Store(px, k, Op<kMax, kScale>(Load(px, k), Load(py, k), scale));
}

// dst = op(a, b) * scale over 16-byte vectors (all three pointers 16-byte aligned; dst may alias a
// or b: every element is read before it is written, by the same thread), then the tail elements.
template <typename T, bool kMax, bool kScale>
__global__ void __launch_bounds__(kThreads) ReduceVecKernel(T* dst, const T* a, const T* b,
                                                            int64_t n, float scale) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t vec_n = n / kVec;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const uint4* va = reinterpret_cast<const uint4*>(a);
  const uint4* vb = reinterpret_cast<const uint4*>(b);
  uint4* vd = reinterpret_cast<uint4*>(dst);
  int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; v + (kUnroll - 1) * stride < vec_n; v += kUnroll * stride) {
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u] = va[v + u * stride];
      y[u] = vb[v + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      CombineVec<T, kMax, kScale>(x[u], y[u], scale);
      vd[v + u * stride] = x[u];
    }
  }
  for (; v < vec_n; v += stride) {
    uint4 x = va[v];
    uint4 y = vb[v];
    CombineVec<T, kMax, kScale>(x, y, scale);
    vd[v] = x;
  }
  for (int64_t i = vec_n * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Store(dst + i, 0, Op<kMax, kScale>(Load(a + i, 0), Load(b + i, 0), scale));
  }
}

template <typename T, bool kMax, bool kScale>
__global__ void __launch_bounds__(kThreads) ReduceScalarKernel(T* dst, const T* a, const T* b,
                                                               int64_t n, float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Store(dst + i, 0, Op<kMax, kScale>(Load(a + i, 0), Load(b + i, 0), scale));
  }
}

template <typename T>
__global__ void ScaleKernel(T* __restrict__ x, int64_t n, float s) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Store(x + i, 0, Load(x + i, 0) * s);
  }
}

__global__ void WidenKernel(const __nv_bfloat16* __restrict__ src, float* __restrict__ dst, int64_t n, float s) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = __bfloat162float(src[i]) * s;
  }
}

// Half the current device's SMs, one 512-thread block each: with kUnroll vectors in flight per
// thread that is enough to stream HBM, and it leaves SMs for a concurrent NCCL kernel.
absl::StatusOr<int> ReduceGridCap() {
  int device = 0, sms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(1, sms / 2);
}

int Blocks(int64_t work, int cap) {
  return int(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, cap)));
}

template <typename T, bool kMax, bool kScale>
void Launch(bool vec, int blocks, cudaStream_t s, T* dst, const T* a, const T* b, int64_t n,
            float scale) {
  if (vec) {
    ReduceVecKernel<T, kMax, kScale><<<blocks, kThreads, 0, s>>>(dst, a, b, n, scale);
  } else {
    ReduceScalarKernel<T, kMax, kScale><<<blocks, kThreads, 0, s>>>(dst, a, b, n, scale);
  }
}

template <typename T>
absl::Status LaunchReduce(ReduceOp op, T* dst, const T* a, const T* b, int64_t n, float scale,
                          cudaStream_t s) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = aligned(dst) && aligned(a) && aligned(b);
  const int64_t per_thread = vec ? int64_t(kUnroll) * (16 / sizeof(T)) : 1;
  SG_ASSIGN_OR_RETURN(int cap, ReduceGridCap());
  const int blocks = Blocks((n + per_thread - 1) / per_thread, cap);
  const bool is_max = op == ReduceOp::kMax, scaled = scale != 1.0f;
  if (is_max && scaled) Launch<T, true, true>(vec, blocks, s, dst, a, b, n, scale);
  else if (is_max) Launch<T, true, false>(vec, blocks, s, dst, a, b, n, scale);
  else if (scaled) Launch<T, false, true>(vec, blocks, s, dst, a, b, n, scale);
  else Launch<T, false, false>(vec, blocks, s, dst, a, b, n, scale);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ReduceVecKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReduceDevice(ReduceOp op, DType dtype, void* dst, const void* a, const void* b,
                          int64_t n, float scale, const Stream& stream) {
  SG_CHECK_ARG(IsReducibleDType(dtype), "device reduce: expected dtype f32 or bf16, found ",
               DTypeName(dtype));
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  if (dtype == DType::kF32) {
    return LaunchReduce(op, static_cast<float*>(dst), static_cast<const float*>(a),
                        static_cast<const float*>(b), n, scale, s);
  }
  return LaunchReduce(op, static_cast<__nv_bfloat16*>(dst), static_cast<const __nv_bfloat16*>(a),
                      static_cast<const __nv_bfloat16*>(b), n, scale, s);
}

absl::Status ReduceIntoDevice(ReduceOp op, DType dtype, void* dst, const void* src, int64_t n,
                              const Stream& stream) {
  return ReduceDevice(op, dtype, dst, dst, src, n, 1.0f, stream);
}

absl::Status ScaleInPlaceDevice(DType dtype, void* x, int64_t n, float scale, const Stream& stream) {
  SG_CHECK_ARG(IsReducibleDType(dtype), "device scale: expected dtype f32 or bf16, found ",
               DTypeName(dtype));
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  SG_ASSIGN_OR_RETURN(int cap, ReduceGridCap());
  if (dtype == DType::kF32) {
    ScaleKernel<<<Blocks(n, cap * 4), kThreads, 0, s>>>(static_cast<float*>(x), n, scale);
  } else {
    ScaleKernel<<<Blocks(n, cap * 4), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(x), n, scale);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ScaleKernel);
  return absl::OkStatus();
}

absl::Status WidenBf16Device(const void* src, float* dst, int64_t n, float scale, const Stream& stream) {
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  SG_ASSIGN_OR_RETURN(int cap, ReduceGridCap());
  WidenKernel<<<Blocks(n, cap * 4), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n, scale);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(WidenKernel);
  return absl::OkStatus();
}

}  // namespace sg::comm
