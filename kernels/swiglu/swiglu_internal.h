// Per-device implementations behind swiglu.h; arguments are already checked by swiglu.cc.
#ifndef SGTRAIN_KERNELS_SWIGLU_SWIGLU_INTERNAL_H_
#define SGTRAIN_KERNELS_SWIGLU_SWIGLU_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::swiglu_internal {

// `rows` rows of `cols` outputs. gate/up (and dgate/dup) rows are `in_stride` elements apart: cols
// for separate tensors, 2 * cols for the packed form (up = gate + cols). out/dout rows are `cols` apart.
struct Problem {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t in_stride = 0;
  DType dtype = DType::kF32;
};

void ForwardCpu(const Problem& p, const void* gate, const void* up, void* out);
void BackwardCpu(const Problem& p, const void* dout, const void* gate, const void* up, void* dgate, void* dup);

absl::Status ForwardCuda(const Problem& p, const void* gate, const void* up, void* out, void* stream);
absl::Status BackwardCuda(const Problem& p, const void* dout, const void* gate, const void* up, void* dgate,
                          void* dup, void* stream);

}  // namespace sg::kernels::swiglu_internal

#endif  // SGTRAIN_KERNELS_SWIGLU_SWIGLU_INTERNAL_H_
