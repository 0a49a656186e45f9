// Per-device implementations behind elementwise.h; arguments are already checked by elementwise.cc.
#ifndef SGTRAIN_KERNELS_ELEMENTWISE_ELEMENTWISE_INTERNAL_H_
#define SGTRAIN_KERNELS_ELEMENTWISE_ELEMENTWISE_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::elementwise_internal {

// out = alpha * a + beta * b (b unused when beta == 0 and b == nullptr): covers add, scale, axpy.
struct Axpby {
  int64_t n = 0;
  DType dtype = DType::kF32;
  float alpha = 1, beta = 1;
};

void AxpbyCpu(const Axpby& p, const void* a, const void* b, void* out);
void CastCpu(int64_t n, DType from, DType to, const void* src, void* out);
void FillCpu(int64_t n, DType dtype, float value, void* out);
void SumRowsCpu(int64_t rows, int64_t cols, DType dtype, const void* x, float* out);

absl::Status AxpbyCuda(const Axpby& p, const void* a, const void* b, void* out, void* stream);
absl::Status CastCuda(int64_t n, DType from, DType to, const void* src, void* out, void* stream);
absl::Status FillCuda(int64_t n, DType dtype, float value, void* out, void* stream);
absl::Status SumRowsCuda(int64_t rows, int64_t cols, DType dtype, const void* x, float* out, int device,
                         void* stream);

}  // namespace sg::kernels::elementwise_internal

#endif  // SGTRAIN_KERNELS_ELEMENTWISE_ELEMENTWISE_INTERNAL_H_
