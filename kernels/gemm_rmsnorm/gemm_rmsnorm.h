// Fused RMSNorm + GEMM (the GEMM+LayerNorm fusion, for RMSNorm): out = RMSNorm(x; w_norm) @ W^T
// without writing the normalized activations to memory.
//
//   SG_RETURN_IF_ERROR(GemmRmsNormFoldWeight(w, w_norm, w_folded, stream));   // once per step
//   SG_RETURN_IF_ERROR(GemmRmsNormForward(x, w_folded, eps, out, rstd, stream));
//   SG_RETURN_IF_ERROR(GemmRmsNormBackward(dout, x, w, w_norm, w_folded, rstd, dx, dw, dw_norm, stream));
//
// The algebra. With r_i = 1/sqrt(mean_k x_ik^2 + eps) and g = w_norm,
//   out = diag(r) X diag(g) W^T = diag(r) (X W'^T),  W' = W diag(g)  (w_folded: W's columns scaled).
// So the norm weight is folded into W once per optimizer step (W and g only change there), r is one
// float per row from a cheap pass over x, and diag(r) is a per-row scale of the GEMM result, applied
// in the GEMM's epilogue: our Hopper kernel's (kernels/wgmma_gemm, GemmRmsNormGemm::kWgmma) or
// cuBLASLt's per-row alpha vector (kernels/gemm row_scale; a separate pass over the output where
// cuBLASLt lacks that form). See GemmRmsNormGemm. The normalized X diag(g)·r is never stored: forward saves
// the write and re-read of an [M,K] activation, and the backward needs only x and r, not it.
//
// The backward, with Y = diag(r) X diag(g) (never stored), dY = dout W and xhat = diag(r) X:
//   dZ  = dout @ W'                 (= dY diag(g), the RMSNorm backward's weighted input)
//   dx  = r * (dZ - x r^2 mean_k(dZ x))   and xhat = r * x, in one pass over each row
//   G   = dout^T @ xhat             ([N,K], f32)
//   dW  = G diag(g);   dw_norm_k = sum_n W_nk G_nk   (since dg_k = sum_i dY_ik xhat_ik)
// The backward writes xhat ([M,K]) once as GEMM input: the same traffic an unfused backward spends
// reading the stored Y, but without holding Y from forward to backward.
//
// Shapes: x [..., K] (f32 or bf16), w and w_folded [N, K] and w_norm [K] in x's dtype, out [..., N]
// in x's dtype, rstd f32 [M] (M = rows of x), dx like x, dw f32 [N, K], dw_norm f32 [K] (both
// overwritten; deterministic). Tensors on the CPU run the reference; CUDA tensors run cuBLASLt and
// the kernels of gemm_rmsnorm.cu.
#ifndef SGTRAIN_KERNELS_GEMM_RMSNORM_GEMM_RMSNORM_H_
#define SGTRAIN_KERNELS_GEMM_RMSNORM_GEMM_RMSNORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// Which GEMM computes the forward's diag(rstd) x w_folded^T on CUDA (the CPU has one path).
enum class GemmRmsNormGemm : uint8_t {
  // SG_GEMM_RMSNORM=cublas_epilogue|pass|wgmma, read at each call; unset or empty: kWgmma.
  kFromEnv,
  // cuBLASLt with the scale as a per-row alpha vector (needs a row-major D: slower cuBLAS kernels).
  kCublasEpilogue,
  // cuBLASLt's GEMM, then a separate pass scaling the output's rows (for comparison).
  kRowScalePass,
  // kernels/wgmma_gemm, the scale in its epilogue for free, where it applies (an sm_90 GPU, bf16,
  // M % 128 == 0, N % 256 == 0, K % 64 == 0); other problems take kCublasEpilogue. The default:
  // H200 2026-11-30, forward at 16384 x {3072, 8192} x 2048 with its own rstd pass, 621 / 632
  // TFLOP/s of GEMM work against 625 / 587 for RMSNorm then cuBLAS and 553 / 560 for
  // kCublasEpilogue; in the Llama block (rstd from the residual add, y never written) 580 / 620
  // against 565 / 583 unfused.
  kWgmma,
};

struct GemmRmsNormOptions {
  // rstd is an input (e.g. from AddRmsNormForward of the same rows) instead of being computed here.
  bool rstd_given = false;
  GemmRmsNormGemm gemm = GemmRmsNormGemm::kFromEnv;
};

// w_folded = w * w_norm[None, :]. InvalidArgument on mismatched shapes or dtypes.
absl::Status GemmRmsNormFoldWeight(const TensorView& w, const TensorView& w_norm, const TensorView& w_folded,
                                   const Stream& stream);

// out = diag(rstd) x w_folded^T with rstd = 1/sqrt(mean(x^2) + eps) written (or read, with
// options.rstd_given) per row.
absl::Status GemmRmsNormForward(const TensorView& x, const TensorView& w_folded, float eps, const TensorView& out,
                                const TensorView& rstd, const Stream& stream,
                                const GemmRmsNormOptions& options = GemmRmsNormOptions());

// Gradients of out = RMSNorm(x; w_norm) @ w^T given dout: dx, dw (f32), dw_norm (f32).
absl::Status GemmRmsNormBackward(const TensorView& dout, const TensorView& x, const TensorView& w,
                                 const TensorView& w_norm, const TensorView& w_folded, const TensorView& rstd,
                                 const TensorView& dx, const TensorView& dw, const TensorView& dw_norm,
                                 const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_GEMM_RMSNORM_GEMM_RMSNORM_H_
