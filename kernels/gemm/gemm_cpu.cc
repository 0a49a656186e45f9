// CPU GEMM: Eigen's f32 kernel on row-major maps, blocks of output rows spread over the thread pool.
// bf16 operands are widened to f32 first (b once per batch entry, a one row block at a time), so the
// arithmetic is the same f32-accumulated product the GPU computes.
#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/gemm/gemm_internal.h"

namespace sg::kernels::gemm_internal {
namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMapF = Eigen::Map<const MatF, Eigen::Unaligned, Eigen::OuterStride<>>;

constexpr int64_t kRowsPerTask = 32;

// Rows [r0, r1) x cols [c0, c1) of a stored matrix, as f32 (widened into `buf` unless already f32).
template <typename T>
ConstMapF Block(const T* base, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                std::vector<float>& buf) {
  const int64_t rows = r1 - r0, cols = c1 - c0;
  if constexpr (std::is_same_v<T, float>) {
    return ConstMapF(base + r0 * ld + c0, rows, cols, Eigen::OuterStride<>(ld));
  } else {
    buf.resize(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = base + (r0 + r) * ld + c0;
      float* dst = buf.data() + r * cols;
      for (int64_t c = 0; c < cols; ++c) dst[c] = ToFloat(src[c]);
    }
    return ConstMapF(buf.data(), rows, cols, Eigen::OuterStride<>(cols));
  }
}

template <typename TAB, typename TD>
void Run(const Problem& p) {
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const TAB* a = static_cast<const TAB*>(p.a.data) + bi * p.a.batch_stride;
    const TAB* b = static_cast<const TAB*>(p.b.data) + bi * p.b.batch_stride;
    TD* d = const_cast<TD*>(static_cast<const TD*>(p.d.data)) + bi * p.d.batch_stride;
    const TD* c = p.c.data ? static_cast<const TD*>(p.c.data) + bi * p.c.batch_stride : nullptr;
    const TD* bias = static_cast<const TD*>(p.bias);
    std::vector<float> b_buf;
    const ConstMapF b_stored = Block(b, p.b.ld, 0, p.b.rows, 0, p.b.cols, b_buf);
    const int64_t tasks = (p.m + kRowsPerTask - 1) / kRowsPerTask;
    ParallelFor(tasks, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> a_buf;
      MatF acc;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r0 = t * kRowsPerTask, r1 = std::min(p.m, r0 + kRowsPerTask);
        // op(a)[r0:r1, :] is a row block of a, or a column block of a transposed.
        const ConstMapF a_blk = p.trans_a ? Block(a, p.a.ld, 0, p.k, r0, r1, a_buf)
                                          : Block(a, p.a.ld, r0, r1, 0, p.k, a_buf);
        if (p.trans_a && p.trans_b) {
          acc.noalias() = a_blk.transpose() * b_stored.transpose();
        } else if (p.trans_a) {
          acc.noalias() = a_blk.transpose() * b_stored;
        } else if (p.trans_b) {
          acc.noalias() = a_blk * b_stored.transpose();
        } else {
          acc.noalias() = a_blk * b_stored;
        }
        for (int64_t i = r0; i < r1; ++i) {
          const float scale = p.alpha * (p.row_scale ? p.row_scale[i] : 1.0f);
          for (int64_t j = 0; j < p.n; ++j) {
            float v = scale * acc(i - r0, j);
            if (c != nullptr) v += p.beta * ToFloat(c[i * p.c.ld + j]);
            if (bias != nullptr) v += ToFloat(bias[j]);
            d[i * p.d.ld + j] = FromFloat<TD>(v);
          }
        }
      }
    });
  }
}

}  // namespace

void GemmCpu(const Problem& p) {
  if (p.ab_dtype == DType::kF32) {
    Run<float, float>(p);
  } else if (p.ab_dtype == DType::kF16) {
    if (p.d_dtype == DType::kF32) {
      Run<Half, float>(p);
    } else {
      Run<Half, Half>(p);
    }
  } else if (p.d_dtype == DType::kF32) {
    Run<BFloat16, float>(p);
  } else {
    Run<BFloat16, BFloat16>(p);
  }
}

}  // namespace sg::kernels::gemm_internal
