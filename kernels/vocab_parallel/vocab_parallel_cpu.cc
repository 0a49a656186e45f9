// CPU reference for the vocabulary-parallel kernels: f64 per row, rows over the thread pool, the
// mean summed in row order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/vocab_parallel/vocab_parallel_internal.h"

namespace sg::kernels::vocab_parallel_internal {
namespace {

int64_t Id(const void* ids, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(ids)[i] : int64_t(static_cast<const int32_t*>(ids)[i]);
}

template <typename T>
void Stats(const CeProblem& p, const T* logits, const void* targets, float* stats) {
  ParallelFor(p.rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = logits + r * p.local_vocab;
      double m = -INFINITY, s = 0, t = 0;
      for (int64_t j = 0; j < p.local_vocab; ++j) m = std::max(m, double(ToFloat(x[j])));
      for (int64_t j = 0; j < p.local_vocab; ++j) s += std::exp(double(ToFloat(x[j])) - m);
      const int64_t local = Id(targets, p.targets_i64, r) - p.vocab_start;
      if (local >= 0 && local < p.local_vocab) t = double(ToFloat(x[local]));
      stats[r] = float(m);
      stats[p.rows + r] = float(s);
      stats[2 * p.rows + r] = float(t);
    }
  });
}

template <typename T>
void Finish(const CeProblem& p, const T* logits, const void* targets, const float* gathered, const float* dloss,
            float* loss, T* dlogits) {
  int64_t count = 0;
  for (int64_t r = 0; r < p.rows; ++r) count += Id(targets, p.targets_i64, r) != p.ignore_index;
  const double scale = count > 0 ? double(dloss != nullptr ? *dloss : 1.f) / double(count) : 0.0;
  std::vector<double> row_loss(size_t(p.rows), 0.0);
  ParallelFor(p.rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double m = -INFINITY, s = 0, t = 0;
      for (int64_t k = 0; k < p.ranks; ++k) m = std::max(m, double(gathered[(k * 3) * p.rows + r]));
      for (int64_t k = 0; k < p.ranks; ++k) {
        const double mk = gathered[(k * 3) * p.rows + r];
        if (mk > -INFINITY) s += double(gathered[(k * 3 + 1) * p.rows + r]) * std::exp(mk - m);
        t += gathered[(k * 3 + 2) * p.rows + r];
      }
      const double lse = m + std::log(s);
      const int64_t target = Id(targets, p.targets_i64, r);
      const bool ignored = target == p.ignore_index;
      if (!ignored) row_loss[size_t(r)] = lse - t;
      if (dlogits == nullptr) continue;
      const T* x = logits + r * p.local_vocab;
      T* g = dlogits + r * p.local_vocab;  // may be x: each element is read before it is written
      for (int64_t j = 0; j < p.local_vocab; ++j) {
        const double soft = std::exp(double(ToFloat(x[j])) - lse);
        const double hot = p.vocab_start + j == target ? 1.0 : 0.0;
        g[j] = FromFloat<T>(ignored ? 0.f : float(scale * (soft - hot)));
      }
    }
  });
  double sum = 0;
  for (double l : row_loss) sum += l;
  *loss = count > 0 ? float(sum / double(count)) : 0.f;
}

template <typename T>
void EmbedForward(int64_t n, bool i64, const void* ids, int64_t local_vocab, int64_t dim, int64_t start,
                  const T* table, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = Id(ids, i64, i) - start;
    T* o = out + i * dim;
    if (v >= 0 && v < local_vocab) {
      std::memcpy(o, table + v * dim, size_t(dim) * sizeof(T));
    } else {
      std::fill(o, o + dim, FromFloat<T>(0.f));
    }
  }
}

template <typename T>
void EmbedBackward(int64_t n, bool i64, const void* ids, int64_t local_vocab, int64_t dim, int64_t start, const T* dout,
                   float* dtable) {
  std::fill(dtable, dtable + local_vocab * dim, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = Id(ids, i64, i) - start;
    if (v < 0 || v >= local_vocab) continue;
    for (int64_t d = 0; d < dim; ++d) dtable[v * dim + d] += ToFloat(dout[i * dim + d]);
  }
}

}  // namespace

void StatsCpu(const CeProblem& p, const void* logits, const void* targets, float* stats) {
  if (p.dtype == DType::kBF16) {
    Stats(p, static_cast<const BFloat16*>(logits), targets, stats);
  } else {
    Stats(p, static_cast<const float*>(logits), targets, stats);
  }
}

void FinishCpu(const CeProblem& p, const void* logits, const void* targets, const float* gathered, const float* dloss,
               float* loss, void* dlogits) {
  if (p.dtype == DType::kBF16) {
    Finish(p, static_cast<const BFloat16*>(logits), targets, gathered, dloss, loss, static_cast<BFloat16*>(dlogits));
  } else {
    Finish(p, static_cast<const float*>(logits), targets, gathered, dloss, loss, static_cast<float*>(dlogits));
  }
}

void EmbeddingForwardCpu(int64_t tokens, bool i64, const void* ids, int64_t local_vocab, int64_t dim, DType dtype,
                         int64_t vocab_start, const void* table, void* out) {
  if (dtype == DType::kBF16) {
    EmbedForward(tokens, i64, ids, local_vocab, dim, vocab_start, static_cast<const BFloat16*>(table),
                 static_cast<BFloat16*>(out));
  } else {
    EmbedForward(tokens, i64, ids, local_vocab, dim, vocab_start, static_cast<const float*>(table),
                 static_cast<float*>(out));
  }
}

void EmbeddingBackwardCpu(int64_t tokens, bool i64, const void* ids, int64_t local_vocab, int64_t dim, DType dtype,
                          int64_t vocab_start, const void* dout, float* dtable) {
  if (dtype == DType::kBF16) {
    EmbedBackward(tokens, i64, ids, local_vocab, dim, vocab_start, static_cast<const BFloat16*>(dout), dtable);
  } else {
    EmbedBackward(tokens, i64, ids, local_vocab, dim, vocab_start, static_cast<const float*>(dout), dtable);
  }
}

}  // namespace sg::kernels::vocab_parallel_internal
