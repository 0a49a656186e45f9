// Experimental CUDA AdamW kernels, selected per call by SG_ADAMW_KERNEL (adamw.cu's StepCuda)
// until an H200 run picks the one that becomes the default. Same chunk table and the same
// per-element math as the default (adamw_step.cuh, so the same bits); only the memory schedule
// differs. Why the default may leave bandwidth unused: each thread issues one 16-byte load per
// stream, then stores, and the next iteration's loads cannot move above those stores (they may
// alias), so a thread has 64 bytes in flight; and at 48 registers an SM holds 5 of the 8 blocks
// GridFor launches per SM, so the last 3/8 of the persistent grid runs as a second, partial wave.
//
// A name is parts joined by '_' (kVariants below lists the ones compiled):
//   grid8 | res | tile | flat   the grid: persistent with GridFor's 8 blocks per SM striding over
//       65536-element chunks (the default's grid); persistent with one resident wave
//       (ResidentGrid) striding over chunks; one resident wave striding over tiles (a tile: threads
//       x pack x unroll elements), so the whole grid works in one contiguous window of the list and
//       the work is balanced to a tile; or one block per tile, no loop (Inductor's launch).
//   u1 | u2 | u4   packs per thread loaded from every stream (g, m, v, p) before any store.
//   v8             8 elements a pack (two 16-byte accesses per f32 stream, one per 2-byte one); else 4.
//   t512           512-thread blocks; else 256.
//   bN             __launch_bounds__ asks for N resident blocks per SM (caps the registers).
//   cs | stcs | na cache hints: ld.global.cs and st.global.cs (evict-first: every byte is touched
//       once and 35 GB dwarf the 60 MB L2); only the stores .cs; loads ld.global.L1::no_allocate.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/adamw/adamw_internal.h"
#include "kernels/adamw/adamw_step.cuh"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::adamw_internal {
namespace {

enum class Grid { kChunks8, kChunksResident, kTilesResident, kFlat };
enum class Hint { kPlain, kStream, kNoAllocate };  // kNoAllocate: loads only
enum class Copy { kNone, kBF16, kF16 };

// kMinBlocks: __launch_bounds__'s minimum resident blocks per SM (0: none, registers as the compiler
// likes; more caps the registers, e.g. 5 blocks of 256 threads: 48 a thread).
template <int kThreadsT, int kPackT, int kUnrollT, Hint kLoadT = Hint::kPlain, Hint kStoreT = Hint::kPlain,
          int kMinBlocksT = 0>
struct Tuning {
  static constexpr int kThreads = kThreadsT, kPack = kPackT, kUnroll = kUnrollT, kMinBlocks = kMinBlocksT;
  static constexpr Hint kLoad = kLoadT, kStore = kStoreT;
  static constexpr int kTile = kThreads * kPack * kUnroll;  // elements a block covers in one pass
  static_assert(kPack == 4 || kPack == 8, "a pack is one or two 16-byte f32 accesses");
  static_assert(kUnroll >= 1 && kUnroll <= 8, "packs in flight per thread");
  static_assert((kTile & (kTile - 1)) == 0, "tiles must divide the power-of-two chunk");
  static_assert(kStore != Hint::kNoAllocate, "L1::no_allocate is a load hint");
};

// 16- and 8-byte global accesses with cache hint H; p aligned to the size. Inline PTX, volatile:
// the compiler keeps these in program order, so the loads UpdatePacks issues first stay ahead of
// its stores (with plain C++ accesses nvcc sank the second pack's loads below the first pack's
// math and split the vector stores into 4-byte ones).
template <Hint H>
__device__ __forceinline__ uint4 Load16(const void* p) {
  uint4 r;
  if constexpr (H == Hint::kStream) {
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else if constexpr (H == Hint::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  }
  return r;
}
template <Hint H>
__device__ __forceinline__ uint2 Load8(const void* p) {
  uint2 r;
  if constexpr (H == Hint::kStream) {
    asm volatile("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  } else if constexpr (H == Hint::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  } else {
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  }
  return r;
}
template <Hint H>
__device__ __forceinline__ void Store16(void* p, uint4 v) {
  if constexpr (H == Hint::kStream) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
  }
}
template <Hint H>
__device__ __forceinline__ void Store8(void* p, uint2 v) {
  if constexpr (H == Hint::kStream) {
    asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
  } else {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
  }
}

// kWords (2, 4 or 8) consecutive 32-bit words at p in one or two accesses.
template <int kWords, Hint H>
__device__ __forceinline__ void LoadWords(const void* p, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 2) {
    const uint2 r = Load8<H>(p);
    w[0] = r.x;
    w[1] = r.y;
  } else {
    static_assert(kWords % 4 == 0, "whole 16-byte accesses");
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      const uint4 r = Load16<H>(static_cast<const uint4*>(p) + k);
      w[4 * k] = r.x;
      w[4 * k + 1] = r.y;
      w[4 * k + 2] = r.z;
      w[4 * k + 3] = r.w;
    }
  }
}
template <int kWords, Hint H>
__device__ __forceinline__ void StoreWords(void* p, const uint32_t (&w)[kWords]) {
  if constexpr (kWords == 2) {
    Store8<H>(p, make_uint2(w[0], w[1]));
  } else {
    static_assert(kWords % 4 == 0, "whole 16-byte accesses");
#pragma unroll
    for (int k = 0; k < kWords / 4; ++k) {
      Store16<H>(static_cast<uint4*>(p) + k, make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]));
    }
  }
}

