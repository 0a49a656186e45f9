// The probe of attention_wgmma_probe.h: one block of the v5 backward's two warpgroups running the
// kernel's own phase functions (attention_bwd_v5.cuh, attention_wgmma.cuh) on given tiles.
#include "kernels/attention/attention_wgmma_probe.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_bwd_v5.cuh"
#include "kernels/core/device.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_wgmma.cuh"
#include "kernels/core/status.h"

namespace sg::kernels::internal {
namespace attention_device {
namespace {

template <int kD>
struct ProbeConfig {
  using C = BwdV5Config<kD>;
  static constexpr int kSmemBytes = C::kKvBytes + C::kQBytes + C::kDsBytes + C::kDqBytes + 1024;
};

template <int kD>
__global__ void __launch_bounds__(256, 1)
    WgmmaBwdProbeKernel(const bf16* __restrict__ k, const bf16* __restrict__ q, float* __restrict__ st,
                        float* __restrict__ pv, float* __restrict__ dq_tile) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = BwdV5Config<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const base = smem + (1024 - SmemAddr(smem) % 1024) % 1024;
  const uint32_t sk = SmemAddr(base), sq = sk + C::kKvBytes, sds = sq + C::kQBytes;
  float* const s_dq = reinterpret_cast<float*>(base + C::kKvBytes + C::kQBytes + C::kDsBytes);
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int key_row = 64 * wg + 16 * warp + lane / 4;

  LoadSwizzled<kBlockN, kD, 256>(sk, k, kD, kBlockN);
  LoadSwizzled<kBlockM, kD, 256>(sq, q, kD, kBlockM);
  CpAsyncCommit();
  CpAsyncWait<0>();
  FenceProxyAsyncShared();
  __syncthreads();

  float s[kBlockM / 2];
#pragma unroll
  for (int i = 0; i < kBlockM / 2; ++i) s[i] = 0.f;
  IssueQK<bf16, kD, kBlockN, kBlockM>(s, sk + wg * 64 * 128, sq);
  WgmmaWait<0>();
  FenceOperands(s);
#pragma unroll
  for (int i = 0; i < kBlockM / 2; ++i) {
    st[(key_row + 8 * ((i / 2) % 2)) * kBlockM + 8 * (i / 4) + 2 * (lane % 4) + i % 2] = s[i];
  }

  uint32_t pp[kBlockM / 16][4];
  PackP<bf16, kBlockM>(pp, s);
  float acc[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) acc[i] = 0.f;
  IssuePV<bf16, kD, kBlockM>(acc, pp, sq);
  WgmmaWait<0>();
  FenceOperands(acc);
  FenceOperands(pp);
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) {
    pv[(key_row + 8 * ((i / 2) % 2)) * kD + 8 * (i / 4) + 2 * (lane % 4) + i % 2] = acc[i];
  }

  StoreDsT<kBlockM, kBlockN>(sds, pp, key_row, lane);
  FenceProxyAsyncShared();
  __syncthreads();
  float dq[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = 0.f;
  IssueDq<bf16, kD, kBlockM, kBlockN>(dq, sds, sk, wg);
  WgmmaWait<0>();
  FenceOperands(dq);
  StoreDq<kD, kBlockM>(s_dq, dq, wg, warp, lane);
  __syncthreads();
  for (int i = threadIdx.x; i < kBlockM * kD; i += 256) dq_tile[i] = s_dq[i];
#else
  __trap();  // wgmma needs sm_90a; RunWgmmaBwdProbeCuda launches this kernel only there
#endif
}

template <int kD>
absl::Status Launch(const void* k, const void* q, float* st, float* pv, float* dq_tile,
                    cudaStream_t stream) {
  constexpr int kSmem = ProbeConfig<kD>::kSmemBytes;
  SG_RETURN_IF_ERROR(AllowSmem(WgmmaBwdProbeKernel<kD>, kSmem));
  WgmmaBwdProbeKernel<kD><<<1, 256, kSmem, stream>>>(static_cast<const bf16*>(k),
                                                      static_cast<const bf16*>(q), st, pv, dq_tile);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(WgmmaBwdProbeKernel);
  return absl::OkStatus();
}

}  // namespace
}  // namespace attention_device

absl::Status RunWgmmaBwdProbeCuda(int head_dim, const void* k, const void* q, float* st, float* pv,
                                  float* dq_tile, void* stream) {
  SG_RETURN_IF_ERROR(RequireSm90("wgmma probe"));
  SG_CHECK_ARG(head_dim == 64 || head_dim == 128, "wgmma probe: head_dim 64 or 128, found ", head_dim);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return head_dim == 64 ? attention_device::Launch<64>(k, q, st, pv, dq_tile, s)
                        : attention_device::Launch<128>(k, q, st, pv, dq_tile, s);
}

}  // namespace sg::kernels::internal
