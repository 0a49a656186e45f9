// CUDA SwiGLU. Each thread takes packs of 8 outputs (16-byte accesses for bf16, two for f32) over a
// grid-stride loop that keeps every SM at full occupancy: with 2 (forward) or 3 (backward) 16-byte
// loads per thread in flight that is ~64-96 KB per SM, above the ~25 KB per SM HBM3e needs at H200
// latency. The packed [gate | up] form indexes by row; separate tensors are one flat row.
//
// The default for the 16-byte layout is the flat kernel below; SG_SWIGLU_KERNEL=grid selects these.
// Backward, two kernels selected by SG_SWIGLU_BWD (read per call): "v1" (the default): one pack
// per thread per grid-stride step over a one-wave grid (cuda_vec::ResidentGrid); "unrolled": two
// packs per thread per step (6 16-byte loads in flight before the first store, kept raw) with
// 32-bit pack indices. On H200 at 16384 x 8192 bf16 (2026-11-30, batch timing): v1 3.63 TB/s,
// unrolled 3.48, once both grids were one wave (before, with GridFor's 8 blocks per SM, unrolled's
// 3 resident blocks ran 2.67 waves: 3.40, and v1 3.06).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"
#include "kernels/swiglu/swiglu_internal.h"

namespace sg::kernels::swiglu_internal {
namespace {

using cuda_vec::Pack8;

constexpr int kThreads = 256;

template <typename T, bool kVec>
__device__ __forceinline__ void Load(const T* p, int n, float (&v)[8]) {
  if (kVec && n == 8) {
    Pack8<T>::Load(p, v);
  } else {
    cuda_vec::LoadScalars(p, n, v);
  }
}
template <typename T, bool kVec>
__device__ __forceinline__ void Store(T* p, int n, const float (&v)[8]) {
  if (kVec && n == 8) {
    Pack8<T>::Store(p, v);
  } else {
    cuda_vec::StoreScalars(p, n, v);
  }
}

__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

// Pack i of the problem: its element offsets in the gate/up layout and the out layout, and its width.
struct PackAt {
  int64_t in, out;
  int n;
};
template <bool kRows>
__device__ __forceinline__ PackAt Locate(int64_t i, int64_t packs_per_row, int64_t cols, int64_t in_stride) {
  const int64_t r = kRows ? i / packs_per_row : 0;
  const int64_t c = (i - r * packs_per_row) * 8;
  const int64_t left = cols - c;
  return PackAt{r * in_stride + c, r * cols + c, left < 8 ? int(left) : 8};
}

template <typename T, bool kVec, bool kRows>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* gate, const T* up, T* out, int64_t rows, int64_t cols, int64_t in_stride) {
  const int64_t ppr = (cols + 7) / 8;
  const int64_t total = rows * ppr;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const PackAt at = Locate<kRows>(i, ppr, cols, in_stride);
    float g[8], u[8];
    Load<T, kVec>(gate + at.in, at.n, g);
    Load<T, kVec>(up + at.in, at.n, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = g[k] * Sigmoid(g[k]) * u[k];
    Store<T, kVec>(out + at.out, at.n, g);
  }
}

template <typename T, bool kVec, bool kRows>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(const T* dout, const T* gate, const T* up, T* dgate, T* dup, int64_t rows, int64_t cols,
                   int64_t in_stride) {
  const int64_t ppr = (cols + 7) / 8;
  const int64_t total = rows * ppr;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const PackAt at = Locate<kRows>(i, ppr, cols, in_stride);
    float d[8], g[8], u[8];
    Load<T, kVec>(dout + at.out, at.n, d);
    Load<T, kVec>(gate + at.in, at.n, g);
    Load<T, kVec>(up + at.in, at.n, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float s = Sigmoid(g[k]);
      const float silu = g[k] * s;
      g[k] = d[k] * u[k] * s * (1.f + g[k] * (1.f - s));
      u[k] = d[k] * silu;
    }
    Store<T, kVec>(dgate + at.in, at.n, g);
    Store<T, kVec>(dup + at.in, at.n, u);
  }
}