// Two floats rounded to the copy's 16-bit type, the first in the low half (memory order).
template <Copy kCopy>
__device__ __forceinline__ uint32_t PackTwo(float a, float b) {
  if constexpr (kCopy == Copy::kF16) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// kN packs of this thread at elements i, i + stride, ... (stride = threads x pack): every load of
// every pack is issued before the first store.
template <class T, bool kBf16Grad, Copy kCopy, int kN>
__device__ __forceinline__ void UpdatePacks(const Descriptor& d, int64_t i, const StepConsts& c, float decay) {
  constexpr int kP = T::kPack;
  constexpr int kGradWords = kBf16Grad ? kP / 2 : kP;
  constexpr int64_t kStride = int64_t(T::kThreads) * kP;
  uint32_t g[kN][kGradWords], m[kN][kP], v[kN][kP], p[kN][kP];
#pragma unroll
  for (int u = 0; u < kN; ++u) {
    const int64_t e = i + u * kStride;
    LoadWords<kGradWords, T::kLoad>(static_cast<const char*>(d.grad) + e * (kBf16Grad ? 2 : 4), g[u]);
    LoadWords<kP, T::kLoad>(d.m + e, m[u]);
    LoadWords<kP, T::kLoad>(d.v + e, v[u]);
    LoadWords<kP, T::kLoad>(d.param + e, p[u]);
  }
#pragma unroll
  for (int u = 0; u < kN; ++u) {
    const int64_t e = i + u * kStride;
#pragma unroll
    for (int k = 0; k < kP; ++k) {
      const uint32_t gw = kBf16Grad ? (k % 2 == 0 ? g[u][k / 2] << 16 : g[u][k / 2] & 0xffff0000u) : g[u][k];
      float mk = __uint_as_float(m[u][k]), vk = __uint_as_float(v[u][k]), pk = __uint_as_float(p[u][k]);
      UpdateElement(c, decay, __uint_as_float(gw), mk, vk, pk);
      m[u][k] = __float_as_uint(mk);
      v[u][k] = __float_as_uint(vk);
      p[u][k] = __float_as_uint(pk);
    }
    StoreWords<kP, T::kStore>(d.m + e, m[u]);
    StoreWords<kP, T::kStore>(d.v + e, v[u]);
    StoreWords<kP, T::kStore>(d.param + e, p[u]);
    if constexpr (kCopy != Copy::kNone) {
      uint32_t h[kP / 2];
#pragma unroll
      for (int k = 0; k < kP / 2; ++k) h[k] = PackTwo<kCopy>(__uint_as_float(p[u][2 * k]), __uint_as_float(p[u][2 * k + 1]));
      StoreWords<kP / 2, T::kStore>(d.param_copy + e, h);
    }
  }
}

// One element, plain accesses: unaligned tensors and the elements after the last whole pack.
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

// Elements [begin, end) of one tensor, block-wide; begin is a multiple of the pack.
template <class T, bool kBf16Grad, Copy kCopy>
__device__ __forceinline__ void UpdateRangeAs(const Descriptor& d, int64_t begin, int64_t end, const StepConsts& c,
                                              float decay) {
  constexpr int kP = T::kPack;
  constexpr int64_t kStride = int64_t(T::kThreads) * kP;
  int64_t scalar_begin = begin;
  if (d.vec) {
    const int64_t end_vec = begin + (end - begin) / kP * kP;
    int64_t i = begin + int64_t(threadIdx.x) * kP;
    for (; i + (T::kUnroll - 1) * kStride + kP <= end_vec; i += T::kUnroll * kStride) {
      UpdatePacks<T, kBf16Grad, kCopy, T::kUnroll>(d, i, c, decay);
    }
    if constexpr (T::kUnroll > 1) {
      for (; i + kP <= end_vec; i += kStride) UpdatePacks<T, kBf16Grad, kCopy, 1>(d, i, c, decay);
    }
    scalar_begin = end_vec;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += T::kThreads) UpdateOne<kBf16Grad, kCopy>(d, i, c, decay);
}

// The gradient type and copy kind are uniform over a range: one branch here, none per pack.
template <class T>
__device__ __forceinline__ void UpdateRange(const Descriptor& d, int64_t begin, int64_t end, const StepConsts& c) {
  const float decay = Decay(c, d.weight_decay);
  const Copy copy = d.param_copy == nullptr ? Copy::kNone : (d.copy_f16 ? Copy::kF16 : Copy::kBF16);
  if (d.grad_bf16) {
    if (copy == Copy::kNone) {
      UpdateRangeAs<T, true, Copy::kNone>(d, begin, end, c, decay);
    } else if (copy == Copy::kBF16) {
      UpdateRangeAs<T, true, Copy::kBF16>(d, begin, end, c, decay);
    } else {
      UpdateRangeAs<T, true, Copy::kF16>(d, begin, end, c, decay);
    }
  } else {
    if (copy == Copy::kNone) {
      UpdateRangeAs<T, false, Copy::kNone>(d, begin, end, c, decay);
    } else if (copy == Copy::kBF16) {
      UpdateRangeAs<T, false, Copy::kBF16>(d, begin, end, c, decay);
    } else {
      UpdateRangeAs<T, false, Copy::kF16>(d, begin, end, c, decay);
    }
  }
}

// Tile b of the list: chunk b >> log2, tile b & (2^log2 - 1) of it (2^log2 tiles a chunk; those
// past the end of a tensor's last chunk are empty). d: the chunk's tensor.
template <class T>
__device__ __forceinline__ void UpdateTile(const Descriptor& d, int64_t b, int log2, int64_t chunk,
                                           const StepConsts& c) {
  const int64_t k = b >> log2;
  const int64_t begin = (k - d.first_chunk) * chunk + (b & ((int64_t(1) << log2) - 1)) * T::kTile;
  if (begin < d.numel) UpdateRange<T>(d, begin, min(d.numel, begin + T::kTile), c);
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) ChunksKernel(Lists l, Hyper h) {
  const StepConsts c = LoadConsts(h);
  if (!isfinite(c.grad_scale)) return;  // the loss scaler's overflow signal: skip the step
  for (int64_t k = blockIdx.x; k < l.chunks; k += gridDim.x) {
    const Descriptor d = l.desc[l.chunk_tensor[k]];
    const int64_t begin = (k - d.first_chunk) * l.chunk;
    UpdateRange<T>(d, begin, min(d.numel, begin + l.chunk), c);
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) TilesKernel(Lists l, Hyper h, int log2) {
  const StepConsts c = LoadConsts(h);
  if (!isfinite(c.grad_scale)) return;
  const int64_t tiles = l.chunks << log2;
  int64_t b = blockIdx.x;
  int32_t tensor = b < tiles ? l.chunk_tensor[b >> log2] : 0;
  for (; b < tiles; b += gridDim.x) {
    const Descriptor d = l.desc[tensor];  // a register copy: stores cannot alias it
    // The next tile's tensor, loaded before this tile's stores (after them it would wait a full
    // load latency at the top of every tile).
    if (b + gridDim.x < tiles) tensor = l.chunk_tensor[(b + gridDim.x) >> log2];
    UpdateTile<T>(d, b, log2, l.chunk, c);
  }
}

// The tile's descriptor and the step constants are independent loads, issued together.
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) FlatKernel(Lists l, Hyper h, int log2) {
  const int64_t b = blockIdx.x;
  const Descriptor d = l.desc[l.chunk_tensor[b >> log2]];
  const StepConsts c = LoadConsts(h);
  if (!isfinite(c.grad_scale)) return;
  UpdateTile<T>(d, b, log2, l.chunk, c);
}

template <Grid kGrid, class T>
absl::Status Launch(const Lists& l, const Hyper& h, cudaStream_t s) {
  int log2 = 0;
  while ((int64_t(T::kTile) << log2) < l.chunk) ++log2;
  if ((int64_t(T::kTile) << log2) != l.chunk) {
    return absl::InternalError(absl::StrCat("AdamW: tile of ", T::kTile, " elements does not divide the chunk of ",
                                            l.chunk));
  }
  if constexpr (kGrid == Grid::kChunks8) {
    ChunksKernel<T><<<cuda_vec::GridFor(l.chunks), T::kThreads, 0, s>>>(l, h);
  } else if constexpr (kGrid == Grid::kChunksResident) {
    ChunksKernel<T><<<cuda_vec::ResidentGrid(ChunksKernel<T>, T::kThreads, l.chunks), T::kThreads, 0, s>>>(l, h);
  } else if constexpr (kGrid == Grid::kTilesResident) {
    TilesKernel<T><<<cuda_vec::ResidentGrid(TilesKernel<T>, T::kThreads, l.chunks << log2), T::kThreads, 0, s>>>(
        l, h, log2);
  } else {
    const int64_t blocks = l.chunks << log2;
    SG_CHECK_ARG(blocks < (int64_t(1) << 31), "AdamW flat kernel: ", blocks, " tiles exceed the 2^31 - 1 blocks of a grid");
    FlatKernel<T><<<unsigned(blocks), T::kThreads, 0, s>>>(l, h, log2);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AdamWVariantKernel);
  return absl::OkStatus();
}

using Launcher = absl::Status (*)(const Lists&, const Hyper&, cudaStream_t);
struct Variant {
  const char* name;
  Launcher launch;
};
constexpr Hint kCs = Hint::kStream, kNa = Hint::kNoAllocate, kPl = Hint::kPlain;

// ptxas -v (sm_90a, nvcc 13.0): registers / resident 256-thread blocks per SM / bytes in flight
// per SM: default 48/5/80K; *_u1 44/5/80K; *_u2 56-58/4/128K (t512: 56/2 blocks of 512/128K);
// *_u1_v8 58/4/128K; *_u4 and *_u2_v8 90-116/2/128K; tile_u2_b5 48/5/160K (104 B spilled);
// tile_u4_b3 80/3/192K (48 B spilled). No other variant spills.
// One point ("tile_u2") and a step along each axis from it, plus the default's schedule on the
// shared code path ("grid8_u1": its time should match the default's).
constexpr Variant kVariants[] = {
    {"grid8_u1", Launch<Grid::kChunks8, Tuning<256, 4, 1>>},
    {"grid8_u2", Launch<Grid::kChunks8, Tuning<256, 4, 2>>},
    {"res_u1", Launch<Grid::kChunksResident, Tuning<256, 4, 1>>},
    {"res_u2", Launch<Grid::kChunksResident, Tuning<256, 4, 2>>},
    {"res_u4", Launch<Grid::kChunksResident, Tuning<256, 4, 4>>},
    {"tile_u1", Launch<Grid::kTilesResident, Tuning<256, 4, 1>>},
    {"tile_u2", Launch<Grid::kTilesResident, Tuning<256, 4, 2>>},
    {"tile_u4", Launch<Grid::kTilesResident, Tuning<256, 4, 4>>},
    {"tile_u2_b5", Launch<Grid::kTilesResident, Tuning<256, 4, 2, kPl, kPl, 5>>},
    {"tile_u4_b3", Launch<Grid::kTilesResident, Tuning<256, 4, 4, kPl, kPl, 3>>},
    {"tile_u2_cs", Launch<Grid::kTilesResident, Tuning<256, 4, 2, kCs, kCs>>},
    {"tile_u2_stcs", Launch<Grid::kTilesResident, Tuning<256, 4, 2, kPl, kCs>>},
    {"tile_u2_na", Launch<Grid::kTilesResident, Tuning<256, 4, 2, kNa, kPl>>},
    {"tile_u1_v8", Launch<Grid::kTilesResident, Tuning<256, 8, 1>>},
    {"tile_u2_v8", Launch<Grid::kTilesResident, Tuning<256, 8, 2>>},
    {"tile_u2_t512", Launch<Grid::kTilesResident, Tuning<512, 4, 2>>},
    {"flat_u1", Launch<Grid::kFlat, Tuning<256, 4, 1>>},
    {"flat_u2", Launch<Grid::kFlat, Tuning<256, 4, 2>>},
    {"flat_u4", Launch<Grid::kFlat, Tuning<256, 4, 4>>},
    {"flat_u2_cs", Launch<Grid::kFlat, Tuning<256, 4, 2, kCs, kCs>>},
    {"flat_u2_na", Launch<Grid::kFlat, Tuning<256, 4, 2, kNa, kPl>>},
    {"flat_u1_v8", Launch<Grid::kFlat, Tuning<256, 8, 1>>},
    {"flat_u2_v8", Launch<Grid::kFlat, Tuning<256, 8, 2>>},
    {"flat_u2_t512", Launch<Grid::kFlat, Tuning<512, 4, 2>>},
};

}  // namespace

std::vector<std::string> StepVariantNames() {
  std::vector<std::string> names;
  for (const Variant& v : kVariants) names.push_back(v.name);
  return names;
}

absl::Status StepCudaVariant(const char* name, const Lists& l, const Hyper& h, void* stream) {
  for (const Variant& v : kVariants) {
    if (std::strcmp(v.name, name) == 0) return v.launch(l, h, static_cast<cudaStream_t>(stream));
  }
  return absl::InvalidArgumentError(absl::StrCat("SG_ADAMW_KERNEL=", name,
                                                 ": unknown AdamW kernel, expected default or one of ",
                                                 absl::StrJoin(StepVariantNames(), ", ")));
}

}  // namespace sg::kernels::adamw_internal
