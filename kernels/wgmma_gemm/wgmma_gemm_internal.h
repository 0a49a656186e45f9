// Internal to kernels/wgmma_gemm: the tile sizes the CUDA kernel needs and its launcher. Arguments
// are checked by wgmma_gemm.cc.
#ifndef SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_INTERNAL_H_
#define SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sg::kernels::wgmma_gemm_internal {

// The output tile of one thread block (two consumer warpgroups of 64 rows x kTileN columns) and the
// K depth of one pipeline stage (one 128-byte swizzle row of bf16).
constexpr int64_t kTileM = 128;
constexpr int64_t kTileN = 256;
constexpr int64_t kTileK = 64;

// The kernel's epilogue and block arrangement (see wgmma_gemm.cu and WgmmaGemmVariant).
enum class KernelVariant : int { kRegisterStores, kTmaStore, kClusterMulticast };

// What the TMA-store epilogue writes from the scaled f32 tile t (wgmma_gemm_swiglu.h):
//   kScale:        d = bf16(t), the plain GEMM;
//   kSwiGlu:       h = silu(g) * u only, where the tile's columns [0, 128) are gate g = bf16(t) and
//                  [128, 256) the matching up u = bf16(t) (the interleaved W13);
//   kSwiGluGateUp: h and the interleaved d = bf16(t) (the backward's saved gate | up blocks);
//   kSwiGluBackward: t is dh (the gradient of h = silu(gate) * up, rounded to bf16 as a GEMM would
//                  write it); the tile's gate and up are read from memory and the epilogue writes
//                  dgate and dup (kernels/swiglu's backward arithmetic) instead of dh.
enum class Epilogue : int { kScale, kSwiGlu, kSwiGluGateUp, kSwiGluBackward };

// d[i, j] = row_scale[i] * sum_k a[i, k] b[j, k] (row_scale null: 1), rounded once to bf16.
// a: bf16 [m, k], b: bf16 [n, k], d: bf16 [m, n], all contiguous and 16-byte aligned; m, n, k
// multiples of kTileM, kTileN, kTileK below 2^31. Unimplemented on GPUs other than sm_90.
absl::Status WgmmaGemmCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b, const float* row_scale,
                           void* d, void* stream, KernelVariant variant);

// The SwiGLU epilogues on the kTmaStore kernel: d ([m, n], may be null for kSwiGlu) as WgmmaGemmCuda
// writes it, and h [m, n / 2] bf16, h[i, 128 b + c] = silu(d[i, 256 b + c]) * d[i, 256 b + 128 + c]
// (with the f32 arithmetic of kernels/swiglu's forward). Same preconditions as WgmmaGemmCuda; h
// contiguous and 16-byte aligned.
absl::Status WgmmaGemmSwiGluCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                                 const float* row_scale, void* d, void* h, void* stream);

// The SwiGLU backward epilogue on the kTmaStore kernel: with dh = bf16(a b^T) ([m, n], never
// written), dgate = dh * up * silu'(gate) and dup = dh * silu(gate), elementwise over [m, n] bf16
// gate and up, as kernels/swiglu's SwiGluBackward computes them from that dh. dgate and dup may be
// gate and up (each tile reads its own region before it writes it). Same preconditions as
// WgmmaGemmCuda; gate, up, dgate and dup contiguous and 16-byte aligned.
absl::Status WgmmaGemmSwiGluBackwardCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                                         const void* gate, const void* up, void* dgate, void* dup, void* stream);

// dst[c, r] = src[r, c] for a contiguous [rows, cols] matrix of 2-byte elements, ordered on `stream`.
absl::Status Transpose2ByteCuda(int64_t rows, int64_t cols, const void* src, void* dst, void* stream);

// The current device's SM count, or Unimplemented naming `op` on a GPU other than sm_90.
absl::StatusOr<int> Sm90MultiProcessors(const char* op);

// cudaMemcpy2DAsync (any direction): `rows` runs of `width` bytes, `src_pitch` / `dst_pitch` bytes
// apart, ordered on `stream`. For the W13 interleave.
absl::Status CopyRuns2dCuda(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                            int64_t rows, void* stream);

}  // namespace sg::kernels::wgmma_gemm_internal

#endif  // SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_INTERNAL_H_
