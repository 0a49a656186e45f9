// Per-device implementations behind embedding.h; arguments are already checked by embedding.cc.
#ifndef SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
#define SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::embedding_internal {

struct Problem {
  int64_t tokens = 0;  // number of token ids
  int64_t vocab = 0;
  int64_t dim = 0;
  DType dtype = DType::kF32;      // table / out / dout
  bool tokens_i64 = false;
};

void ForwardCpu(const Problem& p, const void* tokens, const void* table, void* out);
void BackwardCpu(const Problem& p, const void* dout, const void* tokens, float* dtable);

absl::Status ForwardCuda(const Problem& p, const void* tokens, const void* table, void* out, void* stream);
absl::Status BackwardCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                          void* stream);

}  // namespace sg::kernels::embedding_internal

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