// Same arithmetic as BackwardKernel for the 16-byte layout with every pack full (cols % 8 == 0; the
// separate-tensor form is one row),
// packs i and i + stride per step with their loads kept raw (bf16: 4 registers a pack) until used,
// and 32-bit pack indices (total < 2^31).
// 3 CTAs of 256 threads per SM (at most 85 registers; at 64 it spilled): 768 threads x 96 bytes of
// loads in flight per SM (the first kernel: 1536 threads x 48 bytes, one pack at a time).
template <typename T>
__global__ void __launch_bounds__(kThreads, 3)
    BackwardUnrolledKernel(const T* dout, const T* gate, const T* up, T* dgate, T* dup, int64_t rows, int64_t cols,
                           int64_t in_stride) {
  const uint32_t ppr = uint32_t(cols / 8);
  const uint32_t total = uint32_t(rows * ppr);
  const uint32_t stride = gridDim.x * kThreads;
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < total; i += 2 * stride) {
    int64_t in[2], out[2];
    cuda_vec::Raw8<T> d[2], g[2], u[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const uint32_t j = i + q * stride;
      if (j < total) {
        const uint32_t r = j / ppr;
        const int64_t c = int64_t(j - r * ppr) * 8;
        in[q] = int64_t(r) * in_stride + c;
        out[q] = int64_t(r) * cols + c;
        d[q] = cuda_vec::LoadRawOnce(dout + out[q]);
        g[q] = cuda_vec::LoadRawOnce(gate + in[q]);
        u[q] = cuda_vec::LoadRawOnce(up + in[q]);
      }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (i + q * stride >= total) continue;
      float dv[8], gv[8], uv[8];
      cuda_vec::Unpack(d[q], dv);
      cuda_vec::Unpack(g[q], gv);
      cuda_vec::Unpack(u[q], uv);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float s = Sigmoid(gv[k]);
        const float silu = gv[k] * s;
        gv[k] = dv[k] * uv[k] * s * (1.f + gv[k] * (1.f - s));
        uv[k] = dv[k] * silu;
      }
      Pack8<T>::Store(dgate + in[q], gv);
      Pack8<T>::Store(dup + in[q], uv);
    }
  }
}

// "flat" (the default for both directions, bf16/f32 in the 16-byte layout; SG_SWIGLU_KERNEL=grid
// turns it off): no loop, one pack per thread and as many 128-thread blocks as the problem has
// (the shape of the kernel torch.compile generates for this op); 32-bit pack indices. With plain
// loads it is the fastest here (3.94 / 3.90 TB/s vs the grid kernels' 3.75 / 3.64).
constexpr int kFlatThreads = 128;
// kFast (SG_SWIGLU_MATH=fast): the sigmoid's division by the approximate __fdividef (2 ulp, as
// Triton's default float division) instead of an IEEE reciprocal, and no integer division for the
// pack's row when the layout is one flat array (separate gate and up tensors).
template <typename T, bool kBackward, int kLoad, bool kFast = false>
__global__ void __launch_bounds__(kFlatThreads)
    FlatKernel(const T* dout, const T* gate, const T* up, T* out0, T* out1, uint32_t total, uint32_t ppr, int64_t cols,
               int64_t in_stride) {
  const uint32_t i = blockIdx.x * kFlatThreads + threadIdx.x;
  if (i >= total) return;
  int64_t in, out;
  if (kFast && in_stride == cols) {
    in = out = int64_t(i) * 8;
  } else {
    const uint32_t r = i / ppr;
    const int64_t c = int64_t(i - r * ppr) * 8;
    in = int64_t(r) * in_stride + c, out = int64_t(r) * cols + c;
  }
  const cuda_vec::Raw8<T> gr = cuda_vec::LoadRawPolicy<kLoad>(gate + in), ur = cuda_vec::LoadRawPolicy<kLoad>(up + in);
  cuda_vec::Raw8<T> dr;
  if constexpr (kBackward) dr = cuda_vec::LoadRawPolicy<kLoad>(dout + out);
  float g[8], u[8];
  cuda_vec::Unpack(gr, g);
  cuda_vec::Unpack(ur, u);
  auto sigmoid = [](float x) { return kFast ? __fdividef(1.f, 1.f + __expf(-x)) : Sigmoid(x); };
  if constexpr (kBackward) {
    float d[8];
    cuda_vec::Unpack(dr, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float s = sigmoid(g[k]);
      const float silu = g[k] * s;
      g[k] = d[k] * u[k] * s * (1.f + g[k] * (1.f - s));
      u[k] = d[k] * silu;
    }
    Pack8<T>::Store(out0 + in, g);
    Pack8<T>::Store(out1 + in, u);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      g[k] = (kFast ? __fdividef(g[k], 1.f + __expf(-g[k])) : g[k] * Sigmoid(g[k])) * u[k];
    }
    Pack8<T>::Store(out0 + out, g);
  }
}

