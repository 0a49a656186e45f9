// Internal to kernels/wgmma_gemm: the tile sizes the CUDA kernel needs and its launcher. Arguments
// are checked by wgmma_gemm.cc.
#ifndef SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_INTERNAL_H_
#define SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace sg::kernels::wgmma_gemm_internal {

// The output tile of one thread block (two consumer warpgroups of 64 rows x kTileN columns) and the
// K depth of one pipeline stage (one 128-byte swizzle row of bf16).
constexpr int64_t kTileM = 128;
constexpr int64_t kTileN = 256;
constexpr int64_t kTileK = 64;

// The kernel's epilogue and block arrangement (see wgmma_gemm.cu and WgmmaGemmVariant).
enum class KernelVariant : int { kRegisterStores, kTmaStore, kClusterMulticast };

// d[i, j] = row_scale[i] * sum_k a[i, k] b[j, k] (row_scale null: 1), rounded once to bf16.
// a: bf16 [m, k], b: bf16 [n, k], d: bf16 [m, n], all contiguous and 16-byte aligned; m, n, k
// multiples of kTileM, kTileN, kTileK below 2^31. Unimplemented on GPUs other than sm_90.
absl::Status WgmmaGemmCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b, const float* row_scale,
                           void* d, void* stream, KernelVariant variant);

}  // namespace sg::kernels::wgmma_gemm_internal

#endif  // SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_INTERNAL_H_
