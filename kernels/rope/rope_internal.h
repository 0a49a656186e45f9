// Per-device implementations behind rope.h; arguments are already checked by rope.cc.
#ifndef SGTRAIN_KERNELS_ROPE_ROPE_INTERNAL_H_
#define SGTRAIN_KERNELS_ROPE_ROPE_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::rope_internal {

struct Problem {
  int64_t batch = 0, seq = 0;
  int64_t q_heads = 0, k_heads = 0;  // k_heads == 0: q only
  int64_t head_dim = 0;
  DType dtype = DType::kF32;
  float theta = 10000.f;
  float sign = 1.f;  // +1 forward, -1 backward
  int64_t offset = 0;
  const void* positions = nullptr;  // i32 or i64; [seq] or [batch, seq]
  bool positions_i64 = false;
  bool positions_per_batch = false;
  const float* cos = nullptr;  // tables [table_rows, head_dim / 2], or null
  const float* sin = nullptr;
  int64_t table_rows = 0;
};

struct Buffers {
  const void* q;
  const void* k;
  void* q_out;
  void* k_out;
};

void ApplyCpu(const Problem& p, const Buffers& b);
void TableCpu(float theta, int64_t rows, int64_t half, float* cos, float* sin);

absl::Status ApplyCuda(const Problem& p, const Buffers& b, void* stream);
absl::Status TableCuda(float theta, int64_t rows, int64_t half, float* cos, float* sin, void* stream);

}  // namespace sg::kernels::rope_internal

#endif  // SGTRAIN_KERNELS_ROPE_ROPE_INTERNAL_H_
