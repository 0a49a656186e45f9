#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/wgmma_gemm/wgmma_gemm_internal.h"

namespace sg::kernels {
namespace {

namespace impl = wgmma_gemm_internal;
constexpr const char* kOp = "WgmmaGemmSwiGlu";
constexpr const char* kBwd = "WgmmaGemmSwiGluBackward";

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Checks the interleave's operands: w1 and w3 [F, K], w13 [2F, K], F % kSwiGluBlock == 0, one
// dtype and device, contiguous. `op` names the caller.
absl::Status CheckInterleave(const char* op, const TensorView& w1, const TensorView& w3, const TensorView& w13) {
  SG_CHECK_ARG(w1.rank() == 2 && w1.dim(0) > 0 && w1.dim(1) > 0 && w1.dim(0) % kSwiGluBlock == 0, op,
               ": w1 must be a non-empty [F, K] with F a multiple of ", kSwiGluBlock, ", found ", w1.ToString());
  const int64_t f = w1.dim(0), k = w1.dim(1);
  SG_CHECK_ARG(w3.shape() == w1.shape() && w3.dtype() == w1.dtype() && w3.device() == w1.device(), op,
               ": w3 must match w1 ", w1.ToString(), ", found ", w3.ToString());
  SG_CHECK_ARG(w13.rank() == 2 && w13.dim(0) == 2 * f && w13.dim(1) == k && w13.dtype() == w1.dtype() &&
                   w13.device() == w1.device(),
               op, ": w13 must be ", DTypeName(w1.dtype()), "[", 2 * f, ",", k, "]@", w1.device().ToString(),
               " to match w1 ", w1.ToString(), ", found ", w13.ToString());
  SG_CHECK_ARG(w1.is_contiguous() && w3.is_contiguous() && w13.is_contiguous(), op,
               ": w1, w3 and w13 must be contiguous, found ", w1.ToString(), ", ", w3.ToString(), ", ", w13.ToString());
  return absl::OkStatus();
}

// `rows` runs of `width` bytes from src (runs `src_pitch` bytes apart) to dst (`dst_pitch` apart).
absl::Status CopyRuns(char* dst, int64_t dst_pitch, const char* src, int64_t src_pitch, int64_t width, int64_t rows,
                      const Device& device, const Stream& stream) {
  if (device.is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_pitch, src + r * src_pitch, size_t(width));
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return impl::CopyRuns2dCuda(dst, dst_pitch, src, src_pitch, width, rows, stream.native());
#else
  (void)stream;
  return absl::FailedPreconditionError("InterleaveGateUp: CUDA tensors given to a build without CUDA");
#endif
}

// Moves W1's and W3's blocks between their own tensors and w13 (interleave: to w13; else from it).
absl::Status Interleave(const char* op, const TensorView& w1, const TensorView& w3, const TensorView& w13, bool to_w13,
                        const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckInterleave(op, w1, w3, w13));
  const int64_t block_bytes = kSwiGluBlock * w1.dim(1) * SizeOf(w1.dtype()), blocks = w1.dim(0) / kSwiGluBlock;
  char* const w13_bytes = static_cast<char*>(w13.raw());
  for (const auto& [part, offset] : {std::pair{&w1, int64_t(0)}, std::pair{&w3, block_bytes}}) {
    char* const own = static_cast<char*>(part->raw());
    if (to_w13) {
      SG_RETURN_IF_ERROR(
          CopyRuns(w13_bytes + offset, 2 * block_bytes, own, block_bytes, block_bytes, blocks, w1.device(), stream));
    } else {
      SG_RETURN_IF_ERROR(
          CopyRuns(own, block_bytes, w13_bytes + offset, 2 * block_bytes, block_bytes, blocks, w1.device(), stream));
    }
  }
  return absl::OkStatus();
}

// The conditions on shapes, dtype and device under which the kernel runs (Unimplemented otherwise).
absl::Status ShapeSupported(int64_t m, int64_t k, int64_t f, DType dtype, const Device& device) {
  if (!device.is_cuda()) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": CUDA only, found tensors on ", device.ToString()));
  }
  if (dtype != DType::kBF16) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": bf16 only, found ", DTypeName(dtype)));
  }
  if (m <= 0 || k <= 0 || f <= 0 || m % impl::kTileM != 0 || k % impl::kTileK != 0 || f % kSwiGluBlock != 0 ||
      m >= (int64_t(1) << 31) || 2 * f >= (int64_t(1) << 31) || k >= (int64_t(1) << 31)) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": needs M % ", impl::kTileM, " == 0, K % ", impl::kTileK,
                                                 " == 0 and F % ", kSwiGluBlock,
                                                 " == 0 (M, 2F, K below 2^31), found M=", m, " F=", f, " K=", k));
  }
  return absl::OkStatus();
}

