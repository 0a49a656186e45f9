// CUDA multi-tensor AdamW, gradient norm and scaling. The list's chunk table maps each chunk of
// kChunk (65536) elements to its tensor.
//
// AdamW: one CTA per tile of 1024 elements (256 threads x one 4-element pack), no loop, so the
// grid is chunks x 64 CTAs and the hardware scheduler balances it. Each thread issues all its
// loads (16 bytes of m, v, param; 16 of an f32 gradient or 8 of a bf16 one) before any store, as
// volatile inline PTX: with plain C++ accesses nvcc had sunk loads below the math and split the
// vector stores into 4-byte ones. The grad dtype and copy kind are uniform over a tensor, so the
// kernel branches once per tile into a specialised path. Unaligned tensors and the last < 4
// elements of a tensor take a scalar path. Per element: 28 bytes (f32 grad) or 26 (bf16), plus 2
// for a bf16/f16 copy of the weights; bandwidth-bound. The per-element math (adamw_step.cuh) has
// every rounding spelled out.
//
// Why this schedule: the sweep this kernel won, on the H200 on 2026-11-30, 1.26e9 f32 parameters
// in 16 tensors, f32 gradients, ms per step (decimal TB/s). Names: grid8 = persistent grid of 8
// CTAs per SM striding over chunks (the former default), res = one resident wave striding over
// chunks, tile = one resident wave striding over tiles, flat = one CTA per tile (this kernel);
// uN = N packs loaded per thread before any store; v8 = 8-element packs; cs / stcs / na =
// evict-first loads+stores / stores only, L1::no_allocate loads.
//   + bf16 copy (30 B/element)                     no copy (28 B/element)
//   grid8 (old default)  10.09 (3.74 TB/s)         grid8     9.15
//   grid8_u1  9.89   res_u1  9.67   res_u2  9.94   res_u1    8.93
//   tile_u1  10.03   tile_u2 10.19  tile_u4 10.13
//   tile_u2_cs 10.05  tile_u2_stcs 10.11  tile_u2_na 10.56  tile_u2_v8 9.93
//   flat_u1   9.08 (4.16 TB/s)  <- this kernel     flat_u1   8.49 (4.15 TB/s)
//   flat_u2 9.25  flat_u2_cs 9.25  flat_u2_v8 9.28 flat_u2   8.55
//   PyTorch in the same run: fused=True eager step 10.23 and torch.compile foreach step 8.39 (no
//   copy); step + bf16 copy: eager 12.38, torch.compile 10.20.
// More packs in flight, wider packs and cache hints did not pay; a grid with no loop did (not
// profiled; a likely reason: a striding grid ends with a partial wave and a tail of CTAs finishing
// their last chunk, while 1.2M one-tile CTAs keep every SM full to the end).
//
// GradNorm's SquareSumKernel and ScaleGrads' ScaleKernel still use the persistent grid (GridFor:
// 8 CTAs per SM striding over chunks) that was slower for AdamW; they were not measured. For
// ScaleKernel a CTA per tile is a trivial change (launch chunks << 6 CTAs, ForChunk over one
// tile); for SquareSumKernel it means a partial sum per tile (64x the scratch and the finishing
// sum) or one CTA per whole chunk, either a small change that wants its own measurement.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/adamw/adamw_internal.h"
#include "kernels/adamw/adamw_step.cuh"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::adamw_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kPack = 4;                 // elements per thread: one 16-byte access per f32 stream
constexpr int kTile = kThreads * kPack;  // elements per AdamW CTA
static_assert((kTile & (kTile - 1)) == 0, "a tile must divide the power-of-two chunk");

// --- AdamW -------------------------------------------------------------------------------------

// 16- and 8-byte global accesses, p aligned to the size. Volatile inline PTX keeps them in
// program order, so UpdatePack's loads stay ahead of its stores.
__device__ __forceinline__ uint4 Load16(const void* p) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 Load8(const void* p) {
  uint2 r;
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ __forceinline__ void Store16(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void Store8(void* p, uint2 v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
}

enum class Copy { kNone, kBF16, kF16 };

// Two floats rounded to the copy's 16-bit type, the first in the low half (memory order).
template <Copy kCopy>
__device__ __forceinline__ uint32_t PackTwo(float a, float b) {
  static_assert(kCopy != Copy::kNone, "no copy to pack for");
  if constexpr (kCopy == Copy::kF16) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

__device__ __forceinline__ uint4 Bits(const float (&x)[4]) {
  return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3]));
}

