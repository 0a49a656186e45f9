// CPU reference for the fused cross-entropy: f64 per row (max, sum of exp, log-sum-exp), rows over
// the thread pool, each row's loss rounded to f32 (as the CUDA kernels store it), the mean summed in
// f64 in row order.
#include <cmath>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/cross_entropy/cross_entropy_internal.h"

namespace sg::kernels::cross_entropy_internal {
namespace {

template <typename I>
int64_t Count(const Problem& p, const I* targets) {
  int64_t count = 0;
  for (int64_t r = 0; r < p.rows; ++r) count += int64_t(targets[r]) != p.ignore_index;
  return count;
}

// Row r's loss (0 when ignored) rounded to f32, as the CUDA kernels store it, and its dlogits.
template <typename T, typename I>
void Rows(const Problem& p, const T* logits, const I* targets, int64_t count, float* row_loss, T* dlogits) {
  const double grad_scale = double(p.grad_scale) * (p.grad_scale_from != nullptr ? *p.grad_scale_from : 1.f);
  const double scale = count > 0 ? grad_scale / double(count) : 0.0;
  ParallelFor(p.rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = logits + r * p.vocab;
      const int64_t t = int64_t(targets[r]);
      const bool ignored = t == p.ignore_index;
      double m = -INFINITY;
      for (int64_t j = 0; j < p.vocab; ++j) m = std::max(m, double(ToFloat(x[j])));
      double s = 0;
      for (int64_t j = 0; j < p.vocab; ++j) s += std::exp(double(ToFloat(x[j])) - m);
      const double lse = m + std::log(s);
      row_loss[r] = ignored ? 0.f : float(lse - double(ToFloat(x[t])));
      if (dlogits == nullptr) continue;
      T* g = dlogits + r * p.vocab;  // may be x: each element is read before it is written
      for (int64_t j = 0; j < p.vocab; ++j) {
        const double soft = std::exp(double(ToFloat(x[j])) - lse);
        g[j] = FromFloat<T>(ignored ? 0.f : float(scale * (soft - (j == t ? 1.0 : 0.0))));
      }
    }
  });
}

template <typename T, typename I>
void RowsTyped(const Problem& p, const void* logits, const void* targets, int64_t count, float* row_loss,
               void* dlogits) {
  Rows(p, static_cast<const T*>(logits), static_cast<const I*>(targets), count, row_loss, static_cast<T*>(dlogits));
}

template <typename I>
void RowsAnyDType(const Problem& p, const void* logits, const void* targets, int64_t count, float* row_loss,
                  void* dlogits) {
  if (p.dtype == DType::kBF16) {
    RowsTyped<BFloat16, I>(p, logits, targets, count, row_loss, dlogits);
  } else if (p.dtype == DType::kF16) {
    RowsTyped<Half, I>(p, logits, targets, count, row_loss, dlogits);
  } else {
    RowsTyped<float, I>(p, logits, targets, count, row_loss, dlogits);
  }
}

}  // namespace

void CountCpu(const Problem& p, const void* targets, int32_t* valid) {
  *valid = int32_t(p.targets_i64 ? Count(p, static_cast<const int64_t*>(targets))
                                 : Count(p, static_cast<const int32_t*>(targets)));
}

void RowsCpu(const Problem& p, const void* logits, const void* targets, const int32_t* valid, float* row_loss,
             void* dlogits) {
  if (p.targets_i64) {
    RowsAnyDType<int64_t>(p, logits, targets, *valid, row_loss, dlogits);
  } else {
    RowsAnyDType<int32_t>(p, logits, targets, *valid, row_loss, dlogits);
  }
}

void FinishCpu(int64_t rows, const float* row_loss, const int32_t* valid, float* loss) {
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum += double(row_loss[r]);
  *loss = *valid > 0 ? float(sum / double(*valid)) : 0.f;
}

void RunCpu(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid, void* dlogits) {
  std::vector<float> row_loss(static_cast<size_t>(p.rows));
  CountCpu(p, targets, valid);
  RowsCpu(p, logits, targets, valid, row_loss.data(), dlogits);
  FinishCpu(p.rows, row_loss.data(), valid, loss);
}

}  // namespace sg::kernels::cross_entropy_internal
