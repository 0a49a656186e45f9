// The program's device memory and its accessors by name (declared in lowering.h): what a
// runtime uses to write parameters and batches into a lowered program and read results back.
#include <utility>

#include "absl/strings/str_cat.h"
#include "compiler/lowering.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"

namespace sg::compiler {

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(Device device, int64_t bytes) {
  SG_ASSIGN_OR_RETURN(Allocator * a, AllocatorFor(device));
  DeviceMemory m;
  m.device_ = device;
  m.bytes_ = bytes;
  if (bytes > 0) {
    SG_ASSIGN_OR_RETURN(m.ptr_, a->Allocate(bytes));
  }
  return m;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    this->~DeviceMemory();
    device_ = o.device_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ == nullptr) return;
  auto a = AllocatorFor(device_);
  if (a.ok()) (*a)->Free(ptr_);
  ptr_ = nullptr;
}

absl::StatusOr<TensorView> FindSourceOrOutput(const Program& program, const std::string& name,
                                              absl::string_view owner) {
  if (auto s = program.sources.find(name); s != program.sources.end()) return s->second;
  if (auto o = program.outputs.find(name); o != program.outputs.end()) return o->second;
  return absl::NotFoundError(absl::StrCat(owner, " has no source or output named '", name, "'"));
}

namespace {

absl::Status CheckSameElements(const std::string& what, const TensorView& dev, const TensorView& other) {
  if (dev.dtype() != other.dtype() || dev.numel() != other.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", DTypeName(dev.dtype()),
                                                   ShapeToString(dev.shape()), ", found ", other.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSource(const Program& program, const std::string& name, absl::string_view owner,
                         const TensorView& src, const Stream& stream) {
  auto s = program.sources.find(name);
  if (s == program.sources.end()) {
    return absl::NotFoundError(absl::StrCat(owner, " has no source named '", name, "'"));
  }
  SG_RETURN_IF_ERROR(CheckSameElements(absl::StrCat("Write '", name, "'"), s->second, src));
  SG_ASSIGN_OR_RETURN(TensorView dst, s->second.Reshape(src.shape()));
  SG_RETURN_IF_ERROR(CopyTensor(src, dst, stream));
  for (const auto& [master, copy] : program.weight_copies) {
    if (master.raw() == dst.raw()) SG_RETURN_IF_ERROR(kernels::Cast(master, copy, stream));
  }
  return absl::OkStatus();
}

absl::Status ReadSourceOrOutput(const Program& program, const std::string& name, absl::string_view owner,
                                const TensorView& dst, const Stream& stream) {
  SG_ASSIGN_OR_RETURN(TensorView v, FindSourceOrOutput(program, name, owner));
  // A 16-bit value (e.g. a bf16 gradient, CompileOptions::bf16_gradients) read into f32 host memory
  // is widened: copied as it is, then cast on the host.
  if ((v.dtype() == DType::kBF16 || v.dtype() == DType::kF16) && dst.dtype() == DType::kF32 && dst.device().is_cpu() &&
      v.numel() == dst.numel()) {
    SG_ASSIGN_OR_RETURN(Tensor staged, Tensor::Empty(dst.shape(), v.dtype(), Device::Cpu()));
    SG_ASSIGN_OR_RETURN(TensorView src, v.Reshape(dst.shape()));
    SG_RETURN_IF_ERROR(CopyTensor(src, staged.view(), stream));
    return kernels::Cast(staged.view(), dst, Stream::Cpu());
  }
  SG_RETURN_IF_ERROR(CheckSameElements(absl::StrCat("Read '", name, "'"), v, dst));
  SG_ASSIGN_OR_RETURN(TensorView src, v.Reshape(dst.shape()));
  return CopyTensor(src, dst, stream);
}

}  // namespace sg::compiler
