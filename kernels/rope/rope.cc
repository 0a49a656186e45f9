#include "kernels/rope/rope.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/rope/rope_internal.h"

namespace sg::kernels {
namespace {

using rope_internal::Problem;

bool Present(const TensorView& t) { return t.raw() != nullptr; }

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

template <typename I>
absl::Status CheckPositionsOnHost(const char* op, const I* pos, int64_t n, int64_t table_rows) {
  for (int64_t i = 0; i < n; ++i) {
    SG_CHECK_ARG(pos[i] >= 0 && (table_rows == 0 || pos[i] < table_rows), op, ": positions[", i, "] = ", pos[i],
                 " is outside [0, ", table_rows == 0 ? std::string("inf") : absl::StrCat(table_rows), ")");
  }
  return absl::OkStatus();
}

// Checks (in, out) for q and k and the options; returns the problem shape.
absl::StatusOr<Problem> Check(const char* op, const TensorView& q, const TensorView& k, const TensorView& q_out,
                              const TensorView& k_out, const RopeOptions& o) {
  SG_CHECK_ARG(q.rank() == 4 && q.numel() > 0, op, ": q must be non-empty [batch, seq, heads, head_dim], found ",
               q.ToString());
  SG_CHECK_ARG(IsFloating(q.dtype()), op, ": q must be f32, bf16 or f16, found ",
               q.ToString());
  SG_CHECK_ARG(q.is_contiguous(), op, ": q must be contiguous, found ", q.ToString());
  Problem p;
  p.batch = q.dim(0);
  p.seq = q.dim(1);
  p.q_heads = q.dim(2);
  p.head_dim = q.dim(3);
  p.dtype = q.dtype();
  SG_CHECK_ARG(p.head_dim % 2 == 0, op, ": head_dim must be even, found ", q.ToString());
  SG_RETURN_IF_ERROR(ExpectTensor(q_out, absl::StrCat(op, " q_out"), q.dtype(), q.shape(), q.device()));
  SG_CHECK_ARG(Present(k) == Present(k_out), op, ": k and k_out must both be given or both be absent");
  if (Present(k)) {
    SG_CHECK_ARG(k.rank() == 4 && k.dim(0) == p.batch && k.dim(1) == p.seq && k.dim(3) == p.head_dim &&
                     k.dtype() == q.dtype() && k.device() == q.device() && k.is_contiguous(),
                 op, ": k must be contiguous ", DTypeName(q.dtype()), "[", p.batch, ",", p.seq, ",heads,", p.head_dim,
                 "]@", q.device().ToString(), ", found ", k.ToString());
    p.k_heads = k.dim(2);
    SG_RETURN_IF_ERROR(ExpectTensor(k_out, absl::StrCat(op, " k_out"), k.dtype(), k.shape(), k.device()));
  }
  p.theta = o.theta;
  SG_CHECK_ARG(o.theta > 0, op, ": theta must be positive, found ", o.theta);
  p.offset = o.position_offset;
  SG_CHECK_ARG(o.position_offset >= 0, op, ": position_offset must be >= 0, found ", o.position_offset);
  SG_CHECK_ARG(Present(o.cos) == Present(o.sin), op, ": the cos and sin tables must both be given or both be absent");
  if (Present(o.cos)) {
    SG_CHECK_ARG(o.cos.rank() == 2 && o.cos.dim(0) > 0, op, ": cos table must be f32 [max_positions, ",
                 p.head_dim / 2, "], found ", o.cos.ToString());
    p.table_rows = o.cos.dim(0);
    SG_RETURN_IF_ERROR(ExpectTensor(o.cos, absl::StrCat(op, " cos table"), DType::kF32, {p.table_rows, p.head_dim / 2},
                                    q.device()));
    SG_RETURN_IF_ERROR(ExpectTensor(o.sin, absl::StrCat(op, " sin table"), DType::kF32, {p.table_rows, p.head_dim / 2},
                                    q.device()));
    p.cos = o.cos.data<float>();
    p.sin = o.sin.data<float>();
  }
  if (Present(o.positions)) {
    const TensorView& pos = o.positions;
    SG_CHECK_ARG((pos.dtype() == DType::kI32 || pos.dtype() == DType::kI64) && pos.is_contiguous() &&
                     pos.device() == q.device() &&
                     ((pos.rank() == 1 && pos.dim(0) == p.seq) ||
                      (pos.rank() == 2 && pos.dim(0) == p.batch && pos.dim(1) == p.seq)),
                 op, ": positions must be contiguous i32 or i64 [", p.seq, "] or [", p.batch, ",", p.seq, "]@",
                 q.device().ToString(), ", found ", pos.ToString());
    p.positions = pos.raw();
    p.positions_i64 = pos.dtype() == DType::kI64;
    p.positions_per_batch = pos.rank() == 2;
    if (pos.device().is_cpu()) {
      SG_RETURN_IF_ERROR(p.positions_i64 ? CheckPositionsOnHost(op, pos.data<int64_t>(), pos.numel(), p.table_rows)
                                         : CheckPositionsOnHost(op, pos.data<int32_t>(), pos.numel(), p.table_rows));
    }
  } else if (p.table_rows > 0 && q.device().is_cpu()) {
    SG_CHECK_ARG(p.offset + p.seq <= p.table_rows, op, ": positions up to ", p.offset + p.seq - 1,
                 " need a table of at least ", p.offset + p.seq, " rows, found ", p.table_rows);
  }
  return p;
}

absl::Status Run(const char* op, const Problem& p, const TensorView& q, const TensorView& k, const TensorView& q_out,
                 const TensorView& k_out, const Stream& stream) {
  const rope_internal::Buffers b{q.raw(), k.raw(), q_out.raw(), k_out.raw()};
  if (q.device().is_cpu()) {
    rope_internal::ApplyCpu(p, b);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return rope_internal::ApplyCuda(p, b, stream.native());
#else
  return NoCuda(op);
#endif
}

}  // namespace

absl::Status RopeForward(const TensorView& q, const TensorView& k, const TensorView& q_out, const TensorView& k_out,
                         const RopeOptions& options, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, Check("RopeForward", q, k, q_out, k_out, options));
  p.sign = 1.f;
  return Run("RopeForward", p, q, k, q_out, k_out, stream);
}

absl::Status RopeBackward(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dq,
                          const TensorView& dk, const RopeOptions& options, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, Check("RopeBackward", dq_out, dk_out, dq, dk, options));
  p.sign = -1.f;
  return Run("RopeBackward", p, dq_out, dk_out, dq, dk, stream);
}

absl::Status RopeTable(float theta, const TensorView& cos, const TensorView& sin, const Stream& stream) {
  SG_CHECK_ARG(theta > 0, "RopeTable: theta must be positive, found ", theta);
  SG_CHECK_ARG(cos.rank() == 2 && cos.numel() > 0, "RopeTable: cos must be non-empty f32 [max_positions, half], found ",
               cos.ToString());
  SG_RETURN_IF_ERROR(ExpectTensor(cos, "RopeTable cos", DType::kF32, cos.shape(), cos.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(sin, "RopeTable sin", DType::kF32, cos.shape(), cos.device()));
  if (cos.device().is_cpu()) {
    rope_internal::TableCpu(theta, cos.dim(0), cos.dim(1), cos.data<float>(), sin.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return rope_internal::TableCuda(theta, cos.dim(0), cos.dim(1), cos.data<float>(), sin.data<float>(),
                                  stream.native());
#else
  return NoCuda("RopeTable");
#endif
}

}  // namespace sg::kernels
