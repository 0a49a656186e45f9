// Device-side helpers shared by the memory-bound CUDA kernels (elementwise, RMSNorm and add+RMSNorm,
// SwiGLU, RoPE, embedding, cross-entropy, AdamW): 8-element register packs moved with 16-byte
// accesses (as floats, Pack8, or raw until used, Raw8), scalar conversions, warp reductions and a
// grid size from the SM count. Only meaningful inside nvcc-compiled files.
//
//   float v[8];
//   Pack8<__nv_bfloat16>::Load(x + i, v);   // one 16-byte load (two for f32)
//   Pack8<float>::Store(y + i, v);          // x + i, y + i must be 16-byte aligned
#ifndef SGTRAIN_KERNELS_ELEMENTWISE_CUDA_VEC_H_
#define SGTRAIN_KERNELS_ELEMENTWISE_CUDA_VEC_H_

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"

namespace sg::kernels::cuda_vec {

// Scalar element <-> f32.
template <typename T> __device__ __forceinline__ float ToF(T v);
template <> __device__ __forceinline__ float ToF(float v) { return v; }
template <> __device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ float FromF(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 FromF(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half FromF(float v) { return __float2half_rn(v); }

// Eight consecutive elements of T as floats: 16 bytes for 2-byte types, 32 bytes (two float4) for
// f32. Pointers must be 16-byte aligned.
template <typename T> struct Pack8;
template <> struct Pack8<float> {
  __device__ __forceinline__ static void Load(const float* p, float (&o)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  }
  __device__ __forceinline__ static void Store(float* p, const float (&i)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(i[0], i[1], i[2], i[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(i[4], i[5], i[6], i[7]);
  }
};
template <typename H, typename H2> struct Pack8Half {
  __device__ __forceinline__ static void Load(const H* p, float (&o)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const H2* h = reinterpret_cast<const H2*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[2 * k] = ToF<H>(h[k].x);
      o[2 * k + 1] = ToF<H>(h[k].y);
    }
  }
  __device__ __forceinline__ static void Store(H* p, const float (&i)[8]) {
    uint4 raw;
    H* h = reinterpret_cast<H*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = FromF<H>(i[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
};
template <> struct Pack8<__nv_bfloat16> : Pack8Half<__nv_bfloat16, __nv_bfloat162> {};
template <> struct Pack8<__half> : Pack8Half<__half, __half2> {};

// Eight elements of T kept as raw bytes in registers (one uint4 for 2-byte types: half the registers
// of floats; two for f32) between a load and their use, e.g. while a row reduction completes.
template <typename T>
struct Raw8 {
  uint4 v[sizeof(T) / 2];
};
// 16-byte loads of data read exactly once. p must be 16-byte aligned. Plain ld.global: the
// streaming (evict-first, ld.global.cs) form these used to be was slower on H200 (SwiGLU flat
// kernel, 16384 x 8192 bf16, same call 2026-11-30: 3.77 / 3.72 TB/s forward / backward with .cs,
// 3.94 / 3.90 plain; the read-only path, ld.global.nc, gave nothing over plain: 3.94 / 3.89).
template <typename T>
__device__ __forceinline__ Raw8<T> LoadRawOnce(const T* p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 2); ++i) r.v[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}
template <typename T>
__device__ __forceinline__ void StoreRaw(T* p, const Raw8<T>& r) {
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 2); ++i) reinterpret_cast<uint4*>(p)[i] = r.v[i];
}
template <typename T>
__device__ __forceinline__ void Unpack(const Raw8<T>& r, float (&o)[8]) {
  Pack8<T>::Load(reinterpret_cast<const T*>(&r), o);
}
// Rounds to T (round to nearest even) and packs.
template <typename T>
__device__ __forceinline__ Raw8<T> PackRounded(const float (&v)[8]) {
  Raw8<T> r;
  Pack8<T>::Store(reinterpret_cast<T*>(&r), v);
  return r;
}

// `n` (<= 8) elements one at a time: the tail after the last full pack, or unaligned data.
template <typename T>
__device__ __forceinline__ void LoadScalars(const T* p, int n, float (&o)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = k < n ? ToF<T>(p[k]) : 0.f;
}
template <typename T>
__device__ __forceinline__ void StoreScalars(T* p, int n, const float (&i)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k < n) p[k] = FromF<T>(i[k]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Blocks for a grid-stride kernel: enough resident blocks to fill every SM `per_sm` times over, but
// no more than the work needs. The SM count is read once per device.
inline unsigned GridFor(int64_t work_blocks, int per_sm = 8) {
  static int sms[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (sms[dev] == 0) cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev);
  const int64_t cap = int64_t(sms[dev] > 0 ? sms[dev] : 132) * per_sm;
  return unsigned(work_blocks < 1 ? 1 : (work_blocks < cap ? work_blocks : cap));
}

// Blocks for a grid-stride kernel: exactly one wave, as many blocks of `threads` as the occupancy
// of `kernel` lets every SM hold at once, but no more than the work needs. GridFor's fixed 8 per SM
// overshoots kernels that fit fewer: at 3 resident blocks per SM it is 2.67 waves, and the partial
// last one leaves a third of every SM idle while it runs. Looked up once per kernel, block size
// and device.
template <typename Kernel>
unsigned ResidentGrid(Kernel kernel, int threads, int64_t work_blocks, size_t smem = 0) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static std::map<std::tuple<const void*, int, int, size_t>, int64_t> cache;
  int dev = 0;
  cudaGetDevice(&dev);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, dev, smem);
  int64_t cap = 0;
  {
    absl::MutexLock lock(&mu);
    auto it = cache.find(key);
    if (it != cache.end()) cap = it->second;
  }
  if (cap == 0) {
    int per_sm = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess || per_sm < 1) {
      per_sm = 1;
    }
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) sms = 132;
    cap = int64_t(per_sm) * sms;
    absl::MutexLock lock(&mu);
    cache[key] = cap;
  }
  return unsigned(work_blocks < 1 ? 1 : (work_blocks < cap ? work_blocks : cap));
}

}  // namespace sg::kernels::cuda_vec

#endif  // __CUDACC__
#endif  // SGTRAIN_KERNELS_ELEMENTWISE_CUDA_VEC_H_
