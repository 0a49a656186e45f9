#include "kernels/adamw/adamw.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/adamw/adamw_internal.h"
#include "kernels/core/status.h"

namespace sg::kernels {
namespace {

using adamw_internal::Descriptor;

bool Present(const TensorView& t) { return t.raw() != nullptr; }
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

[[maybe_unused]] absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": CUDA tensors given to a build without CUDA"));
}

absl::Status CheckScalar(const char* op, const char* what, const TensorView& t, std::initializer_list<DType> dtypes,
                         Device device) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok |= t.dtype() == d;
  SG_CHECK_ARG(Present(t) && t.numel() == 1 && t.rank() <= 1 && dtype_ok && t.device() == device, op, ": ", what,
               " must be a one-element ", DTypeName(*dtypes.begin()), dtypes.size() > 1 ? " (or i64)" : "",
               " tensor on ", device.ToString(), ", found ", t.ToString());
  return absl::OkStatus();
}

adamw_internal::Lists ListsOf(const AdamWTensorList& l) {
  return {static_cast<const Descriptor*>(l.descriptors()), l.chunk_tensor(), l.chunks(), AdamWTensorList::kChunk};
}

}  // namespace

absl::StatusOr<AdamWTensorList> AdamWTensorList::Create(const std::vector<AdamWParam>& params) {
  SG_CHECK_ARG(!params.empty(), "AdamWTensorList: no parameters given");
  AdamWTensorList list;
  list.device_ = params[0].param.device();
  std::vector<Descriptor> desc;
  std::vector<double> chunk_tensor;
  for (size_t i = 0; i < params.size(); ++i) {
    const AdamWParam& p = params[i];
    const std::string what = absl::StrCat("AdamWTensorList parameter ", i);
    SG_CHECK_ARG(p.param.dtype() == DType::kF32 && p.param.is_contiguous() && p.param.numel() > 0 &&
                     p.param.device() == list.device_,
                 what, ": param must be non-empty contiguous f32 on ", list.device_.ToString(), ", found ",
                 p.param.ToString());
    SG_CHECK_ARG((p.grad.dtype() == DType::kF32 || p.grad.dtype() == DType::kBF16) && p.grad.is_contiguous() &&
                     p.grad.numel() == p.param.numel() && p.grad.device() == list.device_,
                 what, ": grad must be contiguous f32 or bf16 with ", p.param.numel(), " elements on ",
                 list.device_.ToString(), ", found ", p.grad.ToString());
    SG_RETURN_IF_ERROR(ExpectTensor(p.m, what + " m", DType::kF32, p.param.shape(), list.device_));
    SG_RETURN_IF_ERROR(ExpectTensor(p.v, what + " v", DType::kF32, p.param.shape(), list.device_));
    if (Present(p.param_copy)) {
      const DType copy = p.param_copy.dtype() == DType::kF16 ? DType::kF16 : DType::kBF16;
      SG_RETURN_IF_ERROR(ExpectTensor(p.param_copy, what + " param_copy", copy, p.param.shape(), list.device_));
    }
    Descriptor d{};
    d.param = p.param.data<float>();
    d.grad = p.grad.raw();
    d.m = p.m.data<float>();
    d.v = p.v.data<float>();
    d.param_copy = Present(p.param_copy) ? p.param_copy.data<uint16_t>() : nullptr;
    d.numel = p.param.numel();
    d.first_chunk = list.chunks_;
    d.weight_decay = p.weight_decay;
    d.grad_bf16 = p.grad.dtype() == DType::kBF16;
    d.copy_f16 = Present(p.param_copy) && p.param_copy.dtype() == DType::kF16;
    d.vec = Aligned16(d.param) && Aligned16(d.grad) && Aligned16(d.m) && Aligned16(d.v) &&
            (d.param_copy == nullptr || Aligned16(d.param_copy));
    const int64_t chunks = (d.numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) chunk_tensor.push_back(double(i));
    list.chunks_ += chunks;
    list.numel_ += d.numel;
    desc.push_back(d);
  }
  SG_CHECK_ARG(params.size() < (size_t(1) << 31), "AdamWTensorList: too many parameters: ", params.size());
  // The descriptors travel as raw int64 words.
  const int64_t words = int64_t(desc.size()) * adamw_internal::kDescriptorWords;
  SG_ASSIGN_OR_RETURN(Tensor host_desc, Tensor::Empty({words}, DType::kI64, Device::Cpu()));
  std::memcpy(host_desc.view().raw(), desc.data(), desc.size() * sizeof(Descriptor));
  SG_ASSIGN_OR_RETURN(Tensor host_chunks, Tensor::Empty({list.chunks_}, DType::kI32, Device::Cpu()));
  for (int64_t c = 0; c < list.chunks_; ++c) host_chunks.data<int32_t>()[c] = int32_t(chunk_tensor[size_t(c)]);
  if (list.device_.is_cpu()) {
    list.descriptors_ = host_desc;
    list.chunk_tensor_ = host_chunks;
    return list;
  }
  SG_ASSIGN_OR_RETURN(list.descriptors_, Tensor::Empty({words}, DType::kI64, list.device_));
  SG_ASSIGN_OR_RETURN(list.chunk_tensor_, Tensor::Empty({list.chunks_}, DType::kI32, list.device_));
  SG_RETURN_IF_ERROR(CopyTensor(host_desc, list.descriptors_, Stream::Cpu()));
  SG_RETURN_IF_ERROR(CopyTensor(host_chunks, list.chunk_tensor_, Stream::Cpu()));
  return list;
}

