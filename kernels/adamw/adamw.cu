// CUDA multi-tensor AdamW, gradient norm and scaling. Work is cut into chunks of kChunk elements;
// a chunk table maps each chunk to its tensor, so one persistent grid (blocks from the SM count)
// walks every parameter in one launch. Inside a chunk each thread moves 4 elements at a time with
// 16-byte accesses (8 bytes for bf16 gradients and the bf16 copy); unaligned tensors and the tail
// take a scalar path. Per element AdamW moves 28 bytes (f32 grad) or 26 (bf16 grad), plus 2 for
// the bf16 copy: bandwidth-bound, so the math is kept to one rsqrt-free division per element.
// SG_ADAMW_KERNEL (read at every call) selects one of the experimental kernels in
// adamw_variants.cu instead; unset, empty or "default": AdamWKernel below.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "kernels/adamw/adamw_internal.h"
#include "kernels/adamw/adamw_step.cuh"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::adamw_internal {
namespace {

constexpr int kThreads = 256;

// kN (4 or 1) gradient values at element i as floats.
template <int kN>
__device__ __forceinline__ void LoadGrad(const Descriptor& d, int64_t i, float (&g)[4]) {
  if constexpr (kN == 4) {
    if (d.grad_bf16) {
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(d.grad) + i);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      g[0] = a.x; g[1] = a.y; g[2] = b.x; g[3] = b.y;
    } else {
      const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(d.grad) + i);
      g[0] = v.x; g[1] = v.y; g[2] = v.z; g[3] = v.w;
    }
  } else {
    g[0] = d.grad_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(d.grad)[i])
                       : static_cast<const float*>(d.grad)[i];
  }
}

template <int kN>
__device__ __forceinline__ void Load4(const float* p, float (&v)[4]) {
  if constexpr (kN == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  } else {
    v[0] = *p;
  }
}
template <int kN>
__device__ __forceinline__ void Store4(float* p, const float (&v)[4]) {
  if constexpr (kN == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *p = v[0];
  }
}

template <int kN>
__device__ __forceinline__ void UpdateAt(const Descriptor& d, int64_t i, const StepConsts& c) {
  float g[4], m[4], v[4], p[4];
  LoadGrad<kN>(d, i, g);
  Load4<kN>(d.m + i, m);
  Load4<kN>(d.v + i, v);
  Load4<kN>(d.param + i, p);
  const float decay = Decay(c, d.weight_decay);
#pragma unroll
  for (int k = 0; k < kN; ++k) UpdateElement(c, decay, g[k], m[k], v[k], p[k]);
  Store4<kN>(d.m + i, m);
  Store4<kN>(d.v + i, v);
  Store4<kN>(d.param + i, p);
  if (d.param_copy != nullptr && d.copy_f16) {
    __half* out = reinterpret_cast<__half*>(d.param_copy) + i;
    if constexpr (kN == 4) {
      uint2 raw;
      *reinterpret_cast<__half2*>(&raw.x) = __floats2half2_rn(p[0], p[1]);
      *reinterpret_cast<__half2*>(&raw.y) = __floats2half2_rn(p[2], p[3]);
      *reinterpret_cast<uint2*>(out) = raw;
    } else {
      *out = __float2half_rn(p[0]);
    }
  } else if (d.param_copy != nullptr) {
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(d.param_copy) + i;
    if constexpr (kN == 4) {
      uint2 raw;
      *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(p[0], p[1]);
      *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(p[2], p[3]);
      *reinterpret_cast<uint2*>(out) = raw;
    } else {
      *out = __float2bfloat16_rn(p[0]);
    }
  }
}

// Calls fn.template At<4>(d, i) / At<1>(d, i) over every element of chunk c, block-wide.
template <typename Fn>
__device__ __forceinline__ void ForChunk(const Lists& l, int64_t c, Fn& fn) {
  const Descriptor d = l.desc[l.chunk_tensor[c]];  // a register copy: stores cannot alias it
  const int64_t begin = (c - d.first_chunk) * l.chunk;
  const int64_t end = min(d.numel, begin + l.chunk);
  int64_t scalar_begin = begin;
  if (d.vec) {
    const int64_t end4 = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + int64_t(threadIdx.x) * 4; i < end4; i += int64_t(blockDim.x) * 4) fn.template At<4>(d, i);
    scalar_begin = end4;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += blockDim.x) fn.template At<1>(d, i);
}

struct UpdateFn {
  StepConsts c;
  template <int kN> __device__ void At(const Descriptor& d, int64_t i) { UpdateAt<kN>(d, i, c); }
};

__global__ void __launch_bounds__(kThreads) AdamWKernel(Lists l, Hyper h) {
  UpdateFn fn{LoadConsts(h)};
  if (!isfinite(fn.c.grad_scale)) return;  // the loss scaler's overflow signal: skip the step
  for (int64_t c = blockIdx.x; c < l.chunks; c += gridDim.x) ForChunk(l, c, fn);
}

// Runs after AdamWKernel on the same stream: every block has read the old step by then.
__global__ void IncrementStepKernel(void* step, bool i64, const float* grad_scale) {
  if (grad_scale != nullptr && !isfinite(*grad_scale)) return;  // a skipped step
  if (i64) {
    *static_cast<int64_t*>(step) += 1;
  } else {
    *static_cast<int32_t*>(step) += 1;
  }
}