// The backward's conditions: F a multiple of the whole tile (each tile's gate and up columns are
// its own dh columns).
absl::Status BackwardShapeSupported(int64_t m, int64_t k, int64_t f, DType dtype, const Device& device) {
  if (!device.is_cuda()) {
    return absl::UnimplementedError(absl::StrCat(kBwd, ": CUDA only, found tensors on ", device.ToString()));
  }
  if (dtype != DType::kBF16) {
    return absl::UnimplementedError(absl::StrCat(kBwd, ": bf16 only, found ", DTypeName(dtype)));
  }
  if (m <= 0 || k <= 0 || f <= 0 || m % impl::kTileM != 0 || k % impl::kTileK != 0 || f % impl::kTileN != 0 ||
      m >= (int64_t(1) << 31) || f >= (int64_t(1) << 31) || k >= (int64_t(1) << 31)) {
    return absl::UnimplementedError(absl::StrCat(kBwd, ": needs M % ", impl::kTileM, " == 0, K % ", impl::kTileK,
                                                 " == 0 and F % ", impl::kTileN, " == 0 (below 2^31), found M=", m,
                                                 " F=", f, " K=", k));
  }
  return absl::OkStatus();
}

// Whether this process's current GPU runs the kernels (sm_90), for `op`'s message.
absl::Status GpuSupported(const char* op) {
#ifdef SG_WITH_CUDA
  absl::StatusOr<int> sms = impl::Sm90MultiProcessors(op);
  if (absl::IsUnimplemented(sms.status())) return sms.status();
  if (!sms.ok()) {  // no usable device: the kernel cannot run either
    return absl::UnimplementedError(absl::StrCat(op, ": no CUDA device to run on: ", sms.status().message()));
  }
  return absl::OkStatus();
#else
  return absl::UnimplementedError(absl::StrCat(op, ": a build without CUDA"));
#endif
}

}  // namespace

absl::Status WgmmaGemmSwiGluSupports(int64_t m, int64_t k, int64_t f, DType dtype, const Device& device,
                                     bool query_gpu) {
  SG_RETURN_IF_ERROR(ShapeSupported(m, k, f, dtype, device));
  return query_gpu ? GpuSupported(kOp) : absl::OkStatus();
}

absl::Status WgmmaGemmSwiGluBackwardSupports(int64_t m, int64_t k, int64_t f, DType dtype, const Device& device,
                                             bool query_gpu) {
  SG_RETURN_IF_ERROR(BackwardShapeSupported(m, k, f, dtype, device));
  return query_gpu ? GpuSupported(kBwd) : absl::OkStatus();
}

absl::Status InterleaveGateUp(const TensorView& w1, const TensorView& w3, const TensorView& w13, const Stream& stream) {
  return Interleave("InterleaveGateUp", w1, w3, w13, /*to_w13=*/true, stream);
}

absl::Status DeinterleaveGateUp(const TensorView& w13, const TensorView& w1, const TensorView& w3,
                                const Stream& stream) {
  return Interleave("DeinterleaveGateUp", w1, w3, w13, /*to_w13=*/false, stream);
}

