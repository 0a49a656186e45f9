#include "kernels/core/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"

namespace sg {

bool TensorView::is_contiguous() const { return strides_ == ContiguousStrides(shape_); }

absl::StatusOr<TensorView> TensorView::Reshape(Shape shape) const {
  if (!is_contiguous()) return absl::InvalidArgumentError(absl::StrCat("Reshape of non-contiguous ", ToString()));
  if (NumElements(shape) != numel()) {
    return absl::InvalidArgumentError(absl::StrCat("Reshape of ", ToString(), " to ", ShapeToString(shape),
                                                   ": element counts differ"));
  }
  return TensorView(data_, dtype_, std::move(shape), device_);
}

absl::StatusOr<TensorView> TensorView::Slice0(int64_t begin, int64_t end) const {
  if (rank() == 0 || begin < 0 || end < begin || end > shape_[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("Slice0 [", begin, ", ", end, ") out of range for ", ToString()));
  }
  Shape s = shape_;
  s[0] = end - begin;
  char* p = static_cast<char*>(data_) + begin * strides_[0] * SizeOf(dtype_);
  return TensorView(p, dtype_, std::move(s), strides_, device_);
}

std::string TensorView::ToString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), "@", device_.ToString());
}

absl::StatusOr<Tensor> Tensor::Empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("Tensor::Empty: negative dim in ", ShapeToString(shape)));
  }
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(device));
  const int64_t bytes = NumElements(shape) * SizeOf(dtype);
  SG_ASSIGN_OR_RETURN(void* p, alloc->Allocate(bytes));
  Tensor t;
  t.storage_ = std::shared_ptr<void>(p, [alloc](void* q) { alloc->Free(q); });
  t.view_ = TensorView(p, dtype, std::move(shape), device);
  return t;
}

namespace {

absl::Status QueueCopy(const TensorView& src, const TensorView& dst, const Stream& stream, const char* op) {
  SG_CHECK_ARG(src.dtype() == dst.dtype() && src.numel() == dst.numel(), op, ": ", src.ToString(), " -> ",
               dst.ToString(), ": dtype and element count must match");
  SG_CHECK_ARG(src.is_contiguous() && dst.is_contiguous(), op, ": both sides must be contiguous");
  if (src.nbytes() == 0) return absl::OkStatus();
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::memmove(dst.raw(), src.raw(), size_t(src.nbytes()));
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.raw(), src.raw(), size_t(src.nbytes()), cudaMemcpyDefault,
                                          static_cast<cudaStream_t>(stream.native())));
  return absl::OkStatus();
#else
  (void)stream;
  return absl::FailedPreconditionError(absl::StrCat(op, " to/from CUDA: built without CUDA"));
#endif
}

}  // namespace

absl::Status CopyTensorAsync(const TensorView& src, const TensorView& dst, const Stream& stream) {
  return QueueCopy(src, dst, stream, "CopyTensorAsync");
}

absl::Status CopyTensor(const TensorView& src, const TensorView& dst, const Stream& stream) {
  SG_RETURN_IF_ERROR(QueueCopy(src, dst, stream, "CopyTensor"));
#ifdef SG_WITH_CUDA
  // One side on the host (pageable memory), the other on a device: complete the copy before the
  // caller touches the host side. (Host to host was done in place; without CUDA, QueueCopy refused.)
  if (src.nbytes() > 0 && src.device().is_cpu() != dst.device().is_cpu()) {
    SG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.native())));
  }
#endif
  return absl::OkStatus();
}

absl::Status ZeroTensor(const TensorView& dst, const Stream& stream) {
  SG_CHECK_ARG(dst.is_contiguous(), "ZeroTensor: ", dst.ToString(), " must be contiguous");
  if (dst.nbytes() == 0) return absl::OkStatus();
  if (dst.device().is_cpu()) {
    std::memset(dst.raw(), 0, size_t(dst.nbytes()));
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  SG_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dst.raw(), 0, size_t(dst.nbytes()), static_cast<cudaStream_t>(stream.native())));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("ZeroTensor on CUDA: built without CUDA");
#endif
}

absl::Status ExpectTensor(const TensorView& t, absl::string_view what, DType dtype, const Shape& shape,
                          Device device) {
  if (t.dtype() == dtype && t.shape() == shape && t.device() == device && t.is_contiguous()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": expected contiguous ", DTypeName(dtype), ShapeToString(shape), "@", device.ToString(),
      ", found ", t.ToString(), t.is_contiguous() ? "" : " (non-contiguous)"));
}

}  // namespace sg
