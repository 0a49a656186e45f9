// CPU reference for the embedding: a row copy forward; the backward sums rows in f32 in token order
// (the order the CUDA kernel uses), with column ranges spread over the thread pool.
#include <algorithm>
#include <cstring>

#include "kernels/core/dtype.h"
#include "kernels/core/parallel.h"
#include "kernels/embedding/embedding_internal.h"

namespace sg::kernels::embedding_internal {
namespace {

template <typename I>
int64_t Id(const void* tokens, int64_t i) {
  return int64_t(static_cast<const I*>(tokens)[i]);
}

int64_t IdAt(const Problem& p, const void* tokens, int64_t i) {
  return p.tokens_i64 ? Id<int64_t>(tokens, i) : Id<int32_t>(tokens, i);
}

template <typename T>
void Backward(const Problem& p, const T* dout, const void* tokens, float* dtable) {
  std::memset(dtable, 0, size_t(p.vocab * p.dim) * sizeof(float));
  ParallelFor(p.dim, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < p.tokens; ++i) {
      float* row = dtable + IdAt(p, tokens, i) * p.dim;
      const T* src = dout + i * p.dim;
      for (int64_t c = c0; c < c1; ++c) row[c] += ToFloat(src[c]);
    }
  });
}

}  // namespace

void ForwardCpu(const Problem& p, const void* tokens, const void* table, void* out) {
  const size_t row_bytes = size_t(p.dim * SizeOf(p.dtype));
  ParallelFor(p.tokens, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      std::memcpy(static_cast<char*>(out) + i * row_bytes,
                  static_cast<const char*>(table) + IdAt(p, tokens, i) * row_bytes, row_bytes);
    }
  });
}

void BackwardCpu(const Problem& p, const void* dout, const void* tokens, float* dtable) {
  if (p.dtype == DType::kBF16) {
    Backward(p, static_cast<const BFloat16*>(dout), tokens, dtable);
  } else if (p.dtype == DType::kF16) {
    Backward(p, static_cast<const Half*>(dout), tokens, dtable);
  } else {
    Backward(p, static_cast<const float*>(dout), tokens, dtable);
  }
}

}  // namespace sg::kernels::embedding_internal