// The flat kernel is the default where the 16-byte layout allows it; SG_SWIGLU_KERNEL=grid keeps
// the grid-stride kernels (forward, and the backward SG_SWIGLU_BWD picks).
bool UseFlat(const Problem& p) {
  const char* v = std::getenv("SG_SWIGLU_KERNEL");
  return (v == nullptr || std::strcmp(v, "grid") != 0) && p.cols % 8 == 0 &&
         p.rows * (p.cols / 8) < (int64_t(1) << 31) - kFlatThreads;
}

// SG_SWIGLU_LOAD picks the flat kernel's load cache policy: "plain" (the default), "cs" (streaming,
// evict-first), "nc" (read-only path). H200, 16384 x 8192 bf16, batch timing, one call
// (2026-11-30): forward / backward 3.77 / 3.72 TB/s with cs, 3.94 / 3.90 plain, 3.94 / 3.89 nc;
// torch.compile 4.22 / 4.06 in the same call.
int FlatLoadPolicy() {
  const char* v = std::getenv("SG_SWIGLU_LOAD");
  if (v != nullptr && std::strcmp(v, "cs") == 0) return cuda_vec::kCacheStreaming;
  if (v != nullptr && std::strcmp(v, "nc") == 0) return cuda_vec::kCacheReadOnly;
  return cuda_vec::kCacheDefault;
}

// SG_SWIGLU_MATH=fast: the flat kernel's kFast form (plain loads).
bool FlatFastMath() {
  const char* v = std::getenv("SG_SWIGLU_MATH");
  return v != nullptr && std::strcmp(v, "fast") == 0;
}

