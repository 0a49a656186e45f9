// Test support for kernels/attention (not part of the library): runs the wgmma building blocks of
// the v5 backward (attention_bwd_v5.cuh) once, on one block, so that an operand-layout mistake is
// pinpointed by attention_wgmma_probe_test rather than only seen as a wrong gradient.
//
//   // k: bf16 [128][head_dim], q: bf16 [WgmmaProbeQueries(head_dim)][head_dim] (device memory)
//   SG_RETURN_IF_ERROR(RunWgmmaBwdProbeCuda(64, k, q, st, pv, dq_tile, stream));
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_WGMMA_PROBE_H_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_WGMMA_PROBE_H_

#include "absl/status/status.h"
#include "kernels/attention/attention_tiling.h"

namespace sg::kernels::internal {

// The probe's sizes: the v5 backward's key block and query tile at this head dim.
constexpr int kWgmmaProbeKeys = kBwdV3BlockN;
constexpr int WgmmaProbeQueries(int head_dim) { return BwdV3BlockM(head_dim); }

// With N = kWgmmaProbeKeys keys and M = WgmmaProbeQueries(head_dim) queries, all row-major and
// contiguous (device pointers; k, q bf16, the rest f32):
//   st[N][M]        = k q^T                    (IssueQK with the keys as M: S^T = K Q^T)
//   pv[N][head_dim] = bf16(st) q               (PackP, IssuePV: dV += P^T dO, q standing for dO)
//   dq_tile         = bf16(st)^T k as the f32 dQ tile [M][head_dim] in the DqSwizzle layout
//                     (StoreDsT, IssueDq with the transposed-A descriptor, StoreDq)
// head_dim 64 or 128. Unimplemented on GPUs other than sm_90 (wgmma).
absl::Status RunWgmmaBwdProbeCuda(int head_dim, const void* k, const void* q, float* st, float* pv,
                                  float* dq_tile, void* stream);

}  // namespace sg::kernels::internal

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_WGMMA_PROBE_H_
