#include "kernels/gemm_rmsnorm/gemm_rmsnorm.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_rmsnorm/gemm_rmsnorm_internal.h"
#include "kernels/wgmma_gemm/wgmma_gemm.h"

namespace sg::kernels {
namespace {

namespace impl = gemm_rmsnorm_internal;

struct Dims {
  int64_t m = 0, k = 0, n = 0;
  DType dtype = DType::kF32;
};

// x [..., K] and a weight [N, K] of x's dtype.
absl::StatusOr<Dims> CheckXW(const char* op, const TensorView& x, const TensorView& w, const char* w_name) {
  SG_CHECK_ARG(x.rank() >= 1 && x.numel() > 0 && x.is_contiguous(), op, ": x must be non-empty and contiguous, found ",
               x.ToString());
  SG_CHECK_ARG(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, op, ": x must be f32 or bf16, found ",
               x.ToString());
  Dims d;
  d.k = x.dim(-1);
  d.m = x.numel() / d.k;
  d.dtype = x.dtype();
  SG_CHECK_ARG(w.rank() == 2 && w.dim(1) == d.k, op, ": ", w_name, " must be [N, ", d.k, "] to match x ", x.ToString(),
               ", found ", w.ToString());
  d.n = w.dim(0);
  SG_RETURN_IF_ERROR(ExpectTensor(w, absl::StrCat(op, " ", w_name), d.dtype, {d.n, d.k}, x.device()));
  return d;
}

absl::StatusOr<TensorView> Rows(const TensorView& t, int64_t m) { return t.Reshape({m, t.numel() / m}); }

// options.gemm with kFromEnv resolved from SG_GEMM_RMSNORM.
absl::StatusOr<GemmRmsNormGemm> ResolveGemm(GemmRmsNormGemm g) {
  if (g != GemmRmsNormGemm::kFromEnv) return g;
  const char* v = std::getenv("SG_GEMM_RMSNORM");
  const std::string s = v == nullptr ? "" : v;
  if (s == "cublas_epilogue") return GemmRmsNormGemm::kCublasEpilogue;
  if (s == "pass") return GemmRmsNormGemm::kRowScalePass;
  if (s.empty() || s == "wgmma") return GemmRmsNormGemm::kWgmma;
  return absl::InvalidArgumentError(
      absl::StrCat("SG_GEMM_RMSNORM: expected cublas_epilogue, pass or wgmma (or unset), found '", s, "'"));
}

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

}  // namespace

absl::Status GemmRmsNormFoldWeight(const TensorView& w, const TensorView& w_norm, const TensorView& w_folded,
                                   const Stream& stream) {
  constexpr const char* kOp = "GemmRmsNormFoldWeight";
  SG_CHECK_ARG(w.rank() == 2 && w.numel() > 0 && (w.dtype() == DType::kF32 || w.dtype() == DType::kBF16), kOp,
               ": w must be a non-empty f32 or bf16 [N, K] matrix, found ", w.ToString());
  const int64_t n = w.dim(0), k = w.dim(1);
  SG_RETURN_IF_ERROR(ExpectTensor(w, "GemmRmsNormFoldWeight w", w.dtype(), {n, k}, w.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(w_norm, "GemmRmsNormFoldWeight w_norm", w.dtype(), {k}, w.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(w_folded, "GemmRmsNormFoldWeight w_folded", w.dtype(), {n, k}, w.device()));
  if (w.device().is_cpu()) {
    impl::FoldWeightCpu(n, k, w.dtype(), w.raw(), w_norm.raw(), w_folded.raw());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return impl::FoldWeightCuda(n, k, w.dtype(), w.raw(), w_norm.raw(), w_folded.raw(), stream.native());
#else
  return NoCuda(kOp);
#endif
}

absl::Status GemmRmsNormForward(const TensorView& x, const TensorView& w_folded, float eps, const TensorView& out,
                                const TensorView& rstd, const Stream& stream, const GemmRmsNormOptions& options) {
  constexpr const char* kOp = "GemmRmsNormForward";
  SG_ASSIGN_OR_RETURN(Dims d, CheckXW(kOp, x, w_folded, "w_folded"));
  SG_CHECK_ARG(eps >= 0, kOp, ": eps must be >= 0, found ", eps);
  Shape out_shape = x.shape();
  out_shape.back() = d.n;
  SG_RETURN_IF_ERROR(ExpectTensor(out, "GemmRmsNormForward out", d.dtype, out_shape, x.device()));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "GemmRmsNormForward rstd", DType::kF32, {d.m}, x.device()));
  if (!options.rstd_given) {
    if (x.device().is_cpu()) {
      impl::RstdCpu(d.m, d.k, d.dtype, x.raw(), eps, rstd.data<float>());
    } else {
#ifdef SG_WITH_CUDA
      SG_RETURN_IF_ERROR(impl::RstdCuda(d.m, d.k, d.dtype, x.raw(), eps, rstd.data<float>(), stream.native()));
#else
      return NoCuda(kOp);
#endif
    }
  }
  SG_ASSIGN_OR_RETURN(const GemmRmsNormGemm which, ResolveGemm(options.gemm));
  GemmArgs g;
  SG_ASSIGN_OR_RETURN(g.a, Rows(x, d.m));
  g.b = w_folded;
  g.trans_b = true;
  SG_ASSIGN_OR_RETURN(g.d, Rows(out, d.m));
  g.row_scale = rstd;
  g.row_scale_in_epilogue = which != GemmRmsNormGemm::kRowScalePass;
  if (which == GemmRmsNormGemm::kWgmma && x.device().is_cuda()) {
    absl::Status s = WgmmaGemm(g.a, w_folded, rstd, g.d, stream);
    if (!absl::IsUnimplemented(s)) return s;  // else a GPU or shape the kernel does not cover
  }
  return Gemm(g, stream);
}

absl::Status GemmRmsNormBackward(const TensorView& dout, const TensorView& x, const TensorView& w,
                                 const TensorView& w_norm, const TensorView& w_folded, const TensorView& rstd,
                                 const TensorView& dx, const TensorView& dw, const TensorView& dw_norm,
                                 const Stream& stream) {
  constexpr const char* kOp = "GemmRmsNormBackward";
  SG_ASSIGN_OR_RETURN(Dims d, CheckXW(kOp, x, w, "w"));
  const Device dev = x.device();
  SG_RETURN_IF_ERROR(ExpectTensor(w_folded, "GemmRmsNormBackward w_folded", d.dtype, {d.n, d.k}, dev));
  SG_RETURN_IF_ERROR(ExpectTensor(w_norm, "GemmRmsNormBackward w_norm", d.dtype, {d.k}, dev));
  Shape out_shape = x.shape();
  out_shape.back() = d.n;
  SG_RETURN_IF_ERROR(ExpectTensor(dout, "GemmRmsNormBackward dout", d.dtype, out_shape, dev));
  SG_RETURN_IF_ERROR(ExpectTensor(rstd, "GemmRmsNormBackward rstd", DType::kF32, {d.m}, dev));
  SG_RETURN_IF_ERROR(ExpectTensor(dx, "GemmRmsNormBackward dx", d.dtype, x.shape(), dev));
  SG_RETURN_IF_ERROR(ExpectTensor(dw, "GemmRmsNormBackward dw", DType::kF32, {d.n, d.k}, dev));
  SG_RETURN_IF_ERROR(ExpectTensor(dw_norm, "GemmRmsNormBackward dw_norm", DType::kF32, {d.k}, dev));
#ifndef SG_WITH_CUDA
  if (dev.is_cuda()) return NoCuda(kOp);
#endif
  SG_ASSIGN_OR_RETURN(TensorView dout2, Rows(dout, d.m));
  // Scratch [M, K] pair, returned to the allocator when this call returns: the caching allocator
  // hands it out again only to work ordered after ours on the compute stream.
  SG_ASSIGN_OR_RETURN(Tensor dz, Tensor::Empty({d.m, d.k}, d.dtype, dev));
  SG_ASSIGN_OR_RETURN(Tensor xhat, Tensor::Empty({d.m, d.k}, d.dtype, dev));

  GemmArgs g1;  // dz[M,K] = dout[M,N] @ w_folded[N,K]
  g1.a = dout2;
  g1.b = w_folded;
  g1.d = dz;
  SG_RETURN_IF_ERROR(Gemm(g1, stream));
  if (dev.is_cpu()) {
    impl::NormBackwardCpu(d.m, d.k, d.dtype, dz.view().raw(), x.raw(), rstd.data<float>(), dx.raw(), xhat.view().raw());
  } else {
#ifdef SG_WITH_CUDA
    SG_RETURN_IF_ERROR(impl::NormBackwardCuda(d.m, d.k, d.dtype, dz.view().raw(), x.raw(), rstd.data<float>(),
                                              dx.raw(), xhat.view().raw(), stream.native()));
#endif
  }
  GemmArgs g2;  // G[N,K] = dout[M,N]^T @ xhat[M,K], into dw
  g2.a = dout2;
  g2.trans_a = true;
  g2.b = xhat;
  g2.d = dw;
  SG_RETURN_IF_ERROR(Gemm(g2, stream));
  if (dev.is_cpu()) {
    impl::WeightGradCpu(d.n, d.k, d.dtype, w.raw(), w_norm.raw(), dw.data<float>(), dw_norm.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return impl::WeightGradCuda(d.n, d.k, d.dtype, w.raw(), w_norm.raw(), dw.data<float>(), dw_norm.data<float>(),
                              dev.ordinal, stream.native());
#else
  return NoCuda(kOp);
#endif
}

}  // namespace sg::kernels
