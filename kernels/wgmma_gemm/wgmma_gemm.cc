#include "kernels/wgmma_gemm/wgmma_gemm.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/wgmma_gemm/wgmma_gemm_internal.h"

namespace sg::kernels {
namespace {

namespace impl = wgmma_gemm_internal;
constexpr const char* kOp = "WgmmaGemm";

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::StatusOr<impl::KernelVariant> ChooseVariant(WgmmaGemmVariant v) {
  switch (v) {
    case WgmmaGemmVariant::kRegisterStores:
      return impl::KernelVariant::kRegisterStores;
    case WgmmaGemmVariant::kTmaStore:
      return impl::KernelVariant::kTmaStore;
    case WgmmaGemmVariant::kClusterMulticast:
      return impl::KernelVariant::kClusterMulticast;
    case WgmmaGemmVariant::kFromEnv:
      break;
  }
  const char* env = std::getenv("SG_WGMMA_GEMM_VARIANT");
  const std::string name = env != nullptr ? env : "";
  if (name == "registers") return impl::KernelVariant::kRegisterStores;
  if (name.empty() || name == "tma_store") return impl::KernelVariant::kTmaStore;
  if (name == "cluster") return impl::KernelVariant::kClusterMulticast;
  return absl::InvalidArgumentError(absl::StrCat(
      kOp, ": SG_WGMMA_GEMM_VARIANT must be registers, tma_store or cluster (or unset), found '", name, "'"));
}

}  // namespace

absl::Status WgmmaGemm(const TensorView& a, const TensorView& b, const std::optional<TensorView>& row_scale,
                       const TensorView& d, const Stream& stream, WgmmaGemmVariant variant) {
  SG_ASSIGN_OR_RETURN(const impl::KernelVariant kernel_variant, ChooseVariant(variant));
  SG_CHECK_ARG(a.rank() >= 1 && a.numel() > 0, kOp, ": a must be a non-empty [..., K] tensor, found ", a.ToString());
  const int64_t k = a.dim(-1), m = a.numel() / k;
  SG_CHECK_ARG(b.rank() == 2 && b.dim(1) == k, kOp, ": b must be [N, ", k, "] to match a ", a.ToString(), ", found ",
               b.ToString());
  const int64_t n = b.dim(0);
  SG_CHECK_ARG(b.dtype() == a.dtype(), kOp, ": b must have a's dtype ", DTypeName(a.dtype()), ", found ", b.ToString());
  SG_CHECK_ARG(d.dtype() == a.dtype(), kOp, ": d must have a's dtype ", DTypeName(a.dtype()), ", found ", d.ToString());
  SG_CHECK_ARG(d.rank() >= 1 && d.dim(-1) == n && d.numel() == m * n, kOp, ": d must be [..., ", n, "] with ", m,
               " rows to match a ", a.ToString(), " and b ", b.ToString(), ", found ", d.ToString());
  SG_CHECK_ARG(b.device() == a.device() && d.device() == a.device(), kOp, ": a, b and d must share a device, found ",
               a.ToString(), ", ", b.ToString(), ", ", d.ToString());
  if (row_scale.has_value()) {
    SG_CHECK_ARG(row_scale->dtype() == DType::kF32 && row_scale->numel() == m && row_scale->is_contiguous() &&
                     row_scale->device() == a.device(),
                 kOp, ": row_scale must be a contiguous f32 [", m, "] on ", a.device().ToString(), ", found ",
                 row_scale->ToString());
  }

  if (!a.device().is_cuda()) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": CUDA only, found tensors on ", a.device().ToString()));
  }
  if (a.dtype() != DType::kBF16) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": bf16 only, found ", DTypeName(a.dtype())));
  }
  if (m % impl::kTileM != 0 || n % impl::kTileN != 0 || k % impl::kTileK != 0 || m >= (int64_t(1) << 31) ||
      n >= (int64_t(1) << 31) || k >= (int64_t(1) << 31)) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": needs M % ", impl::kTileM, " == 0, N % ", impl::kTileN,
                                                 " == 0, K % ", impl::kTileK, " == 0 (each below 2^31), found M=", m,
                                                 " N=", n, " K=", k));
  }
  if (!a.is_contiguous() || !b.is_contiguous() || !d.is_contiguous() || !Aligned16(a.raw()) || !Aligned16(b.raw()) ||
      !Aligned16(d.raw())) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": needs contiguous, 16-byte aligned a, b and d, found ",
                                                 a.ToString(), ", ", b.ToString(), ", ", d.ToString()));
  }
#ifdef SG_WITH_CUDA
  return impl::WgmmaGemmCuda(m, n, k, a.raw(), b.raw(), row_scale.has_value() ? row_scale->data<float>() : nullptr,
                             d.raw(), stream.native(), kernel_variant);
#else
  (void)kernel_variant;
  return absl::UnimplementedError(absl::StrCat(kOp, ": CUDA tensors given to a build without CUDA"));
#endif
}

}  // namespace sg::kernels
