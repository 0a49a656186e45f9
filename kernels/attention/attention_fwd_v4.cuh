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

// attention_fwd_v4_wgmma.cu: either variant. Unimplemented on GPUs other than sm_90. dtype: kBF16 or
// kF16. kWarpSpecialized falls back to kWgmma where LaunchForwardV4Ws is Unimplemented.
absl::Status LaunchForwardV4Wgmma(FwdV4Variant variant, DType dtype, const Problem& pr, int head_dim,
                                  int batch, const void* q, const void* k, const void* v, void* out,
                                  float* lse, cudaStream_t stream);

// attention_fwd_v4_ws.cu: the warp-specialized forward "ws", bf16 or f16, on an sm_90 GPU (the
// caller checks). Unimplemented when q, k or v is not 16-byte aligned (TMA) or the driver has no
// tensor-map encoder.
absl::Status LaunchForwardV4Ws(DType dtype, const Problem& pr, int head_dim, int batch,
                               const void* q, const void* k, const void* v, void* out, float* lse,
                               cudaStream_t stream);

}  // namespace sg::kernels::internal::attention_device

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_FWD_V4_CUH_