absl::Status WgmmaGemmSwiGlu(const TensorView& x, const TensorView& w13, const std::optional<TensorView>& row_scale,
                             const TensorView& h, const std::optional<TensorView>& gate_up, const Stream& stream) {
  SG_CHECK_ARG(x.rank() >= 1 && x.numel() > 0, kOp, ": x must be a non-empty [..., K] tensor, found ", x.ToString());
  const int64_t k = x.dim(-1), m = x.numel() / k;
  SG_CHECK_ARG(w13.rank() == 2 && w13.dim(1) == k && w13.dim(0) > 0 && w13.dim(0) % (2 * kSwiGluBlock) == 0, kOp,
               ": w13 must be the interleaved [2F, ", k, "] (2F a multiple of ", 2 * kSwiGluBlock, ") to match x ",
               x.ToString(), ", found ", w13.ToString());
  const int64_t f = w13.dim(0) / 2;
  SG_CHECK_ARG(w13.dtype() == x.dtype(), kOp, ": w13 must have x's dtype ", DTypeName(x.dtype()), ", found ",
               w13.ToString());
  SG_CHECK_ARG(h.dtype() == x.dtype() && h.rank() >= 1 && h.dim(-1) == f && h.numel() == m * f, kOp, ": h must be ",
               DTypeName(x.dtype()), "[..., ", f, "] with ", m, " rows to match x ", x.ToString(), " and w13 ",
               w13.ToString(), ", found ", h.ToString());
  SG_CHECK_ARG(w13.device() == x.device() && h.device() == x.device(), kOp,
               ": x, w13 and h must share a device, found ", x.ToString(), ", ", w13.ToString(), ", ", h.ToString());
  if (gate_up.has_value()) {
    SG_CHECK_ARG(gate_up->dtype() == x.dtype() && gate_up->rank() >= 1 && gate_up->dim(-1) == 2 * f &&
                     gate_up->numel() == m * 2 * f && gate_up->device() == x.device(),
                 kOp, ": gate_up must be ", DTypeName(x.dtype()), "[..., ", 2 * f, "] with ", m, " rows on ",
                 x.device().ToString(), ", found ", gate_up->ToString());
  }
  if (row_scale.has_value()) {
    SG_CHECK_ARG(row_scale->dtype() == DType::kF32 && row_scale->numel() == m && row_scale->is_contiguous() &&
                     row_scale->device() == x.device(),
                 kOp, ": row_scale must be a contiguous f32 [", m, "] on ", x.device().ToString(), ", found ",
                 row_scale->ToString());
  }

  SG_RETURN_IF_ERROR(ShapeSupported(m, k, f, x.dtype(), x.device()));
  const bool contiguous = x.is_contiguous() && w13.is_contiguous() && h.is_contiguous() &&
                          (!gate_up.has_value() || gate_up->is_contiguous());
  const bool aligned = Aligned16(x.raw()) && Aligned16(w13.raw()) && Aligned16(h.raw()) &&
                       (!gate_up.has_value() || Aligned16(gate_up->raw()));
  if (!contiguous || !aligned) {
    return absl::UnimplementedError(
        absl::StrCat(kOp, ": needs contiguous, 16-byte aligned x, w13, h and gate_up, found ", x.ToString(), ", ",
                     w13.ToString(), ", ", h.ToString(), gate_up.has_value() ? ", " + gate_up->ToString() : ""));
  }
  static_assert(impl::kTileN == 2 * kSwiGluBlock, "a tile must hold one block of gate and one of up");
#ifdef SG_WITH_CUDA
  return impl::WgmmaGemmSwiGluCuda(m, 2 * f, k, x.raw(), w13.raw(),
                                   row_scale.has_value() ? row_scale->data<float>() : nullptr,
                                   gate_up.has_value() ? gate_up->raw() : nullptr, h.raw(), stream.native());
#else
  (void)stream;
  return absl::UnimplementedError(absl::StrCat(kOp, ": CUDA tensors given to a build without CUDA"));
#endif
}