// The 4 elements at i (a multiple of 4 in a 16-byte aligned tensor): every load, then the math,
// then every store.
template <bool kBf16Grad, Copy kCopy>
__device__ __forceinline__ void UpdatePack(const Descriptor& d, int64_t i, const StepConsts& c, float decay) {
  uint32_t g[kPack];
  if constexpr (kBf16Grad) {
    const uint2 r = Load8(static_cast<const __nv_bfloat16*>(d.grad) + i);
    g[0] = r.x << 16;  // a bf16 is the high half of the f32 with the same value
    g[1] = r.x & 0xffff0000u;
    g[2] = r.y << 16;
    g[3] = r.y & 0xffff0000u;
  } else {
    const uint4 r = Load16(static_cast<const float*>(d.grad) + i);
    g[0] = r.x;
    g[1] = r.y;
    g[2] = r.z;
    g[3] = r.w;
  }
  const uint4 mw = Load16(d.m + i), vw = Load16(d.v + i), pw = Load16(d.param + i);
  float m[kPack] = {__uint_as_float(mw.x), __uint_as_float(mw.y), __uint_as_float(mw.z), __uint_as_float(mw.w)};
  float v[kPack] = {__uint_as_float(vw.x), __uint_as_float(vw.y), __uint_as_float(vw.z), __uint_as_float(vw.w)};
  float p[kPack] = {__uint_as_float(pw.x), __uint_as_float(pw.y), __uint_as_float(pw.z), __uint_as_float(pw.w)};
#pragma unroll
  for (int k = 0; k < kPack; ++k) UpdateElement(c, decay, __uint_as_float(g[k]), m[k], v[k], p[k]);
  Store16(d.m + i, Bits(m));
  Store16(d.v + i, Bits(v));
  Store16(d.param + i, Bits(p));
  if constexpr (kCopy != Copy::kNone) {
    Store8(d.param_copy + i, make_uint2(PackTwo<kCopy>(p[0], p[1]), PackTwo<kCopy>(p[2], p[3])));
  }
}

// One element, plain accesses: unaligned tensors and the elements after a tensor's last pack.
template <bool kBf16Grad, Copy kCopy>
__device__ __forceinline__ void UpdateOne(const Descriptor& d, int64_t i, const StepConsts& c, float decay) {
  const float g = kBf16Grad ? __bfloat162float(static_cast<const __nv_bfloat16*>(d.grad)[i])
                            : static_cast<const float*>(d.grad)[i];
  float m = d.m[i], v = d.v[i], p = d.param[i];
  UpdateElement(c, decay, g, m, v, p);
  d.m[i] = m;
  d.v[i] = v;
  d.param[i] = p;
  if constexpr (kCopy == Copy::kF16) {
    reinterpret_cast<__half*>(d.param_copy)[i] = __float2half_rn(p);
  } else if constexpr (kCopy == Copy::kBF16) {
    reinterpret_cast<__nv_bfloat16*>(d.param_copy)[i] = __float2bfloat16_rn(p);
  }
}

// Elements [begin, end) of one tensor, at most one tile, CTA-wide; begin is a multiple of kPack.
template <bool kBf16Grad, Copy kCopy>
__device__ __forceinline__ void UpdateTileAs(const Descriptor& d, int64_t begin, int64_t end, const StepConsts& c,
                                             float decay) {
  int64_t scalar_begin = begin;
  if (d.vec) {
    const int64_t end_vec = begin + (end - begin) / kPack * kPack;
    const int64_t i = begin + int64_t(threadIdx.x) * kPack;
    if (i + kPack <= end_vec) UpdatePack<kBf16Grad, kCopy>(d, i, c, decay);
    scalar_begin = end_vec;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) UpdateOne<kBf16Grad, kCopy>(d, i, c, decay);
}