template <typename T, bool kBackward>
absl::Status LaunchFlat(const Problem& p, const T* d, const T* g, const T* u, T* o0, T* o1, cudaStream_t s) {
  const uint32_t ppr = uint32_t(p.cols / 8), total = uint32_t(p.rows * (p.cols / 8));
  const unsigned grid = (total + kFlatThreads - 1) / kFlatThreads;
  const int64_t in_stride = p.rows > 1 ? p.in_stride : p.cols;
  if (FlatFastMath()) {
    FlatKernel<T, kBackward, cuda_vec::kCacheDefault, true>
        <<<grid, kFlatThreads, 0, s>>>(d, g, u, o0, o1, total, ppr, p.cols, in_stride);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(FlatKernel);
    return absl::OkStatus();
  }
  switch (FlatLoadPolicy()) {
    case cuda_vec::kCacheDefault:
      FlatKernel<T, kBackward, cuda_vec::kCacheDefault>
          <<<grid, kFlatThreads, 0, s>>>(d, g, u, o0, o1, total, ppr, p.cols, in_stride);
      break;
    case cuda_vec::kCacheReadOnly:
      FlatKernel<T, kBackward, cuda_vec::kCacheReadOnly>
          <<<grid, kFlatThreads, 0, s>>>(d, g, u, o0, o1, total, ppr, p.cols, in_stride);
      break;
    default:
      FlatKernel<T, kBackward, cuda_vec::kCacheStreaming>
          <<<grid, kFlatThreads, 0, s>>>(d, g, u, o0, o1, total, ppr, p.cols, in_stride);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(FlatKernel);
  return absl::OkStatus();
}

bool UseBackwardUnrolled() {
  const char* v = std::getenv("SG_SWIGLU_BWD");
  return v != nullptr && std::strcmp(v, "unrolled") == 0;
}

// The 16-byte path needs every row of every operand to start on a 16-byte boundary.
bool Vectorizable(const Problem& p, std::initializer_list<const void*> ptrs) {
  if (p.rows > 1 && (p.cols % 8 != 0 || p.in_stride % 8 != 0)) return false;
  for (const void* q : ptrs) {
    if (!cuda_vec::Aligned16(q)) return false;
  }
  return true;
}

template <typename T>
absl::Status Forward(const Problem& p, const void* gate, const void* up, void* out, cudaStream_t s) {
  const T* g = static_cast<const T*>(gate);
  const T* u = static_cast<const T*>(up);
  T* o = static_cast<T*>(out);
  const int64_t blocks = (p.rows * ((p.cols + 7) / 8) + kThreads - 1) / kThreads;
  const bool vec = Vectorizable(p, {gate, up, out});
  if (vec && UseFlat(p)) return LaunchFlat<T, false>(p, nullptr, g, u, o, nullptr, s);
  const bool rows = p.rows > 1;
  auto launch = [&](auto kernel) {
    kernel<<<cuda_vec::ResidentGrid(kernel, kThreads, blocks), kThreads, 0, s>>>(g, u, o, p.rows, p.cols, p.in_stride);
  };
  if (vec && rows) launch(ForwardKernel<T, true, true>);
  if (vec && !rows) launch(ForwardKernel<T, true, false>);
  if (!vec && rows) launch(ForwardKernel<T, false, true>);
  if (!vec && !rows) launch(ForwardKernel<T, false, false>);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ForwardKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status Backward(const Problem& p, const void* dout, const void* gate, const void* up, void* dgate, void* dup,
                      cudaStream_t s) {
  const T* d = static_cast<const T*>(dout);
  const T* g = static_cast<const T*>(gate);
  const T* u = static_cast<const T*>(up);
  T* dg = static_cast<T*>(dgate);
  T* du = static_cast<T*>(dup);
  const int64_t packs = p.rows * ((p.cols + 7) / 8);
  const bool vec = Vectorizable(p, {dout, gate, up, dgate, dup});
  const bool rows = p.rows > 1;
  if (vec && UseFlat(p)) return LaunchFlat<T, true>(p, d, g, u, dg, du, s);
  // bf16 only: f32 packs take twice the registers and spilled.
  if constexpr (sizeof(T) == 2) {
    if (UseBackwardUnrolled() && vec && p.cols % 8 == 0 &&
        packs < (int64_t(1) << 31) - 2 * int64_t(kThreads) * 132 * 8) {
      const unsigned grid =
          cuda_vec::ResidentGrid(BackwardUnrolledKernel<T>, kThreads, (packs + 2 * kThreads - 1) / (2 * kThreads));
      BackwardUnrolledKernel<T><<<grid, kThreads, 0, s>>>(d, g, u, dg, du, p.rows, p.cols, p.in_stride);
      SG_CUDA_RETURN_IF_LAUNCH_ERROR(BackwardUnrolledKernel);
      return absl::OkStatus();
    }
  }
  const int64_t blocks = (packs + kThreads - 1) / kThreads;
#define SG_LAUNCH(V, R)                                                                               \
  BackwardKernel<T, V, R><<<cuda_vec::ResidentGrid(BackwardKernel<T, V, R>, kThreads, blocks), kThreads, 0, s>>>( \
      d, g, u, dg, du, p.rows, p.cols, p.in_stride)
  if (vec && rows) SG_LAUNCH(true, true);
  if (vec && !rows) SG_LAUNCH(true, false);
  if (!vec && rows) SG_LAUNCH(false, true);
  if (!vec && !rows) SG_LAUNCH(false, false);
#undef SG_LAUNCH
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(BackwardKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status ForwardCuda(const Problem& p, const void* gate, const void* up, void* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Forward<__nv_bfloat16>(p, gate, up, out, s);
  if (p.dtype == DType::kF16) return Forward<__half>(p, gate, up, out, s);
  return Forward<float>(p, gate, up, out, s);
}

absl::Status BackwardCuda(const Problem& p, const void* dout, const void* gate, const void* up, void* dgate,
                          void* dup, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) return Backward<__nv_bfloat16>(p, dout, gate, up, dgate, dup, s);
  if (p.dtype == DType::kF16) return Backward<__half>(p, dout, gate, up, dgate, dup, s);
  return Backward<float>(p, dout, gate, up, dgate, dup, s);
}

}  // namespace sg::kernels::swiglu_internal