absl::Status WgmmaGemmSwiGluBackward(const TensorView& dy, const TensorView& w2t, const TensorView& gate,
                                     const TensorView& up, const TensorView& dgate, const TensorView& dup,
                                     const Stream& stream) {
  SG_CHECK_ARG(dy.rank() >= 1 && dy.numel() > 0, kBwd, ": dy must be a non-empty [..., K] tensor, found ",
               dy.ToString());
  const int64_t k = dy.dim(-1), m = dy.numel() / k;
  SG_CHECK_ARG(w2t.rank() == 2 && w2t.dim(1) == k && w2t.dim(0) > 0 && w2t.dtype() == dy.dtype() &&
                   w2t.device() == dy.device(),
               kBwd, ": w2t must be ", DTypeName(dy.dtype()), "[F, ", k, "]@", dy.device().ToString(),
               " (the transposed down projection) to match dy ", dy.ToString(), ", found ", w2t.ToString());
  const int64_t f = w2t.dim(0);
  for (const auto& [t, name] : {std::pair{&gate, "gate"}, std::pair{&up, "up"}, std::pair{&dgate, "dgate"},
                                std::pair{&dup, "dup"}}) {
    SG_CHECK_ARG(t->dtype() == dy.dtype() && t->rank() >= 1 && t->dim(-1) == f && t->numel() == m * f &&
                     t->device() == dy.device(),
                 kBwd, ": ", name, " must be ", DTypeName(dy.dtype()), "[..., ", f, "] with ", m, " rows on ",
                 dy.device().ToString(), " to match dy ", dy.ToString(), " and w2t ", w2t.ToString(), ", found ",
                 t->ToString());
  }
  SG_RETURN_IF_ERROR(BackwardShapeSupported(m, k, f, dy.dtype(), dy.device()));
  bool ok = true;
  for (const TensorView* t : {&dy, &w2t, &gate, &up, &dgate, &dup}) ok = ok && t->is_contiguous() && Aligned16(t->raw());
  if (!ok) {
    return absl::UnimplementedError(absl::StrCat(kBwd, ": needs contiguous, 16-byte aligned operands, found dy ",
                                                 dy.ToString(), ", w2t ", w2t.ToString(), ", gate ", gate.ToString(),
                                                 ", up ", up.ToString(), ", dgate ", dgate.ToString(), ", dup ",
                                                 dup.ToString()));
  }
#ifdef SG_WITH_CUDA
  return impl::WgmmaGemmSwiGluBackwardCuda(m, f, k, dy.raw(), w2t.raw(), gate.raw(), up.raw(), dgate.raw(),
                                           dup.raw(), stream.native());
#else
  (void)stream;
  return absl::UnimplementedError(absl::StrCat(kBwd, ": CUDA tensors given to a build without CUDA"));
#endif
}

absl::Status TransposeMatrix(const TensorView& src, const TensorView& dst, const Stream& stream) {
  constexpr const char* kT = "TransposeMatrix";
  SG_CHECK_ARG(src.rank() == 2 && src.is_contiguous(), kT, ": src must be a contiguous [R, C] matrix, found ",
               src.ToString());
  const int64_t rows = src.dim(0), cols = src.dim(1);
  SG_CHECK_ARG(dst.rank() == 2 && dst.dim(0) == cols && dst.dim(1) == rows && dst.dtype() == src.dtype() &&
                   dst.device() == src.device() && dst.is_contiguous(),
               kT, ": dst must be a contiguous ", DTypeName(src.dtype()), "[", cols, ",", rows, "]@",
               src.device().ToString(), " to hold src ", src.ToString(), " transposed, found ", dst.ToString());
  const int64_t size = SizeOf(src.dtype());
  const char* in = static_cast<const char*>(src.raw());
  char* out = static_cast<char*>(dst.raw());
  SG_CHECK_ARG(rows == 0 || cols == 0 || out + rows * cols * size <= in || in + rows * cols * size <= out, kT,
               ": dst must not overlap src (not in place), found ", src.ToString(), " and ", dst.ToString());
  if (src.device().is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) std::memcpy(out + (c * rows + r) * size, in + (r * cols + c) * size, size_t(size));
    }
    return absl::OkStatus();
  }
  if (size != 2) {
    return absl::UnimplementedError(absl::StrCat(kT, ": CUDA tensors of 2-byte dtypes only, found ", src.ToString()));
  }
  if (rows == 0 || cols == 0) return absl::OkStatus();
#ifdef SG_WITH_CUDA
  return impl::Transpose2ByteCuda(rows, cols, in, out, stream.native());
#else
  (void)stream;
  return absl::FailedPreconditionError(absl::StrCat(kT, ": CUDA tensors given to a build without CUDA"));
#endif
}

}  // namespace sg::kernels
