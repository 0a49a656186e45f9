// Per-device implementations behind adamw.h; arguments are already checked by adamw.cc.
#ifndef SGTRAIN_KERNELS_ADAMW_ADAMW_INTERNAL_H_
#define SGTRAIN_KERNELS_ADAMW_ADAMW_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace sg::kernels::adamw_internal {

// One parameter as the kernels see it. Stored in an i64 tensor (9 words each).
struct Descriptor {
  float* param;
  void* grad;
  float* m;
  float* v;
  uint16_t* param_copy;  // bf16 or f16 bits (copy_f16), or null
  int64_t numel;
  int64_t first_chunk;
  float weight_decay;
  int32_t grad_bf16;  // 1: bf16 gradient, 0: f32
  int32_t vec;        // 1: every pointer 16-byte aligned (float4 path)
  int32_t copy_f16;   // 1: param_copy is f16, 0: bf16
};
static_assert(sizeof(Descriptor) % 8 == 0, "Descriptor is stored as int64 words");
constexpr int64_t kDescriptorWords = int64_t(sizeof(Descriptor) / 8);

struct Lists {
  const Descriptor* desc;
  const int32_t* chunk_tensor;
  int64_t chunks;
  int64_t chunk;  // elements per chunk
};

struct Hyper {
  float beta1, beta2, eps;
  const float* lr;
  const void* step;
  bool step_i64;
  const float* grad_scale;  // or null
};

// The loss scaler's one-element f32 values (adamw.h's UpdateLossScale); step may be null.
struct ScalerValues {
  float* norm;
  float* grad_scale;
  float* scale;
  float* good_steps;
  float* skipped;
  float* step;
};
struct ScalerConfig {
  float max_norm, backoff, growth, min_scale;
  int64_t growth_interval;
};

void StepCpu(const Lists& l, const Hyper& h);
void UpdateLossScaleCpu(const ScalerConfig& c, const ScalerValues& v);
void GradNormCpu(const Lists& l, float max_norm, float* norm, float* clip);
void ScaleGradsCpu(const Lists& l, const float* scale);

absl::Status StepCuda(const Lists& l, const Hyper& h, void* stream);
// scratch: l.chunks floats, or null for a block of the caching allocator.
absl::Status GradNormCuda(const Lists& l, float max_norm, float* norm, float* clip, float* scratch, int device,
                          void* stream);
absl::Status ScaleGradsCuda(const Lists& l, const float* scale, void* stream);
absl::Status UpdateLossScaleCuda(const ScalerConfig& c, const ScalerValues& v, void* stream);

}  // namespace sg::kernels::adamw_internal

#endif  // SGTRAIN_KERNELS_ADAMW_ADAMW_INTERNAL_H_
