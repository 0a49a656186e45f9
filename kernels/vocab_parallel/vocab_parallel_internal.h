// Per-device implementations behind vocab_parallel.h; arguments are already checked.
#ifndef SGTRAIN_KERNELS_VOCAB_PARALLEL_VOCAB_PARALLEL_INTERNAL_H_
#define SGTRAIN_KERNELS_VOCAB_PARALLEL_VOCAB_PARALLEL_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::vocab_parallel_internal {

struct CeProblem {
  int64_t rows = 0, local_vocab = 0, vocab_start = 0, ranks = 1;
  DType dtype = DType::kF32;
  bool targets_i64 = false;
  int64_t ignore_index = -100;
};

void StatsCpu(const CeProblem& p, const void* logits, const void* targets, float* stats);
// dloss / dlogits may be null.
void FinishCpu(const CeProblem& p, const void* logits, const void* targets, const float* gathered, const float* dloss,
               float* loss, void* dlogits);
void EmbeddingForwardCpu(int64_t tokens, bool i64, const void* ids, int64_t local_vocab, int64_t dim, DType dtype,
                         int64_t vocab_start, const void* table, void* out);
void EmbeddingBackwardCpu(int64_t tokens, bool i64, const void* ids, int64_t local_vocab, int64_t dim, DType dtype,
                          int64_t vocab_start, const void* dout, float* dtable);

absl::Status StatsCuda(const CeProblem& p, const void* logits, const void* targets, float* stats, int device,
                       void* stream);
absl::Status FinishCuda(const CeProblem& p, const void* logits, const void* targets, const float* gathered,
                        const float* dloss, float* loss, void* dlogits, int device, void* stream);
// local[i] = ids[i] - vocab_start when in [0, local_vocab), else -1 (i32).
absl::Status ShiftIdsCuda(int64_t tokens, bool i64, const void* ids, int64_t vocab_start, int64_t local_vocab,
                          int32_t* local, void* stream);

}  // namespace sg::kernels::vocab_parallel_internal

#endif  // SGTRAIN_KERNELS_VOCAB_PARALLEL_VOCAB_PARALLEL_INTERNAL_H_
