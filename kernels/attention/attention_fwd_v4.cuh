// Internal to kernels/attention (nvcc only): the launchers of the v4 forward variants
// (attention_fwd_v4.h lists them). Arguments as LaunchForwardV2 in attention_device.cuh; the
// caller guarantees scale > 0 (the kernels take the row max on raw scores).
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_CUH_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_fwd_v4.h"

namespace sg::kernels::internal::attention_device {

// attention_fwd_v4.cu: the mma.sync variants (every variant but kWgmma).
absl::Status LaunchForwardV4Mma(FwdV4Variant variant, const Problem& pr, int head_dim, int batch,
                                const void* q, const void* k, const void* v, void* out, float* lse,
                                cudaStream_t stream);
// attention_fwd_v4_wgmma.cu: the wgmma variants (IsWgmma). Unimplemented on GPUs other than sm_90.
absl::Status LaunchForwardV4Wgmma(FwdV4Variant variant, const Problem& pr, int head_dim, int batch,
                                  const void* q, const void* k, const void* v, void* out,
                                  float* lse, cudaStream_t stream);

}  // namespace sg::kernels::internal::attention_device

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_CUH_
