// Argument checks and device dispatch for attention.h: CPU -> attention_cpu.cc, CUDA ->
// attention.cu (when built with CUDA).
#include "kernels/attention/attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/core/status.h"

namespace sg::kernels {
namespace {

using internal::AttentionParams;
static_assert(internal::kGenericMaxDim == kAttentionMaxHeadDim, "one widest head for the API and the kernels");

bool IsAttentionDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Calls f(T{}) with T the element type of t (f32, bf16 or f16: IsAttentionDType, checked before).
template <typename F>
void WithElementType(DType t, F&& f) {
  if (t == DType::kF32) {
    f(float{});
  } else if (t == DType::kBF16) {
    f(BFloat16{});
  } else {
    f(Half{});
  }
}

absl::Status ExpectRank4(const TensorView& t, absl::string_view what) {
  SG_CHECK_ARG(t.rank() == 4, "attention ", what,
               ": expected rank 4 [batch, seq, heads, head_dim], found ", t.ToString());
  SG_CHECK_ARG(t.is_contiguous(), "attention ", what, ": expected a contiguous tensor, found ",
               t.ToString());
  return absl::OkStatus();
}

// Checks q, k, v against each other and resolves the problem description.
absl::StatusOr<AttentionParams> CheckInputs(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const AttentionOptions& opt) {
  SG_RETURN_IF_ERROR(ExpectRank4(q, "q"));
  SG_RETURN_IF_ERROR(ExpectRank4(k, "k"));
  SG_CHECK_ARG(IsAttentionDType(q.dtype()), "attention q: expected f32, bf16 or f16, found ",
               q.ToString());
  AttentionParams p;
  p.dtype = q.dtype();
  p.batch = q.dim(0);
  p.seq_q = q.dim(1);
  p.heads = q.dim(2);
  p.head_dim = q.dim(3);
  p.seq_k = k.dim(1);
  p.kv_heads = k.dim(2);
  SG_CHECK_ARG(k.dim(0) == p.batch && k.dim(3) == p.head_dim,
               "attention k: expected [", p.batch, ", seq_k, kv_heads, ", p.head_dim,
               "] to match q ", q.ToString(), ", found ", k.ToString());
  SG_CHECK_ARG(p.kv_heads > 0 && p.heads % p.kv_heads == 0, "attention: kv_heads (", p.kv_heads,
               ", from k ", k.ToString(), ") must divide heads (", p.heads, ", from q ",
               q.ToString(), ")");
  SG_RETURN_IF_ERROR(ExpectTensor(k, "attention k", q.dtype(), k.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(v, "attention v", q.dtype(), k.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectRank4(v, "v"));
  p.causal = opt.causal;
  p.scale = opt.scale.value_or(p.head_dim > 0 ? 1.0 / std::sqrt(double(p.head_dim)) : 1.0);
  SG_CHECK_ARG(std::isfinite(p.scale), "attention: scale must be finite, found ", p.scale);
  p.q_offset = opt.q_offset;
  p.k_offset = opt.k_offset;
  return p;
}

absl::Status ExpectStat(const TensorView& t, absl::string_view what, const AttentionParams& p,
                        Device device) {
  return ExpectTensor(t, what, DType::kF32, {p.batch, p.heads, p.seq_q}, device);
}

#ifdef SG_WITH_CUDA
// Whether a CUDA call runs the generic kernels (attention_generic.cu) rather than a flash family:
// the flash kernels cover bf16 and f16 (the latter on the families v4 and v5 only: attention.cu says
// so at the call) with head_dim 64 or 128; the generic ones every dtype up to
// kAttentionMaxHeadDim, and every case when SG_ATTENTION_KERNEL=generic.
absl::StatusOr<bool> UseGenericCuda(const TensorView& q, const AttentionParams& p) {
  if (p.head_dim > kAttentionMaxHeadDim) {
    return absl::UnimplementedError(absl::StrCat("CUDA attention supports head_dim up to ", kAttentionMaxHeadDim,
                                                 ", found ", q.ToString()));
  }
  SG_ASSIGN_OR_RETURN(internal::AttentionKernel family, internal::AttentionKernelFromEnv());
  const bool flash = (q.dtype() == DType::kBF16 || q.dtype() == DType::kF16) && (p.head_dim == 64 || p.head_dim == 128);
  return family == internal::AttentionKernel::kGeneric || !flash;
}
#else
absl::Status NoCuda(const TensorView& t) {
  return absl::FailedPreconditionError(absl::StrCat("attention on ", t.ToString(), ": built without CUDA"));
}
#endif

}  // namespace

absl::Status AttentionForward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options, const TensorView& out,
                              const TensorView& lse, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(AttentionParams p, CheckInputs(q, k, v, options));
  SG_RETURN_IF_ERROR(ExpectTensor(out, "attention out", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectStat(lse, "attention lse", p, q.device()));
  if (q.device().is_cpu()) {
    WithElementType(q.dtype(), [&](auto tag) {
      using T = decltype(tag);
      internal::AttentionForwardCpu(p, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                                    lse.data<float>());
    });
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_ASSIGN_OR_RETURN(const bool generic, UseGenericCuda(q, p));
  if (generic) {
    return internal::AttentionForwardGenericCuda(p, q.raw(), k.raw(), v.raw(), out.raw(), lse.data<float>(),
                                                 stream.native());
  }
  return internal::AttentionForwardCuda(p, q.raw(), k.raw(), v.raw(), out.raw(), lse.data<float>(),
                                        stream.native());
#else
  return NoCuda(q);
#endif
}

absl::Status AttentionBackwardDelta(const TensorView& out, const TensorView& dout,
                                    const TensorView& delta, const Stream& stream) {
  SG_RETURN_IF_ERROR(ExpectRank4(out, "out"));
  SG_CHECK_ARG(IsAttentionDType(out.dtype()), "attention out: expected f32, bf16 or f16, found ",
               out.ToString());
  SG_RETURN_IF_ERROR(ExpectTensor(dout, "attention dout", out.dtype(), out.shape(), out.device()));
  AttentionParams p;
  p.dtype = out.dtype();
  p.batch = out.dim(0);
  p.seq_q = out.dim(1);
  p.heads = out.dim(2);
  p.head_dim = out.dim(3);
  SG_RETURN_IF_ERROR(ExpectStat(delta, "attention delta", p, out.device()));
  if (out.device().is_cpu()) {
    WithElementType(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      internal::AttentionBackwardDeltaCpu(p, out.data<T>(), dout.data<T>(), delta.data<float>());
    });
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_ASSIGN_OR_RETURN(const bool generic, UseGenericCuda(out, p));
  if (generic) {
    return internal::AttentionBackwardDeltaGenericCuda(p, out.raw(), dout.raw(), delta.data<float>(),
                                                       stream.native());
  }
  return internal::AttentionBackwardDeltaCuda(p, out.raw(), dout.raw(), delta.data<float>(),
                                              stream.native());
#else
  return NoCuda(out);
#endif
}

absl::Status AttentionBlockBackward(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& dout, const TensorView& lse,
                                    const TensorView& delta, const AttentionOptions& options,
                                    const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(AttentionParams p, CheckInputs(q, k, v, options));
  SG_RETURN_IF_ERROR(ExpectTensor(dout, "attention dout", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectStat(lse, "attention lse", p, q.device()));
  SG_RETURN_IF_ERROR(ExpectStat(delta, "attention delta", p, q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dq, "attention dq", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dk, "attention dk", q.dtype(), k.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(dv, "attention dv", q.dtype(), k.shape(), q.device()));
  if (q.device().is_cpu()) {
    WithElementType(q.dtype(), [&](auto tag) {
      using T = decltype(tag);
      internal::AttentionBlockBackwardCpu(p, q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(),
                                          lse.data<float>(), delta.data<float>(), dq.data<T>(),
                                          dk.data<T>(), dv.data<T>());
    });
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_ASSIGN_OR_RETURN(const bool generic, UseGenericCuda(q, p));
  if (generic) {
    return internal::AttentionBlockBackwardGenericCuda(p, q.raw(), k.raw(), v.raw(), dout.raw(), lse.data<float>(),
                                                       delta.data<float>(), dq.raw(), dk.raw(), dv.raw(),
                                                       stream.native());
  }
  SG_ASSIGN_OR_RETURN(Tensor dq_accum,
                      Tensor::Empty({internal::DqWorkspaceElems(p)}, DType::kF32, q.device()));
  // The allocator reuses dq_accum's block only for work ordered after this launch on the stream.
  return internal::AttentionBlockBackwardCuda(p, q.raw(), k.raw(), v.raw(), dout.raw(),
                                              lse.data<float>(), delta.data<float>(),
                                              dq_accum.data<float>(), dq.raw(), dk.raw(),
                                              dv.raw(), stream.native());
#else
  return NoCuda(q);
#endif
}

absl::Status AttentionBackward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout,
                               const TensorView& lse, const AttentionOptions& options,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const Stream& stream) {
  SG_RETURN_IF_ERROR(ExpectTensor(out, "attention out", q.dtype(), q.shape(), q.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(lse, "attention lse", DType::kF32, lse.shape(), q.device()));
  SG_ASSIGN_OR_RETURN(Tensor delta, Tensor::Empty(lse.shape(), DType::kF32, q.device()));
  SG_RETURN_IF_ERROR(AttentionBackwardDelta(out, dout, delta, stream));
  return AttentionBlockBackward(q, k, v, dout, lse, delta, options, dq, dk, dv, stream);
}

absl::Status AttentionMerge(const TensorView& out_a, const TensorView& lse_a,
                            const TensorView& out_b, const TensorView& lse_b,
                            const TensorView& out, const TensorView& lse, const Stream& stream) {
  SG_RETURN_IF_ERROR(ExpectRank4(out_a, "merge out_a"));
  SG_CHECK_ARG(IsAttentionDType(out_a.dtype()),
               "attention merge out_a: expected f32, bf16 or f16, found ", out_a.ToString());
  const Device dev = out_a.device();
  SG_RETURN_IF_ERROR(ExpectTensor(out_b, "attention merge out_b", out_a.dtype(), out_a.shape(), dev));
  SG_RETURN_IF_ERROR(ExpectTensor(out, "attention merge out", out_a.dtype(), out_a.shape(), dev));
  const int64_t batch = out_a.dim(0), seq = out_a.dim(1), heads = out_a.dim(2), dim = out_a.dim(3);
  const Shape stat = {batch, heads, seq};
  SG_RETURN_IF_ERROR(ExpectTensor(lse_a, "attention merge lse_a", DType::kF32, stat, dev));
  SG_RETURN_IF_ERROR(ExpectTensor(lse_b, "attention merge lse_b", DType::kF32, stat, dev));
  SG_RETURN_IF_ERROR(ExpectTensor(lse, "attention merge lse", DType::kF32, stat, dev));
  if (dev.is_cpu()) {
    WithElementType(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      internal::AttentionMergeCpu(batch, seq, heads, dim, out_a.data<T>(), lse_a.data<float>(),
                                  out_b.data<T>(), lse_b.data<float>(), out.data<T>(),
                                  lse.data<float>());
    });
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return internal::AttentionMergeCuda(out.dtype(), batch, seq, heads, dim, out_a.raw(),
                                      lse_a.data<float>(), out_b.raw(), lse_b.data<float>(),
                                      out.raw(), lse.data<float>(), stream.native());
#else
  return absl::FailedPreconditionError(
      absl::StrCat("attention merge on ", out.ToString(), ": built without CUDA"));
#endif
}

}  // namespace sg::kernels
