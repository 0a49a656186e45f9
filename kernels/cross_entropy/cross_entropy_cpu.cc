// CPU reference for the fused cross-entropy: f64 per row (max, sum of exp, log-sum-exp), rows over
// the thread pool, the mean summed in row order.
#include <cmath>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/cross_entropy/cross_entropy_internal.h"

namespace sg::kernels::cross_entropy_internal {
namespace {

template <typename T, typename I>
void Run(const Problem& p, const T* logits, const I* targets, float* loss, int32_t* valid, T* dlogits) {
  int64_t count = 0;
  for (int64_t r = 0; r < p.rows; ++r) count += int64_t(targets[r]) != p.ignore_index;
  const double from = p.grad_scale_from != nullptr ? double(*p.grad_scale_from) : 1.0;
  const double scale = count > 0 ? double(p.grad_scale) * from / double(count) : 0.0;
  std::vector<double> row_loss(static_cast<size_t>(p.rows), 0.0);
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
      if (!ignored) row_loss[size_t(r)] = lse - double(ToFloat(x[t]));
      if (dlogits == nullptr) continue;
      T* g = dlogits + r * p.vocab;  // may be x: each element is read before it is written
      for (int64_t j = 0; j < p.vocab; ++j) {
        const double soft = std::exp(double(ToFloat(x[j])) - lse);
        g[j] = FromFloat<T>(ignored ? 0.f : float(scale * (soft - (j == t ? 1.0 : 0.0))));
      }
    }
  });
  double sum = 0;
  for (double l : row_loss) sum += l;
  *loss = count > 0 ? float(sum / double(count)) : 0.f;
  *valid = int32_t(count);
}

template <typename T>
void RunTyped(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid, void* dlogits) {
  if (p.targets_i64) {
    Run(p, static_cast<const T*>(logits), static_cast<const int64_t*>(targets), loss, valid, static_cast<T*>(dlogits));
  } else {
    Run(p, static_cast<const T*>(logits), static_cast<const int32_t*>(targets), loss, valid, static_cast<T*>(dlogits));
  }
}

}  // namespace

void RunCpu(const Problem& p, const void* logits, const void* targets, float* loss, int32_t* valid, void* dlogits) {
  if (p.dtype == DType::kBF16) {
    RunTyped<BFloat16>(p, logits, targets, loss, valid, dlogits);
  } else {
    RunTyped<float>(p, logits, targets, loss, valid, dlogits);
  }
}

}  // namespace sg::kernels::cross_entropy_internal
