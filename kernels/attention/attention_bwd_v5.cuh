// Internal to kernels/attention (nvcc only): the tile configuration and the wgmma phases of the v5
// backward (attention_bwd_v5.cu), in a header so that the building-block probe
// (attention_wgmma_probe.cu, a GPU unit test) runs exactly the code the kernel runs.
//
// Per block: kBlockN = 128 keys (warpgroup wg owns keys [64 wg, 64 wg + 64)), query tiles of
// kBlockM rows. Keys are the M dimension of the first products, so P^T and dS^T sit in registers
// as accumulators and become the A operands (PackP) of dV += P^T dO and dK += dS^T Q.
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_BWD_V5_CUH_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_BWD_V5_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_tiling.h"
#include "kernels/attention/attention_wgmma.cuh"

namespace sg::kernels::internal::attention_device {

template <int kDim>
struct BwdV5Config {
  static constexpr int kD = kDim, kThreads = 256;  // two warpgroups
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128 (whole 64-column swizzle blocks)");
  static constexpr int kBlockN = kBwdV3BlockN;     // keys per block: 64 per warpgroup
  static constexpr int kBlockM = BwdV3BlockM(kD);  // queries per iteration: 128 at D64, 64 at D128
  static_assert(kBlockN == 128, "two warpgroups of 64 keys (m64 wgmma)");
  static_assert(kBlockM == 64 || kBlockM == 128, "query tiles: the N of m64n{64,128} S^T = K Q^T");
  static_assert(kDqAccumRowAlign % kBlockM == 0, "the dq workspace pads rows to whole tiles");
  // dQ = dS K, kBlockM x kD, is two 64 x 64 products, one per warpgroup: split by query rows at
  // D64 (kBlockM 128), by head_dim columns at D128 (kBlockM 64).
  static constexpr int kDqRowBlocks = kBlockM / 64, kDqColBlocks = kD / 64;
  static_assert(kDqRowBlocks * kDqColBlocks == 2, "one 64 x 64 dQ block per warpgroup");
  // Shared memory (all swizzled tiles 1024-byte aligned): K, V; Q and dO in 2 stages each; dS^T
  // [kBlockN][kBlockM]; the f32 dQ tile (one bulk reduction); lse and delta, 2 stages each.
  static constexpr int kKvBytes = kBlockN * kD * 2, kQBytes = kBlockM * kD * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2, kDqBytes = kBlockM * kD * 4;
  static constexpr int kStatBytes = 4 * kBlockM * 4;
  static constexpr int kSmemBytes =
      2 * kKvBytes + 4 * kQBytes + kDsBytes + kDqBytes + kStatBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Stores this warpgroup's dS^T (its 64 keys x kBlockM queries, as the T A fragments of dK += dS^T
// Q) into the swizzled [kBlockN keys][kBlockM queries] tile: fragment (kk, i) is the query chunk
// j = 2 kk + i / 2 (queries 8 j + 2 (lane % 4), + 1) of key row key_row + 8 (i % 2). One 4-byte
// store each; the 8 rows of a warp's store are 8 distinct swizzle chunks, so it is conflict-free.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ void StoreDsT(uint32_t ds_tile, const uint32_t (&ds)[kBlockM / 16][4],
                                         int key_row, int lane) {
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = key_row + 8 * (i % 2), chunk = 2 * kk + i / 2;
      const uint32_t dst = ds_tile + (chunk / 8) * (kBlockN * 128) + row * 128 +
                           (((chunk % 8) ^ (row % 8)) * 16) + 4 * (lane % 4);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(ds[kk][i]) : "memory");
    }
  }
}

// Issues this warpgroup's 64 x 64 block of dQ (unscaled) = dS K over the kBlockN keys as one wgmma
// group (dq is overwritten). A = dS read from the dS^T tile through an MN-major descriptor (queries
// run along its rows); B = K through an MN-major descriptor (head_dim runs along its rows), as V in
// the forward's P V. k16 step kk: keys 16 kk.., +2048 bytes in both tiles.
template <typename T, int kD, int kBlockM, int kBlockN>
__device__ __forceinline__ void IssueDq(float (&dq)[32], uint32_t ds_tile, uint32_t k_tile, int wg) {
  const int row_block = kBlockM == 128 ? wg : 0, col_block = kBlockM == 128 ? 0 : wg;
  const uint32_t a0 = ds_tile + row_block * (kBlockN * 128), b0 = k_tile + col_block * (kBlockN * 128);
  FenceOperands(dq);
  WgmmaFence();
  const uint64_t a_base = Sw128Desc(a0, kBlockN * 128, 1024), b_base = Sw128Desc(b0, kBlockN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t a_desc = Sw128DescAdvance(a_base, kk * 16 * 128);
    const uint64_t b_desc = Sw128DescAdvance(b_base, kk * 16 * 128);
    WgmmaSS64<T, 1, 1>(dq, a_desc, b_desc, kk > 0);
  }
  WgmmaCommit();
}

// Writes this warpgroup's dQ block into the f32 dQ tile [kBlockM][kD] (DqSwizzle layout).
template <int kD, int kBlockM>
__device__ __forceinline__ void StoreDq(float* s_dq, const float (&dq)[32], int wg, int warp, int lane) {
  const int row_block = kBlockM == 128 ? wg : 0, col_block = kBlockM == 128 ? 0 : wg;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int row = 64 * row_block + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
    const int col = 64 * col_block + 8 * (i / 4) + 2 * (lane % 4);
    *reinterpret_cast<float2*>(s_dq + DqSwizzle<kD>(row, col)) = make_float2(dq[i], dq[i + 1]);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sg::kernels::internal::attention_device

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_BWD_V5_CUH_
