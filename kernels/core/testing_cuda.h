// Internal to //kernels/core:testing: the device-side uniform fill behind RandomTensor, and the
// spinning kernel behind StreamHold.
#ifndef SGTRAIN_KERNELS_CORE_TESTING_CUDA_H_
#define SGTRAIN_KERNELS_CORE_TESTING_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::testing {

// Fills n elements at `data` (device memory) with values uniform in [-scale, scale), rounded to
// `dtype`, from a counter-based generator keyed by `seed`; synchronizes `stream` (a cudaStream_t).
absl::Status FillUniformCuda(void* data, DType dtype, int64_t n, uint64_t seed, float scale, void* stream);

// Enqueues on `stream` one thread that spins until *flag (host-mapped memory, written by the host)
// is nonzero or `limit_ns` of GPU time have passed.
absl::Status SpinUntilFlagCuda(const volatile int* flag, int64_t limit_ns, void* stream);

}  // namespace sg::testing

#endif  // SGTRAIN_KERNELS_CORE_TESTING_CUDA_H_
