// The Llama MLP's up-projection and activation in one Hopper GEMM: h = silu(x W1^T) * (x W3^T),
// computed in the epilogue of WgmmaGemm (wgmma_gemm.h) from one weight W13 that interleaves W1 and
// W3 in blocks of kSwiGluBlock rows, so each 128 x 256 output tile holds 128 gate columns and the
// 128 up columns they pair with. gate and up never reach memory unless asked for (the backward's
// saved activation): at 16384 tokens x 8192 that is 2 x 268 MB written and read back per layer.
//
//   SG_RETURN_IF_ERROR(InterleaveGateUp(w1, w3, w13, stream));            // once per weight update
//   absl::Status s = WgmmaGemmSwiGlu(x, w13, std::nullopt, h, gate_up, stream);
//   if (absl::IsUnimplemented(s)) s = <two GEMMs + SwiGluForward>;        // another GPU or shape
//
// The interleaved layout, F = W1's rows (the MLP width), b = 0 .. F / kSwiGluBlock - 1:
//   W13[256 b + r]       = W1[128 b + r]    r < 128
//   W13[256 b + 128 + r] = W3[128 b + r]
// and so gate_up = x W13^T [M, 2F] interleaves gate and up the same way along its columns. Viewed
// as [M * F / 128, 256] it is exactly the packed [gate | up] layout of kernels/swiglu (with
// h viewed as [M * F / 128, 128]), so SwiGluPackedBackward(dh, gate_up, dgate_up) computes the
// backward on it directly; dgate_up (interleaved) then gives dx = dgate_up W13 and the weight
// gradient dW13 = dgate_up^T x, which DeinterleaveGateUp splits into dW1 and dW3.
#ifndef SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_SWIGLU_H_
#define SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_SWIGLU_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// Rows of W1 (then of W3) per block of the interleaved W13: half the kernel's 256-column tile.
constexpr int64_t kSwiGluBlock = 128;

// w13 [2F, K] = W1 [F, K] and W3 [F, K] interleaved in blocks of kSwiGluBlock rows (the layout
// above). Any dtype; all three contiguous, of one dtype and device; F a multiple of kSwiGluBlock.
// CPU tensors are copied on the host, CUDA tensors by two 2-D copies on `stream`. InvalidArgument
// on other shapes or mixed dtypes / devices. Not in place (w13 must not overlap w1 or w3).
absl::Status InterleaveGateUp(const TensorView& w1, const TensorView& w3, const TensorView& w13, const Stream& stream);

// The inverse: w1 and w3 from the interleaved w13, e.g. dW1 and dW3 from an f32 dW13. The same
// preconditions as InterleaveGateUp.
absl::Status DeinterleaveGateUp(const TensorView& w13, const TensorView& w1, const TensorView& w3,
                                const Stream& stream);

// h[M, F] = silu(gate) * up with gate | up = row_scale[:,None] * (x[M, K] @ w13[2F, K]^T) (no row_scale:
// 1; the interleaved layout above), f32 accumulation; gate and up are rounded to bf16 and h is computed
// from them with kernels/swiglu's arithmetic (g / (1 + e^-g) * u, __expf and __fdividef), so h equals
// WgmmaGemm into gate_up followed by SwiGluPackedForward (viewed as above) bit for bit, and the
// backward, which reads the bf16 gate_up, differentiates the function the forward computed.
// gate_up [M, 2F] (optional): also written, the interleaved bf16 gate | up (what WgmmaGemm writes).
// x, h and gate_up may carry leading dimensions (flattened into M). row_scale: f32 [M], e.g. the
// 1/rms of the RMSNorm before the MLP with its weight folded into w13 (kernels/gemm_rmsnorm).
//
// Errors: InvalidArgument when the operands do not form that product (naming the operand).
// Unimplemented when the product is valid but outside the kernel -- tensors not on a CUDA device, a
// build without CUDA, a GPU other than sm_90, a dtype other than bf16, non-contiguous or not 16-byte
// aligned tensors, M not a multiple of 128, F of 128 or K of 64 -- so callers fall back to two GEMMs
// (or one on w13) and SwiGluForward. Not for h or gate_up overlapping x, w13 or each other.
absl::Status WgmmaGemmSwiGlu(const TensorView& x, const TensorView& w13, const std::optional<TensorView>& row_scale,
                             const TensorView& h, const std::optional<TensorView>& gate_up, const Stream& stream);

