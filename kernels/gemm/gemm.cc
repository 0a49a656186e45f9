#include "kernels/gemm/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/autotune/tuning_table.h"
#include "kernels/core/status.h"
#include "kernels/gemm/gemm_internal.h"

namespace sg::kernels {
namespace {

// SG_GEMM_SMS in the environment: the SM-count target of every GEMM that sets none (an experiment
// knob, e.g. leaving SMs to collectives running beside the step's GEMMs); read once; unset: 0.
int GemmSmsFromEnv() {
  static const int sms = [] {
    const char* v = std::getenv("SG_GEMM_SMS");
    return v == nullptr ? 0 : std::max(0, std::atoi(v));
  }();
  return sms;
}

using gemm_internal::Matrix;
using gemm_internal::Problem;

// A rank-2 or rank-3 operand as a (batched) row-major matrix with unit column stride.
absl::StatusOr<Matrix> ToMatrix(const TensorView& t, const char* name) {
  SG_CHECK_ARG(t.rank() == 2 || t.rank() == 3, "Gemm: ", name, " must be [rows,cols] or [batch,rows,cols], found ",
               t.ToString());
  SG_CHECK_ARG(t.raw() != nullptr, "Gemm: ", name, " has no data: ", t.ToString());
  const int r = t.rank();
  Matrix m;
  m.data = t.raw();
  m.rows = t.dim(r - 2);
  m.cols = t.dim(r - 1);
  SG_CHECK_ARG(m.rows > 0 && m.cols > 0, "Gemm: ", name, " must be non-empty, found ", t.ToString());
  SG_CHECK_ARG(t.strides()[r - 1] == 1 || m.cols == 1, "Gemm: ", name,
               " must have a contiguous last dimension (stride 1), found strides [",
               absl::StrJoin(t.strides(), ","), "] for ", t.ToString());
  m.ld = m.rows == 1 ? m.cols : t.strides()[r - 2];
  SG_CHECK_ARG(m.ld >= m.cols, "Gemm: ", name, " row stride ", m.ld, " is smaller than its ", m.cols,
               " columns (", t.ToString(), ")");
  if (r == 3) {
    m.batch_stride = t.dim(0) == 1 ? m.rows * m.ld : t.strides()[0];
    SG_CHECK_ARG(m.batch_stride >= 0, "Gemm: ", name, " has a negative batch stride");
  }
  return m;
}

int64_t Batch(const TensorView& t) { return t.rank() == 3 ? t.dim(0) : 1; }

bool PackedBatches(const Matrix& m) { return m.batch_stride == m.rows * m.ld; }

absl::StatusOr<Problem> CheckArgs(const GemmArgs& g) {
  SG_ASSIGN_OR_RETURN(Matrix a, ToMatrix(g.a, "a"));
  SG_ASSIGN_OR_RETURN(Matrix b, ToMatrix(g.b, "b"));
  SG_ASSIGN_OR_RETURN(Matrix d, ToMatrix(g.d, "d"));
  const Device dev = g.d.device();
  SG_CHECK_ARG(g.a.device() == dev && g.b.device() == dev, "Gemm: a, b and d must be on one device, found a ",
               g.a.ToString(), ", b ", g.b.ToString(), ", d ", g.d.ToString());
  SG_CHECK_ARG(g.a.dtype() == g.b.dtype() && IsFloating(g.a.dtype()),
               "Gemm: a and b must both be f32, both bf16 or both f16, found a ", g.a.ToString(), ", b ",
               g.b.ToString());
  SG_CHECK_ARG(g.d.dtype() == DType::kF32 || g.d.dtype() == g.a.dtype(),
               "Gemm: d must be f32, or the inputs' 16-bit dtype; found a ", g.a.ToString(), ", d ", g.d.ToString());

  Problem p;
  p.ab_dtype = g.a.dtype();
  p.d_dtype = g.d.dtype();
  p.trans_a = g.trans_a;
  p.trans_b = g.trans_b;
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.m = g.trans_a ? a.cols : a.rows;
  p.k = g.trans_a ? a.rows : a.cols;
  const int64_t kb = g.trans_b ? b.cols : b.rows;
  p.n = g.trans_b ? b.rows : b.cols;
  SG_CHECK_ARG(kb == p.k, "Gemm: inner dimensions differ: op(a) is [", p.m, ",", p.k, "] (a ", g.a.ToString(),
               g.trans_a ? ", transposed" : "", ") but op(b) is [", kb, ",", p.n, "] (b ", g.b.ToString(),
               g.trans_b ? ", transposed" : "", ")");
  SG_CHECK_ARG(d.rows == p.m && d.cols == p.n, "Gemm: d must be [", p.m, ",", p.n, "] per batch entry, found ",
               g.d.ToString());

  p.batch = Batch(g.a);
  SG_CHECK_ARG(g.d.rank() == g.a.rank() && Batch(g.d) == p.batch, "Gemm: d must have a's batch: a ",
               g.a.ToString(), ", d ", g.d.ToString());
  SG_CHECK_ARG(g.b.rank() == 2 || (g.a.rank() == 3 && Batch(g.b) == p.batch), "Gemm: b must be a matrix or have a's batch ",
               p.batch, ", found b ", g.b.ToString(), " with a ", g.a.ToString());
  if (g.b.rank() == 2) b.batch_stride = 0;

  if (g.beta != 0.0f) {
    if (g.c.has_value()) {
      SG_ASSIGN_OR_RETURN(Matrix c, ToMatrix(*g.c, "c"));
      SG_CHECK_ARG(g.c->dtype() == g.d.dtype() && g.c->shape() == g.d.shape() && g.c->device() == dev,
                   "Gemm: c must match d's dtype, shape and device: expected ", g.d.ToString(), ", found ",
                   g.c->ToString());
      SG_CHECK_ARG(c.data != d.data, "Gemm: c must not alias d; omit c to accumulate into d in place");
      p.c = c;
    } else {
      p.c = d;  // in place: beta * d
    }
  } else {
    SG_CHECK_ARG(!g.c.has_value(), "Gemm: c given but beta == 0; set beta (1 for a residual add)");
  }
  if (g.bias.has_value()) {
    SG_RETURN_IF_ERROR(ExpectTensor(*g.bias, "Gemm bias", g.d.dtype(), {p.n}, dev));
    p.bias = g.bias->raw();
  }
  if (g.row_scale.has_value()) {
    SG_RETURN_IF_ERROR(ExpectTensor(*g.row_scale, "Gemm row_scale", DType::kF32, {p.m}, dev));
    SG_CHECK_ARG(g.beta == 0.0f && !g.bias.has_value(), "Gemm: row_scale requires beta == 0 and no bias, found beta ",
                 g.beta, g.bias.has_value() ? " and a bias" : "");
    p.row_scale = g.row_scale->data<float>();
    p.row_scale_in_epilogue = g.row_scale_in_epilogue;
  }
  p.a = a;
  p.b = b;
  p.d = d;
  p.tuned = g.algo == GemmAlgo::kTuned ||
            (g.algo == GemmAlgo::kDefault && autotune::Tuner::Global().enabled());
  SG_CHECK_ARG(g.sm_count >= 0, "Gemm: sm_count must be >= 0 (0: all SMs), found ", g.sm_count);
  p.sm_count = g.sm_count > 0 ? g.sm_count : GemmSmsFromEnv();

  // A batch of [M,K] rows times one shared matrix is one taller GEMM when the rows are evenly spaced.
  if (p.batch > 1 && b.batch_stride == 0 && !p.trans_a && p.row_scale == nullptr && PackedBatches(p.a) &&
      PackedBatches(p.d) && (p.c.data == nullptr || PackedBatches(p.c))) {
    p.m *= p.batch;
    for (Matrix* x : {&p.a, &p.d, &p.c}) {
      x->rows *= p.batch;
      x->batch_stride = 0;
    }
    p.batch = 1;
  }
  return p;
}

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

// [..., cols] -> [rows, cols] for a contiguous tensor.
absl::StatusOr<TensorView> Flatten2d(const TensorView& t, const char* op, const char* name) {
  SG_CHECK_ARG(t.rank() >= 1 && t.is_contiguous(), op, ": ", name, " must be contiguous with rank >= 1, found ",
               t.ToString());
  const int64_t cols = t.dim(-1);
  return t.Reshape({cols == 0 ? 0 : t.numel() / cols, cols});
}

}  // namespace

absl::Status Gemm(const GemmArgs& args, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(Problem p, CheckArgs(args));
  if (args.d.device().is_cpu()) {
    gemm_internal::GemmCpu(p);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return gemm_internal::GemmCuda(p, args.d.device().ordinal, stream.native());
#else
  return NoCuda("Gemm");
#endif
}

void ResetGemmAlgorithmCache() {
#ifdef SG_WITH_CUDA
  gemm_internal::ResetAlgoCacheCuda();
#endif
}

std::string DescribeCublasLtChoice(const std::string& variant) {
#ifdef SG_WITH_CUDA
  return gemm_internal::DescribeAlgoCuda(variant);
#else
  (void)variant;
  return "";
#endif
}

absl::Status MatmulForward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& bias,
                           const TensorView& y, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(TensorView x2, Flatten2d(x, "MatmulForward", "x"));
  SG_ASSIGN_OR_RETURN(TensorView y2, Flatten2d(y, "MatmulForward", "y"));
  SG_CHECK_ARG(x2.dim(0) == y2.dim(0), "MatmulForward: x ", x.ToString(), " and y ", y.ToString(),
               " must have the same leading dimensions");
  GemmArgs g;
  g.a = x2;
  g.b = w;
  g.trans_b = true;
  g.d = y2;
  g.bias = bias;
  return Gemm(g, stream);
}

absl::Status MatmulBackward(const TensorView& dy, const TensorView& x, const TensorView& w,
                            const std::optional<TensorView>& dx, const TensorView& dw, bool accumulate_dw,
                            const Stream& stream) {
  SG_ASSIGN_OR_RETURN(TensorView dy2, Flatten2d(dy, "MatmulBackward", "dy"));
  SG_ASSIGN_OR_RETURN(TensorView x2, Flatten2d(x, "MatmulBackward", "x"));
  SG_CHECK_ARG(x2.dim(0) == dy2.dim(0), "MatmulBackward: x ", x.ToString(), " and dy ", dy.ToString(),
               " must have the same leading dimensions");
  if (dx.has_value()) {
    SG_CHECK_ARG(dx->shape() == x.shape(), "MatmulBackward: dx must have x's shape ", ShapeToString(x.shape()),
                 ", found ", dx->ToString());
    SG_ASSIGN_OR_RETURN(TensorView dx2, Flatten2d(*dx, "MatmulBackward", "dx"));
    GemmArgs g;  // dx[M,K] = dy[M,N] @ w[N,K]
    g.a = dy2;
    g.b = w;
    g.d = dx2;
    SG_RETURN_IF_ERROR(Gemm(g, stream));
  }
  GemmArgs g;  // dw[N,K] = dy[M,N]^T @ x[M,K]
  g.a = dy2;
  g.trans_a = true;
  g.b = x2;
  g.d = dw;
  g.beta = accumulate_dw ? 1.0f : 0.0f;
  return Gemm(g, stream);
}

}  // namespace sg::kernels
