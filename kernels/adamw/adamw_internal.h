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
  uint16_t* param_copy;  // bf16 bits, or null
  int64_t numel;
  int64_t first_chunk;
  float weight_decay;
  int32_t grad_bf16;  // 1: bf16 gradient, 0: f32
  int32_t vec;        // 1: every pointer 16-byte aligned (float4 path)
  int32_t pad;
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

void StepCpu(const Lists& l, const Hyper& h);
void GradNormCpu(const Lists& l, float max_norm, float* norm, float* clip);
void ScaleGradsCpu(const Lists& l, const float* scale);

absl::Status StepCuda(const Lists& l, const Hyper& h, void* stream);
absl::Status GradNormCuda(const Lists& l, float max_norm, float* norm, float* clip, int device, void* stream);
absl::Status ScaleGradsCuda(const Lists& l, const float* scale, void* stream);

}  // namespace sg::kernels::adamw_internal

#endif  // SGTRAIN_KERNELS_ADAMW_ADAMW_INTERNAL_H_