// The gradient type and copy kind are uniform over a tensor: one branch here, none per element.
__device__ __forceinline__ void UpdateTile(const Descriptor& d, int64_t begin, int64_t end, const StepConsts& c) {
  const float decay = Decay(c, d.weight_decay);
  const Copy copy = d.param_copy == nullptr ? Copy::kNone : (d.copy_f16 ? Copy::kF16 : Copy::kBF16);
  if (d.grad_bf16) {
    if (copy == Copy::kNone) {
      UpdateTileAs<true, Copy::kNone>(d, begin, end, c, decay);
    } else if (copy == Copy::kBF16) {
      UpdateTileAs<true, Copy::kBF16>(d, begin, end, c, decay);
    } else {
      UpdateTileAs<true, Copy::kF16>(d, begin, end, c, decay);
    }
  } else {
    if (copy == Copy::kNone) {
      UpdateTileAs<false, Copy::kNone>(d, begin, end, c, decay);
    } else if (copy == Copy::kBF16) {
      UpdateTileAs<false, Copy::kBF16>(d, begin, end, c, decay);
    } else {
      UpdateTileAs<false, Copy::kF16>(d, begin, end, c, decay);
    }
  }
}

// CTA b updates tile b & (2^tiles_log2 - 1) of chunk b >> tiles_log2 (2^tiles_log2 tiles a chunk;
// those past the end of a tensor's last chunk are empty). The tile's descriptor and the step
// constants are independent loads, issued together.
__global__ void __launch_bounds__(kThreads) AdamWKernel(Lists l, Hyper h, int tiles_log2) {
  const int64_t b = blockIdx.x;
  const int64_t chunk = b >> tiles_log2;
  const Descriptor d = l.desc[l.chunk_tensor[chunk]];  // a register copy: stores cannot alias it
  const StepConsts c = LoadConsts(h);
  if (!isfinite(c.grad_scale)) return;  // the loss scaler's overflow signal: skip the step
  const int64_t begin = (chunk - d.first_chunk) * l.chunk + (b & ((int64_t(1) << tiles_log2) - 1)) * kTile;
  if (begin < d.numel) UpdateTile(d, begin, min(d.numel, begin + kTile), c);
}

// Runs after AdamWKernel on the same stream: every CTA has read the old step by then.
__global__ void IncrementStepKernel(void* step, bool i64, const float* grad_scale) {
  if (grad_scale != nullptr && !isfinite(*grad_scale)) return;  // a skipped step
  if (i64) {
    *static_cast<int64_t*>(step) += 1;
  } else {
    *static_cast<int32_t*>(step) += 1;
  }
}

// --- Gradient norm and scaling -----------------------------------------------------------------

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

// Calls fn.template At<4>(d, i) / At<1>(d, i) over every element of chunk c, CTA-wide.
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
      float* p = static_cast<float*>(d.grad) + i;
      if constexpr (kN == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(g[0], g[1], g[2], g[3]);
      } else {
        *p = g[0];
      }
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
  int tiles_log2 = 0;
  while ((int64_t(kTile) << tiles_log2) < l.chunk) ++tiles_log2;
  if ((int64_t(kTile) << tiles_log2) != l.chunk) {
    return absl::InternalError(
        absl::StrCat("AdamW: the tile of ", kTile, " elements does not divide the chunk of ", l.chunk));
  }
  const int64_t tiles = l.chunks << tiles_log2;
  SG_CHECK_ARG(tiles < (int64_t(1) << 31), "AdamW: ", tiles, " tiles of ", kTile,
               " elements exceed the 2^31 - 1 CTAs of a grid");
  AdamWKernel<<<unsigned(tiles), kThreads, 0, s>>>(l, h, tiles_log2);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AdamWKernel);
  IncrementStepKernel<<<1, 1, 0, s>>>(const_cast<void*>(h.step), h.step_i64, h.grad_scale);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(IncrementStepKernel);
  return absl::OkStatus();
}

absl::Status GradNormCuda(const Lists& l, float max_norm, float* norm, float* clip, float* given, int device,
                          void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  void* scratch = given;
  if (scratch == nullptr) {
    SG_ASSIGN_OR_RETURN(scratch, alloc->Allocate(l.chunks * int64_t(sizeof(float))));
  }
  float* partial = static_cast<float*>(scratch);
  SquareSumKernel<<<cuda_vec::GridFor(l.chunks), kThreads, 0, s>>>(l, partial);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    NormFinishKernel<<<1, 1024, 0, s>>>(partial, l.chunks, max_norm, norm, clip);
    err = cudaGetLastError();
  }
  if (given == nullptr) alloc->Free(scratch);  // reused only by later work on the same stream
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
