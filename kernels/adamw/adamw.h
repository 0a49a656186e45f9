// Fused multi-tensor AdamW, global gradient norm and clipping: one launch updates every parameter,
// reading the learning rate, step and gradient scale from device memory so a captured CUDA graph
// can replay the optimizer step without host work.
//
//   SG_ASSIGN_OR_RETURN(auto list, sg::kernels::AdamWTensorList::Create(params));  // once
//   SG_RETURN_IF_ERROR(sg::kernels::GradNorm(list, /*max_norm=*/1.f, norm, clip, stream));
//   SG_RETURN_IF_ERROR(sg::kernels::AdamWStep(list, {0.9f, 0.95f, 1e-8f}, lr, step, clip, stream));
//
// Per element (PyTorch's AdamW), with t = *step + 1, g = grad * (*grad_scale):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// and the optional bf16 or f16 copy of p is written in the same pass. f32 arithmetic throughout.
// A non-finite *grad_scale skips the step: parameters, moments and step are left unchanged (the
// dynamic loss scaler's overflow signal, UpdateLossScale below).
#ifndef SGTRAIN_KERNELS_ADAMW_ADAMW_H_
#define SGTRAIN_KERNELS_ADAMW_ADAMW_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::kernels {

// One parameter tensor and its optimizer state, all with the same element count on one device.
struct AdamWParam {
  TensorView param;       // f32 master weights, updated in place
  TensorView grad;        // f32 or bf16
  TensorView m, v;        // f32 moments, updated in place
  TensorView param_copy;  // optional bf16 or f16 copy of param (default-constructed: none)
  float weight_decay = 0.f;  // decoupled; 0 for norms and biases by convention
};

// The device-resident descriptor table for a fixed set of parameters: build once, reuse every
// step (graph-replay safe: it never changes). The tensors' memory must outlive the list.
class AdamWTensorList {
 public:
  // InvalidArgument names the parameter index and the mismatching tensor.
  static absl::StatusOr<AdamWTensorList> Create(const std::vector<AdamWParam>& params);

  Device device() const { return device_; }
  int64_t numel() const { return numel_; }     // elements over all parameters
  int64_t chunks() const { return chunks_; }   // work units of kChunk elements
  static constexpr int64_t kChunk = 65536;

  // Descriptors and chunk table (device memory for CUDA lists, host memory for CPU lists).
  const void* descriptors() const { return descriptors_.view().raw(); }
  const int32_t* chunk_tensor() const { return chunk_tensor_.data<int32_t>(); }

 private:
  Device device_;
  int64_t numel_ = 0, chunks_ = 0;
  Tensor descriptors_, chunk_tensor_;
};

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
};

// lr: f32 one element. step: i32 or i64 one element, the number of completed steps; the update
// uses t = step + 1 and then stores t (a second, one-thread launch on `stream`). grad_scale:
// optional f32 one element multiplying every gradient (e.g. GradNorm's clip factor, or 1/loss-scale);
// default-constructed for none.
absl::Status AdamWStep(const AdamWTensorList& list, const AdamWConfig& config, const TensorView& lr,
                       const TensorView& step, const TensorView& grad_scale, const Stream& stream);

// norm = sqrt(sum of grad^2 over every tensor), deterministic (per-chunk partial sums in a fixed
// order, then one block summing them in chunk order). If clip_scale is given (f32 one element) it
// receives min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0), ready for AdamWStep/ScaleGrads.
// The partial sums take list.chunks() floats: from `scratch` when given (f32, at least that many,
// on the list's device), else a block of the device's caching allocator, which hands blocks back
// out in one stream's order; so a norm on another stream than compute passes its own scratch.
absl::Status GradNorm(const AdamWTensorList& list, float max_norm, const TensorView& norm,
                      const TensorView& clip_scale, const Stream& stream, const TensorView& scratch = TensorView());

// grad *= *scale for every gradient in the list (clipping applied to the gradients themselves).
absl::Status ScaleGrads(const AdamWTensorList& list, const TensorView& scale, const Stream& stream);

// Dynamic loss scaling (f16 mixed precision, as torch.cuda.amp.GradScaler) decided on the device,
// so a captured step replays it. Run after GradNorm over gradients of a loss multiplied by *scale
// and before AdamWStep(..., grad_scale):
//   norm /= *scale (the unscaled norm);
//   finite: grad_scale = min(1, max_norm / (norm + 1e-6)) / *scale (1 for max_norm <= 0: no
//     clipping), skipped = 0, good_steps += 1, and after growth_interval good steps in a row
//     *scale *= growth (kept when that overflows f32), good_steps = 0;
//   non-finite: grad_scale = NaN (AdamWStep then skips the update), skipped = 1, good_steps = 0,
//     *scale = max(*scale * backoff, min_scale), and *step -= 1 when step is given (a step counter
//     the runtime advanced before it knew the step would be skipped).
// Every tensor: f32 one element on one device (step optional). One thread, one launch.
struct LossScaleConfig {
  float max_norm = 0.f;
  float backoff = 0.5f, growth = 2.f, min_scale = 1.f;
  int64_t growth_interval = 2000;
};
absl::Status UpdateLossScale(const LossScaleConfig& config, const TensorView& norm, const TensorView& grad_scale,
                             const TensorView& scale, const TensorView& good_steps, const TensorView& skipped,
                             const TensorView& step, const Stream& stream);

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_ADAMW_ADAMW_H_
