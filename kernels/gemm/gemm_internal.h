// Per-device implementations behind gemm.h; arguments are already checked by gemm.cc.
#ifndef SGTRAIN_KERNELS_GEMM_GEMM_INTERNAL_H_
#define SGTRAIN_KERNELS_GEMM_GEMM_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::gemm_internal {

// One row-major matrix operand of a (batched) problem: element strides, last dimension contiguous.
struct Matrix {
  const void* data = nullptr;
  int64_t rows = 0;  // as stored (before any transpose)
  int64_t cols = 0;
  int64_t ld = 0;            // elements between consecutive rows, >= cols
  int64_t batch_stride = 0;  // elements between batch entries; 0 = shared by every entry
};

// d = alpha * row_scale * (op(a) @ op(b)) + beta * c + bias, in the user's row-major terms.
struct Problem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType ab_dtype = DType::kF32;
  DType d_dtype = DType::kF32;
  bool trans_a = false, trans_b = false;
  Matrix a, b, c, d;  // c.data == d.data for in-place accumulation; c.data == nullptr when beta == 0
  float alpha = 1.0f, beta = 0.0f;
  const void* bias = nullptr;        // [n], d_dtype
  const float* row_scale = nullptr;  // [m], f32
  bool row_scale_in_epilogue = true;
  bool tuned = false;  // pick the algorithm by autotuning (GemmAlgo resolved by gemm.cc)
  int sm_count = 0;    // GemmArgs::sm_count
};

void GemmCpu(const Problem& p);

absl::Status GemmCuda(const Problem& p, int device, void* stream);
void ResetAlgoCacheCuda();
std::string DescribeAlgoCuda(const std::string& variant);

// CUDA: d[b, i, :] *= scale[i] in place, for the row-scale fallback (gemm.cu).
absl::Status ScaleRowsCuda(void* d, DType dtype, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                           int64_t batch_stride, const float* scale, void* stream);

}  // namespace sg::kernels::gemm_internal

#endif  // SGTRAIN_KERNELS_GEMM_GEMM_INTERNAL_H_
