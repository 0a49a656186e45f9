// CUDA SwiGLU, two kernel families:
//
// FlatKernel (the default): no loop, one pack of 8 outputs per thread (16-byte accesses for bf16,
// two for f32) and as many 128-thread blocks as the problem has (the shape of the kernel
// torch.compile generates for this op), 32-bit pack indices, plain loads, the sigmoid's division by
// the approximate __fdividef. It needs the 16-byte layout: cols % 8 == 0 (for the packed form;
// separate tensors are one flat row, so numel % 8 == 0), 16-byte aligned operands, and fewer than
// 2^31 packs.
//
// ForwardKernel / BackwardKernel (the fallback for every other layout; SG_SWIGLU_KERNEL=grid,
// read per call, forces them, for comparison and testing): one pack per thread per step of a
// grid-stride loop over a one-wave grid (cuda_vec::ResidentGrid), 64-bit indices, scalar accesses
// for unaligned data and partial packs.
//
// Why (H200, bf16 16384 x 8192, batch timing: CUDA events around back-to-back calls, 2026-11-30):
// the flat kernel 3.92 / 3.88-3.89 TB/s forward / backward; with an IEEE reciprocal in the sigmoid
// (and a row division even for one flat row) 3.80-3.87 / 3.88-3.89; the grid-stride kernels
// 3.75 / 3.63. Load cache policies of the flat kernel, one call: plain 3.94 / 3.90, .nc 3.94 / 3.89,
// .cs (evict-first) 3.77 / 3.72. Measured and deleted: the IEEE-division and .cs / .nc variants of
// the flat kernel, and a grid-stride backward with two packs per thread per step (3.48 against the
// one-pack kernel's 3.63 on one-wave grids).
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

constexpr int kFlatThreads = 128;
// The flat kernel: pack i = blockIdx.x * kFlatThreads + threadIdx.x < total; no integer division
// for the pack's row when the layout is one flat array (separate gate and up tensors).
// Fast math: 1 / (1 + e^-g) by __fdividef (2 ulp, as Triton's default float division) instead of
// an IEEE reciprocal: forward 3.92 TB/s at 16384 x 8192 against 3.80-3.87 (16384 x 5632: 3.88
// against 3.79), backward the same either way (3.88-3.89; 3.85 at 5632).
template <typename T, bool kBackward>
__global__ void __launch_bounds__(kFlatThreads)
    FlatKernel(const T* dout, const T* gate, const T* up, T* out0, T* out1, uint32_t total, uint32_t ppr, int64_t cols,
               int64_t in_stride) {
  const uint32_t i = blockIdx.x * kFlatThreads + threadIdx.x;
  if (i >= total) return;
  int64_t in, out;
  if (in_stride == cols) {
    in = out = int64_t(i) * 8;
  } else {
    const uint32_t r = i / ppr;
    const int64_t c = int64_t(i - r * ppr) * 8;
    in = int64_t(r) * in_stride + c, out = int64_t(r) * cols + c;
  }
  const cuda_vec::Raw8<T> gr = cuda_vec::LoadRawOnce(gate + in), ur = cuda_vec::LoadRawOnce(up + in);
  cuda_vec::Raw8<T> dr;
  if constexpr (kBackward) dr = cuda_vec::LoadRawOnce(dout + out);
  float g[8], u[8];
  cuda_vec::Unpack(gr, g);
  cuda_vec::Unpack(ur, u);
  if constexpr (kBackward) {
    float d[8];
    cuda_vec::Unpack(dr, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float s = __fdividef(1.f, 1.f + __expf(-g[k]));
      const float silu = g[k] * s;
      g[k] = d[k] * u[k] * s * (1.f + g[k] * (1.f - s));
      u[k] = d[k] * silu;
    }
    Pack8<T>::Store(out0 + in, g);
    Pack8<T>::Store(out1 + in, u);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = __fdividef(g[k], 1.f + __expf(-g[k])) * u[k];
    Pack8<T>::Store(out0 + out, g);
  }
}

// The flat kernel where the 16-byte layout allows it (the caller checks alignment), unless
// SG_SWIGLU_KERNEL=grid.
bool UseFlat(const Problem& p) {
  const char* v = std::getenv("SG_SWIGLU_KERNEL");
  return (v == nullptr || std::strcmp(v, "grid") != 0) && p.cols % 8 == 0 &&
         p.rows * (p.cols / 8) < (int64_t(1) << 31) - kFlatThreads;
}

template <typename T, bool kBackward>
absl::Status LaunchFlat(const Problem& p, const T* d, const T* g, const T* u, T* o0, T* o1, cudaStream_t s) {
  const uint32_t ppr = uint32_t(p.cols / 8), total = uint32_t(p.rows * (p.cols / 8));
  const unsigned grid = (total + kFlatThreads - 1) / kFlatThreads;
  const int64_t in_stride = p.rows > 1 ? p.in_stride : p.cols;
  FlatKernel<T, kBackward><<<grid, kFlatThreads, 0, s>>>(d, g, u, o0, o1, total, ppr, p.cols, in_stride);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(FlatKernel);
  return absl::OkStatus();
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