// Whether WgmmaGemmSwiGlu runs for x [m, k] and w13 [2f, k] of `dtype` on `device` (contiguous,
// 16-byte aligned tensors): OK, or the Unimplemented status naming why not (the same conditions as
// WgmmaGemmSwiGlu's). For callers that choose a buffer layout before any tensor exists (the
// compiler's lowering). query_gpu: also ask the current CUDA device for sm_90 (false when planning
// for a GPU this process may not have: shapes, dtype and device kind only).
//   if (WgmmaGemmSwiGluSupports(m, k, f, DType::kBF16, Device::Cuda(0)).ok()) { /* fused layout */ }
absl::Status WgmmaGemmSwiGluSupports(int64_t m, int64_t k, int64_t f, DType dtype, const Device& device,
                                     bool query_gpu = true);

// The MLP backward's down-projection data gradient and SwiGLU backward in one kernel:
//   dh = dy[M, K] @ w2t[F, K]^T   (w2t = W2^T, W2 being the down projection's [K, F] weight:
//                                  TransposeMatrix below; the kernel reads K-major operands only)
//   dgate = dh * up * silu'(gate),  dup = dh * silu(gate)
// with dh rounded to bf16 as a GEMM writes it and never stored, and kernels/swiglu's arithmetic, so
// dgate and dup equal WgmmaGemm(dy, w2t) into dh followed by SwiGluBackward(dh, gate, up, dgate,
// dup) bit for bit. gate, up, dgate, dup: bf16 [..., F] with M rows; dgate and dup may be gate and
// up (in place: each output tile is computed from its own input tile only).
//
//   SG_RETURN_IF_ERROR(TransposeMatrix(w2, w2t, stream));     // [K, F] -> [F, K], once per update
//   absl::Status s = WgmmaGemmSwiGluBackward(dy, w2t, gate, up, dgate, dup, stream);
//   if (absl::IsUnimplemented(s)) s = <MatmulBackward's dx into dh + SwiGluBackward>;
//
// Measured on the H200 (1b shape, benchmarks/README.md, 2026-12-02): 1088 us against 1165 for
// cuBLASLt + a separate SwiGluBackward (-6.6%; -4% with the transpose). The compiler fuses the pair
// with it where it runs (CompileOptions::swiglu_backward_gemm, on by default; SG_FUSE_SWIGLU_BWD=0
// turns it off): the 124m step +0.45%, the 1b within noise (2026-12-03).
//
// Errors: InvalidArgument when the operands do not form that product (naming the operand);
// Unimplemented outside the kernel (not CUDA, not sm_90, not bf16, non-contiguous or unaligned
// tensors, M not a multiple of 128, F of 256 or K of 64), for the caller's unfused fallback.
absl::Status WgmmaGemmSwiGluBackward(const TensorView& dy, const TensorView& w2t, const TensorView& gate,
                                     const TensorView& up, const TensorView& dgate, const TensorView& dup,
                                     const Stream& stream);

// Whether WgmmaGemmSwiGluBackward runs for dy [m, k] and w2t [f, k] of `dtype` on `device`
// (contiguous, 16-byte aligned tensors): OK, or the Unimplemented status naming why not; query_gpu
// as WgmmaGemmSwiGluSupports'. For the compiler's lowering, which fuses the pair only where it runs.
absl::Status WgmmaGemmSwiGluBackwardSupports(int64_t m, int64_t k, int64_t f, DType dtype, const Device& device,
                                             bool query_gpu = true);

// dst [C, R] = src [R, C]^T: on CUDA for 2-byte dtypes (bf16, f16; Unimplemented for others), on the
// CPU for any. Both contiguous, one dtype and device (InvalidArgument otherwise); not in place.
absl::Status TransposeMatrix(const TensorView& src, const TensorView& dst, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_WGMMA_GEMM_WGMMA_GEMM_SWIGLU_H_