struct SquareSumFn {
  float acc = 0.f;
  template <int kN> __device__ void At(const Descriptor& d, int64_t i) {
    float g[4];
    LoadGrad<kN>(d, i, g);
#pragma unroll
    for (int k = 0; k < kN; ++k) acc += g[k] * g[k];
  }
};

// partial[c] = sum of squares of chunk c (thread sums, then a fixed-order block reduction).
__global__ void __launch_bounds__(kThreads) SquareSumKernel(Lists l, float* partial) {
  __shared__ float warp_sums[kThreads / 32];
  for (int64_t c = blockIdx.x; c < l.chunks; c += gridDim.x) {
    SquareSumFn fn;
    ForChunk(l, c, fn);
    const float w = cuda_vec::WarpSum(fn.acc);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = w;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.f;
      for (int k = 0; k < kThreads / 32; ++k) s += warp_sums[k];
      partial[c] = s;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(1024)
    NormFinishKernel(const float* partial, int64_t chunks, float max_norm, float* norm, float* clip) {
  __shared__ double sums[1024];
  double s = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) s += double(partial[c]);
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float n = float(sqrt(sums[0]));
    *norm = n;
    if (clip != nullptr) *clip = max_norm > 0.f ? fminf(1.f, max_norm / (n + 1e-6f)) : 1.f;
  }
}

struct ScaleFn {
  float s;
  template <int kN> __device__ void At(const Descriptor& d, int64_t i) {
    float g[4];
    LoadGrad<kN>(d, i, g);
#pragma unroll
    for (int k = 0; k < kN; ++k) g[k] *= s;
    if (d.grad_bf16) {
      __nv_bfloat16* p = static_cast<__nv_bfloat16*>(d.grad) + i;
      if constexpr (kN == 4) {
        uint2 raw;
        *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(g[0], g[1]);
        *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(g[2], g[3]);
        *reinterpret_cast<uint2*>(p) = raw;
      } else {
        *p = __float2bfloat16_rn(g[0]);
      }
    } else {
      Store4<kN>(static_cast<float*>(d.grad) + i, g);
    }
  }
};

// One thread: UpdateLossScaleCpu's formulas (adamw_cpu.cc), on the device.
__global__ void LossScaleKernel(ScalerConfig c, ScalerValues v) {
  const float s = *v.scale;
  const float norm = *v.norm / s;
  *v.norm = norm;
  if (!isfinite(norm)) {
    *v.grad_scale = CUDART_NAN_F;
    *v.skipped = 1.f;
    *v.good_steps = 0.f;
    *v.scale = fmaxf(s * c.backoff, c.min_scale);
    if (v.step != nullptr) *v.step -= 1.f;
    return;
  }
  const float clip = c.max_norm > 0.f ? fminf(1.f, c.max_norm / (norm + 1e-6f)) : 1.f;
  *v.grad_scale = clip / s;
  *v.skipped = 0.f;
  *v.good_steps += 1.f;
  if (*v.good_steps >= float(c.growth_interval)) {
    *v.good_steps = 0.f;
    if (isfinite(s * c.growth)) *v.scale = s * c.growth;
  }
}

__global__ void __launch_bounds__(kThreads) ScaleKernel(Lists l, const float* scale) {
  ScaleFn fn{*scale};
  for (int64_t c = blockIdx.x; c < l.chunks; c += gridDim.x) ForChunk(l, c, fn);
}

}  // namespace

absl::Status StepCuda(const Lists& l, const Hyper& h, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Read at every call, so benchmarks and tests can switch kernels between calls.
  const char* variant = std::getenv("SG_ADAMW_KERNEL");
  if (variant != nullptr && *variant != 0 && std::strcmp(variant, "default") != 0) {
    SG_RETURN_IF_ERROR(StepCudaVariant(variant, l, h, stream));
  } else {
    AdamWKernel<<<cuda_vec::GridFor(l.chunks), kThreads, 0, s>>>(l, h);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(AdamWKernel);
  }
  IncrementStepKernel<<<1, 1, 0, s>>>(const_cast<void*>(h.step), h.step_i64, h.grad_scale);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(IncrementStepKernel);
  return absl::OkStatus();
}

absl::Status GradNormCuda(const Lists& l, float max_norm, float* norm, float* clip, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(l.chunks * int64_t(sizeof(float))));
  float* partial = static_cast<float*>(scratch);
  SquareSumKernel<<<cuda_vec::GridFor(l.chunks), kThreads, 0, s>>>(l, partial);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    NormFinishKernel<<<1, 1024, 0, s>>>(partial, l.chunks, max_norm, norm, clip);
    err = cudaGetLastError();
  }
  alloc->Free(scratch);  // reused only by later work on the same stream
  SG_CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

absl::Status ScaleGradsCuda(const Lists& l, const float* scale, void* stream) {
  ScaleKernel<<<cuda_vec::GridFor(l.chunks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(l, scale);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ScaleKernel);
  return absl::OkStatus();
}

absl::Status UpdateLossScaleCuda(const ScalerConfig& c, const ScalerValues& v, void* stream) {
  LossScaleKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(c, v);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(LossScaleKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::adamw_internal