absl::Status AdamWStep(const AdamWTensorList& list, const AdamWConfig& config, const TensorView& lr,
                       const TensorView& step, const TensorView& grad_scale, const Stream& stream) {
  const char* op = "AdamWStep";
  SG_RETURN_IF_ERROR(CheckScalar(op, "lr", lr, {DType::kF32}, list.device()));
  SG_RETURN_IF_ERROR(CheckScalar(op, "step", step, {DType::kI32, DType::kI64}, list.device()));
  if (Present(grad_scale)) SG_RETURN_IF_ERROR(CheckScalar(op, "grad_scale", grad_scale, {DType::kF32}, list.device()));
  SG_CHECK_ARG(config.beta1 >= 0 && config.beta1 < 1 && config.beta2 >= 0 && config.beta2 < 1 && config.eps > 0, op,
               ": need 0 <= beta1, beta2 < 1 and eps > 0, found beta1 ", config.beta1, " beta2 ", config.beta2, " eps ",
               config.eps);
  const adamw_internal::Hyper h{config.beta1, config.beta2, config.eps, lr.data<float>(), step.raw(),
                                step.dtype() == DType::kI64,
                                Present(grad_scale) ? grad_scale.data<float>() : nullptr};
  if (list.device().is_cpu()) {
    adamw_internal::StepCpu(ListsOf(list), h);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return adamw_internal::StepCuda(ListsOf(list), h, stream.native());
#else
  return NoCuda(op);
#endif
}

absl::Status GradNorm(const AdamWTensorList& list, float max_norm, const TensorView& norm,
                      const TensorView& clip_scale, const Stream& stream, const TensorView& scratch) {
  SG_RETURN_IF_ERROR(CheckScalar("GradNorm", "norm", norm, {DType::kF32}, list.device()));
  if (Present(scratch) && (scratch.dtype() != DType::kF32 || scratch.numel() < list.chunks() ||
                           !(scratch.device() == list.device()))) {
    return absl::InvalidArgumentError(absl::StrCat("GradNorm: scratch must be f32 with at least ", list.chunks(),
                                                   " elements on ", list.device().ToString(), ", found ",
                                                   scratch.ToString()));
  }
  if (Present(clip_scale)) SG_RETURN_IF_ERROR(CheckScalar("GradNorm", "clip_scale", clip_scale, {DType::kF32}, list.device()));
  float* clip = Present(clip_scale) ? clip_scale.data<float>() : nullptr;
  if (list.device().is_cpu()) {
    adamw_internal::GradNormCpu(ListsOf(list), max_norm, norm.data<float>(), clip);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return adamw_internal::GradNormCuda(ListsOf(list), max_norm, norm.data<float>(), clip,
                                      Present(scratch) ? scratch.data<float>() : nullptr, list.device().ordinal,
                                      stream.native());
#else
  return NoCuda("GradNorm");
#endif
}

absl::Status ScaleGrads(const AdamWTensorList& list, const TensorView& scale, const Stream& stream) {
  SG_RETURN_IF_ERROR(CheckScalar("ScaleGrads", "scale", scale, {DType::kF32}, list.device()));
  if (list.device().is_cpu()) {
    adamw_internal::ScaleGradsCpu(ListsOf(list), scale.data<float>());
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return adamw_internal::ScaleGradsCuda(ListsOf(list), scale.data<float>(), stream.native());
#else
  return NoCuda("ScaleGrads");
#endif
}

absl::Status UpdateLossScale(const LossScaleConfig& config, const TensorView& norm, const TensorView& grad_scale,
                             const TensorView& scale, const TensorView& good_steps, const TensorView& skipped,
                             const TensorView& step, const Stream& stream) {
  const char* op = "UpdateLossScale";
  const Device d = norm.device();
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"norm", &norm}, {"grad_scale", &grad_scale},
                                {"scale", &scale}, {"good_steps", &good_steps}, {"skipped", &skipped}}) {
    SG_RETURN_IF_ERROR(CheckScalar(op, name, *t, {DType::kF32}, d));
  }
  if (Present(step)) SG_RETURN_IF_ERROR(CheckScalar(op, "step", step, {DType::kF32}, d));
  SG_CHECK_ARG(config.backoff > 0 && config.backoff < 1 && config.growth > 1 && config.growth_interval >= 1 &&
                   config.min_scale > 0,
               op, ": need 0 < backoff < 1, growth > 1, growth_interval >= 1 and min_scale > 0, found backoff ",
               config.backoff, " growth ", config.growth, " growth_interval ", config.growth_interval, " min_scale ",
               config.min_scale);
  const adamw_internal::ScalerConfig c{config.max_norm, config.backoff, config.growth, config.min_scale,
                                       config.growth_interval};
  const adamw_internal::ScalerValues v{norm.data<float>(), grad_scale.data<float>(), scale.data<float>(),
                                       good_steps.data<float>(), skipped.data<float>(),
                                       Present(step) ? step.data<float>() : nullptr};
  if (d.is_cpu()) {
    adamw_internal::UpdateLossScaleCpu(c, v);
    return absl::OkStatus();
  }
#ifdef SG_WITH_CUDA
  return adamw_internal::UpdateLossScaleCuda(c, v, stream.native());
#else
  return NoCuda(op);
#endif
}

}  // namespace sg::kernels
