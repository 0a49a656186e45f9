// The launches of the fused MLP up-projection (internal to the compiler; LowerOptions::mlp_fusion,
// compiler/lowering_fusion.h's MlpGroup): each takes the TensorViews the lowering fixed and
// returns the step's body. gate_up and dgate_up are [M, 2F] in kernels/wgmma_gemm's interleaved
// layout (blocks of kSwiGluBlock gate columns, then the matching up columns), so kernels/swiglu's
// packed forms read them as [M * F / 128, 256] next to h / dh as [M * F / 128, 128].
//
//   auto fwd = MlpForwardLaunch(x, w13, h, gate_up, /*composed=*/false);   // one WgmmaGemmSwiGlu
//   SG_RETURN_IF_ERROR(fwd(stream));
#ifndef SGTRAIN_COMPILER_LOWERING_MLP_H_
#define SGTRAIN_COMPILER_LOWERING_MLP_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

using MlpLaunch = std::function<absl::Status(const Stream&)>;

// w13 = w1 and w3 interleaved (the current weight copies; once per step).
MlpLaunch MlpInterleaveLaunch(const TensorView& w1, const TensorView& w3, const TensorView& w13);

// h = silu(x w1^T) * (x w3^T) from w13, and gate_up when given: WgmmaGemmSwiGlu, or (composed) a
// GEMM into gate_up (which must then be given) and SwiGluPackedForward.
MlpLaunch MlpForwardLaunch(const TensorView& x, const TensorView& w13, const TensorView& h,
                        const std::optional<TensorView>& gate_up, bool composed);

// h from the kept gate_up (a recomputed swiglu): SwiGluPackedForward.
MlpLaunch MlpPackedSwiGluLaunch(const TensorView& gate_up, const TensorView& h);

// dgate_up from dh and gate_up (SwiGluPackedBackward; dgate_up may be gate_up).
MlpLaunch MlpSwiGluBackwardLaunch(const TensorView& dh, const TensorView& gate_up, const TensorView& dgate_up);

// dx [..., K] = dgate_up w13 (one GEMM over K = 2F).
MlpLaunch MlpDxLaunch(const TensorView& dgate_up, const TensorView& w13, const TensorView& dx);

// dw13 = dgate_up^T x (scratch [2F, K] in dw1's dtype), split into dw1 and dw3 [F, K].
MlpLaunch MlpDwLaunch(const TensorView& dgate_up, const TensorView& x, const TensorView& dw13, const TensorView& dw1,
                   const TensorView& dw3);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_LOWERING_MLP_H_
