// Tensors: an owning Tensor (memory from the device's allocator, shared by copies) and a
// non-owning TensorView (pointer, dtype, shape, strides, device) that every kernel takes.
//
//   SG_ASSIGN_OR_RETURN(sg::Tensor x, sg::Tensor::Empty({rows, cols}, sg::DType::kBF16, device));
//   SG_RETURN_IF_ERROR(sg::CopyTensor(host_x.view(), x.view(), stream));
//   sg::BFloat16* p = x.view().data<sg::BFloat16>();
#ifndef SGTRAIN_KERNELS_CORE_TENSOR_H_
#define SGTRAIN_KERNELS_CORE_TENSOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/core/device.h"
#include "kernels/core/dtype.h"
#include "kernels/core/shape.h"
#include "kernels/core/stream.h"

namespace sg {

class TensorView {
 public:
  TensorView() = default;
  // A contiguous view of `data`.
  TensorView(void* data, DType dtype, Shape shape, Device device)
      : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(ContiguousStrides(shape_)),
        device_(device) {}
  TensorView(void* data, DType dtype, Shape shape, Strides strides, Device device)
      : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)),
        device_(device) {}

  void* raw() const { return data_; }
  // Typed pointer. The caller has checked dtype() (kernels do so in their argument checks).
  template <typename T> T* data() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  Device device() const { return device_; }
  int rank() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return NumElements(shape_); }
  int64_t nbytes() const { return numel() * SizeOf(dtype_); }
  bool is_contiguous() const;
  bool empty() const { return data_ == nullptr && numel() != 0; }

  // Same memory, new shape; requires a contiguous view and the same element count.
  absl::StatusOr<TensorView> Reshape(Shape shape) const;
  // Rows [begin, end) of dim 0 (contiguous if this view is).
  absl::StatusOr<TensorView> Slice0(int64_t begin, int64_t end) const;

  // "bf16[16384,2048]@cuda:0"
  std::string ToString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Strides strides_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized contiguous memory from AllocatorFor(device).
  static absl::StatusOr<Tensor> Empty(Shape shape, DType dtype, Device device);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a tensor is usable as its view
  template <typename T> T* data() const { return view_.data<T>(); }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  Device device() const { return view_.device(); }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return storage_ != nullptr || view_.numel() == 0; }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copies `src` to `dst` (same dtype and element count, both contiguous), across devices if needed,
// ordered on `stream` (host<->device copies are asynchronous only for pinned host memory).
absl::Status CopyTensor(const TensorView& src, const TensorView& dst, const Stream& stream);
// CopyTensor without its synchronization: the copy is only queued on `stream`, also when one side is
// host memory, so it can overlap compute and be captured into a CUDA graph. The host side must be
// pinned (cudaHostAlloc) for the copy to be asynchronous, and the caller orders every host access
// after it (an event). CPU to CPU: a plain copy, done on return.
absl::Status CopyTensorAsync(const TensorView& src, const TensorView& dst, const Stream& stream);

// Fills `dst` with the bytes 0x00 (zeros) on its device, ordered on `stream`.
absl::Status ZeroTensor(const TensorView& dst, const Stream& stream);

// Checks that a kernel argument has the expected dtype, device and shape; the error names `what`
// and both sides ("rmsnorm weight: expected bf16[2048]@cuda:0, found f32[2048]@cuda:0").
absl::Status ExpectTensor(const TensorView& t, absl::string_view what, DType dtype, const Shape& shape,
                          Device device);

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_TENSOR_H_
