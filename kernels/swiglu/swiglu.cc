#include "kernels/swiglu/swiglu.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/swiglu/swiglu_internal.h"

namespace sg::kernels {
namespace {

using swiglu_internal::Problem;

absl::Status CheckInput(const char* op, const TensorView& t) {
  SG_CHECK_ARG(t.rank() >= 1 && t.numel() > 0, op, ": input must be non-empty, found ", t.ToString());
  SG_CHECK_ARG(IsFloating(t.dtype()), op, ": input must be f32, bf16 or f16, found ",
               t.ToString());
  SG_CHECK_ARG(t.is_contiguous(), op, ": input must be contiguous, found ", t.ToString());
  return absl::OkStatus();
}

// Separate gate/up: one flat row of numel elements (no per-row indexing on the device).
Problem Separate(const TensorView& gate) { return Problem{1, gate.numel(), gate.numel(), gate.dtype()}; }

absl::StatusOr<Problem> Packed(const char* op, const TensorView& gate_up) {
  SG_RETURN_IF_ERROR(CheckInput(op, gate_up));
  SG_CHECK_ARG(gate_up.dim(-1) % 2 == 0, op, ": gate_up's last dimension must be even (gate | up), found ",
               gate_up.ToString());
  const int64_t f = gate_up.dim(-1) / 2;
  return Problem{gate_up.numel() / (2 * f), f, 2 * f, gate_up.dtype()};
}

Shape HalfShape(const TensorView& gate_up) {
  Shape s = gate_up.shape();
  s.back() /= 2;
  return s;
}

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

absl::Status RunForward(const char* op, const Problem& p, const TensorView& t, const void* gate, const void* up,
                        void* out, const Stream& stream) {
  if (t.device().is_cpu()) {
    swiglu_internal::ForwardCpu(p, gate, up, out);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return swiglu_internal::ForwardCuda(p, gate, up, out, stream.native());
#else
  return NoCuda(op);
#endif
}

absl::Status RunBackward(const char* op, const Problem& p, const TensorView& t, const void* dout, const void* gate,
                         const void* up, void* dgate, void* dup, const Stream& stream) {
  if (t.device().is_cpu()) {
    swiglu_internal::BackwardCpu(p, dout, gate, up, dgate, dup);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return swiglu_internal::BackwardCuda(p, dout, gate, up, dgate, dup, stream.native());
#else
  return NoCuda(op);
#endif
}

char* Offset(void* base, int64_t elems, DType t) { return static_cast<char*>(base) + elems * SizeOf(t); }

}  // namespace

absl::Status SwiGluForward(const TensorView& gate, const TensorView& up, const TensorView& out,
                           const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckInput("SwiGluForward", gate));
  SG_RETURN_IF_ERROR(ExpectTensor(up, "SwiGluForward up", gate.dtype(), gate.shape(), gate.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(out, "SwiGluForward out", gate.dtype(), gate.shape(), gate.device()));
  return RunForward("SwiGluForward", Separate(gate), gate, gate.raw(), up.raw(), out.raw(), stream);
}

absl::Status SwiGluBackward(const TensorView& dout, const TensorView& gate, const TensorView& up,
                            const TensorView& dgate, const TensorView& dup, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckInput("SwiGluBackward", gate));
  for (const auto& [t, name] : {std::pair<const TensorView*, const char*>{&dout, "SwiGluBackward dout"},
                                {&up, "SwiGluBackward up"},
                                {&dgate, "SwiGluBackward dgate"},
                                {&dup, "SwiGluBackward dup"}}) {
    SG_RETURN_IF_ERROR(ExpectTensor(*t, name, gate.dtype(), gate.shape(), gate.device()));
  }
  return RunBackward("SwiGluBackward", Separate(gate), gate, dout.raw(), gate.raw(), up.raw(), dgate.raw(),
                     dup.raw(), stream);
}

absl::Status SwiGluPackedForward(const TensorView& gate_up, const TensorView& out, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, Packed("SwiGluPackedForward", gate_up));
  SG_RETURN_IF_ERROR(ExpectTensor(out, "SwiGluPackedForward out", p.dtype, HalfShape(gate_up), gate_up.device()));
  return RunForward("SwiGluPackedForward", p, gate_up, gate_up.raw(), Offset(gate_up.raw(), p.cols, p.dtype),
                    out.raw(), stream);
}

absl::Status SwiGluPackedBackward(const TensorView& dout, const TensorView& gate_up,
                                  const TensorView& dgate_up, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, Packed("SwiGluPackedBackward", gate_up));
  SG_RETURN_IF_ERROR(ExpectTensor(dout, "SwiGluPackedBackward dout", p.dtype, HalfShape(gate_up), gate_up.device()));
  SG_RETURN_IF_ERROR(
      ExpectTensor(dgate_up, "SwiGluPackedBackward dgate_up", p.dtype, gate_up.shape(), gate_up.device()));
  return RunBackward("SwiGluPackedBackward", p, gate_up, dout.raw(), gate_up.raw(),
                     Offset(gate_up.raw(), p.cols, p.dtype), dgate_up.raw(), Offset(dgate_up.raw(), p.cols, p.dtype),
                     stream);
}

}  // namespace sg::kernels
