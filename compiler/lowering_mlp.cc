#include "compiler/lowering_mlp.h"

#include "kernels/core/status.h"
#include "kernels/gemm/gemm.h"
#include "kernels/swiglu/swiglu.h"
#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

namespace sg::compiler {
namespace {

using kernels::kSwiGluBlock;

// A contiguous tensor as [numel / cols, cols].
TensorView Rows(const TensorView& t, int64_t cols) {
  return TensorView(t.raw(), t.dtype(), {t.numel() / cols, cols}, t.device());
}

}  // namespace

MlpLaunch MlpInterleaveLaunch(const TensorView& w1, const TensorView& w3, const TensorView& w13) {
  return [=](const Stream& s) { return kernels::InterleaveGateUp(w1, w3, w13, s); };
}

MlpLaunch MlpForwardLaunch(const TensorView& x, const TensorView& w13, const TensorView& h,
                        const std::optional<TensorView>& gate_up, bool composed) {
  if (!composed) {
    return [=](const Stream& s) { return kernels::WgmmaGemmSwiGlu(x, w13, std::nullopt, h, gate_up, s); };
  }
  kernels::GemmArgs g;
  g.a = Rows(x, x.dim(-1));
  g.b = w13;
  g.trans_b = true;
  g.d = gate_up.has_value() ? Rows(*gate_up, w13.dim(0)) : TensorView();
  const TensorView packed = gate_up.has_value() ? Rows(*gate_up, 2 * kSwiGluBlock) : TensorView();
  const TensorView out = Rows(h, kSwiGluBlock);
  return [=](const Stream& s) -> absl::Status {
    SG_CHECK_ARG(g.d.raw() != nullptr, "MlpForwardLaunch: the composed forward needs gate_up");
    SG_RETURN_IF_ERROR(kernels::Gemm(g, s));
    return kernels::SwiGluPackedForward(packed, out, s);
  };
}

MlpLaunch MlpPackedSwiGluLaunch(const TensorView& gate_up, const TensorView& h) {
  const TensorView packed = Rows(gate_up, 2 * kSwiGluBlock), out = Rows(h, kSwiGluBlock);
  return [=](const Stream& s) { return kernels::SwiGluPackedForward(packed, out, s); };
}

MlpLaunch MlpSwiGluBackwardLaunch(const TensorView& dh, const TensorView& gate_up, const TensorView& dgate_up) {
  const TensorView d = Rows(dh, kSwiGluBlock), in = Rows(gate_up, 2 * kSwiGluBlock),
                   out = Rows(dgate_up, 2 * kSwiGluBlock);
  return [=](const Stream& s) { return kernels::SwiGluPackedBackward(d, in, out, s); };
}

MlpLaunch MlpDxLaunch(const TensorView& dgate_up, const TensorView& w13, const TensorView& dx) {
  kernels::GemmArgs g;
  g.a = Rows(dgate_up, w13.dim(0));
  g.b = w13;
  g.d = Rows(dx, w13.dim(1));
  return [=](const Stream& s) { return kernels::Gemm(g, s); };
}

MlpLaunch MlpDwLaunch(const TensorView& dgate_up, const TensorView& x, const TensorView& dw13, const TensorView& dw1,
                   const TensorView& dw3) {
  kernels::GemmArgs g;
  g.a = Rows(dgate_up, dw13.dim(0));
  g.b = Rows(x, x.dim(-1));
  g.trans_a = true;
  g.d = dw13;
  return [=](const Stream& s) -> absl::Status {
    SG_RETURN_IF_ERROR(kernels::Gemm(g, s));
    return kernels::DeinterleaveGateUp(dw13, dw1, dw3, s);
  };
}

}  // namespace sg::compiler
