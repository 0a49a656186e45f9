// A Hopper (sm_90) GEMM with a per-row scale applied to the f32 accumulator before rounding, for
// the fused RMSNorm + GEMM (kernels/gemm_rmsnorm: out = diag(rstd) x W'^T) and for any Linear
// forward y = x w^T whose shapes fit its tiles. cuBLASLt applies a per-row scale only through a
// row-major output with slower kernels; this kernel does it for free in its epilogue.
//
//   // out[M,N] = rstd[:,None] * (x[M,K] @ w_folded[N,K]^T), all bf16 but rstd (f32)
//   absl::Status s = WgmmaGemm(x, w_folded, rstd, out, stream);
//   if (absl::IsUnimplemented(s)) s = <the cuBLASLt path>;   // another GPU or shape
//
// The kernel (wgmma_gemm.cu): TMA loads into a 4-stage shared-memory ring, one producer warp, two
// consumer warpgroups issuing wgmma m64n256k16 on a 128 x 256 tile, persistent over the tiles; its
// epilogue and block arrangement come in the variants of WgmmaGemmVariant. The same kernel with a
// SwiGLU epilogue (the MLP's h = silu(x W1^T) * (x W3^T)) is in wgmma_gemm_swiglu.h.
#ifndef SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_H_
#define SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// How the kernel writes its tile and shares its loads. All compute the same d, bit for bit (the same
// f32 accumulation order and one rounding); they differ only in speed.
enum class WgmmaGemmVariant : uint8_t {
  // SG_WGMMA_GEMM_VARIANT=registers|tma_store|cluster, read at each call; unset or empty:
  // kTmaStore. Any other value is InvalidArgument.
  kFromEnv,
  // bf16x2 stores straight from the accumulator registers (H200 2026-11-30, with the row scale,
  // 16384 x {3072, 8192} x 2048: 551 / 560 TFLOP/s; cuBLAS without a scale 651 / 644).
  kRegisterStores,
  // The tile staged through swizzled shared memory and written by TMA stores that drain while the
  // consumers run the next tile's k-loop (the default: 635 / 631 TFLOP/s with the row scale in the
  // same call, 97.5% / 98% of cuBLAS).
  kTmaStore,
  // kTmaStore in 2-block clusters on M-adjacent tile pairs, the shared B tile loaded once per pair
  // (TMA multicast): half the B traffic from L2. Where M / 128 is odd, kTmaStore. Slower: 443 /
  // 419 TFLOP/s in the same call.
  kClusterMulticast,
};

// d[M,N] = row_scale[:,None] * (a[M,K] @ b[N,K]^T) (no row_scale: 1), f32 accumulation, rounded to
// bf16 once. a, b, d bf16, row_scale f32 [M]; a and d may carry leading dimensions (flattened into M).
//
// Errors: InvalidArgument when the operands do not form that product (shapes, dtypes, devices,
// naming the operand). Unimplemented when the product is valid but outside the kernel -- tensors
// not on a CUDA device, a build without CUDA, a GPU other than sm_90, a dtype other than bf16,
// non-contiguous or not 16-byte aligned tensors, M not a multiple of 128, N of 256 or K of 64 --
// so the caller can fall back to cuBLASLt (kernels/gemm). Not for d overlapping a or b.
absl::Status WgmmaGemm(const TensorView& a, const TensorView& b, const std::optional<TensorView>& row_scale,
                       const TensorView& d, const Stream& stream,
                       WgmmaGemmVariant variant = WgmmaGemmVariant::kFromEnv);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_H_
