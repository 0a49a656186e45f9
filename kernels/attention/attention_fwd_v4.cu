// CUDA flash attention forward, family v4 (experiment, SG_ATTENTION_KERNEL=v4): launch-config
// variants of the mma.sync forward, picked by SG_ATTN_FWD_VARIANT (FwdV4Variant in
// attention_internal.h), for issue #4 (v3's D128 causal forward was 0.92x SDPA flash on an H200).
// The wgmma variant lives in attention_fwd_v4_wgmma.cu.
//
// One kernel template, MmaFwdKernel<Config>, with these switches against v2/v3's kernel:
// - kWarps x kMTiles: 4 warps x 32 rows (v2's layout: each K/V fragment feeds two MMAs) or 8
//   warps x 16 rows (less register pressure per thread: Q can stay in registers at D128, or two
//   blocks of 8 warps fit per SM, 4 warps per scheduler to hide the softmax behind MMAs).
// - kBlockN: 64 or 128 keys per tile (fewer barriers and softmax reductions per key).
// - kSplitKV: K and V in separate cp.async groups; the QK^T of tile t waits for K(t) only and the
//   PV for V(t), at the price of a second barrier per tile.
// - kLazyRescale: the running output is rescaled only when some row's max changed (a warp vote);
//   after the first few tiles of a row it rarely does.
// - kFold: the scale is folded into the exponent (one FFMA per score, max on raw scores), which
//   needs scale > 0 (the dispatch runs v3 otherwise).
// Grid order as v3: (head, query tile heaviest first, batch).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_fwd_v4.cuh"
#include "kernels/attention/attention_tiling.h"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kDim, int kWarpCount, int kRowTiles, int kKeys, int kStageCount, bool kQRegs,
          bool kSplit, bool kLazy, bool kFoldScale, int kBlocksPerSm>
struct MmaFwdConfig {
  static constexpr int kD = kDim, kWarps = kWarpCount, kMTiles = kRowTiles, kBlockN = kKeys;
  static constexpr int kStages = kStageCount, kMinBlocks = kBlocksPerSm;
  static constexpr bool kQInRegs = kQRegs, kSplitKV = kSplit, kLazyRescale = kLazy, kFold = kFoldScale;
  static constexpr int kThreads = kWarps * 32, kBlockM = kWarps * kMTiles * 16;
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  static_assert(kBlockN % 16 == 0, "key tiles are whole k16 steps of P V");
  static_assert(kStages >= 2, "the ring needs a stage to compute on and one in flight");
  using QTile = SmemTile<kBlockM, kD>;
  using KvTile = SmemTile<kBlockN, kD>;
  static constexpr int kSmemBytes = (QTile::kElems + 2 * kStages * KvTile::kElems) * int(sizeof(bf16));
  static_assert(kSmemBytes * kMinBlocks <= 227 * 1024, "shared memory for kMinBlocks blocks per SM");
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    MmaFwdKernel(Problem pr, const bf16* __restrict__ q, const bf16* __restrict__ k,
                 const bf16* __restrict__ v, bf16* __restrict__ out, float* __restrict__ lse) {
  constexpr int kD = C::kD, kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages;
  constexpr int kMTiles = C::kMTiles;
  using KvTile = typename C::KvTile;
  extern __shared__ __align__(16) unsigned char smem[];
  const typename C::QTile sq{reinterpret_cast<bf16*>(smem)};
  bf16* const k_stages = sq.p + C::QTile::kElems;  // stage s at k_stages + s * KvTile::kElems
  bf16* const v_stages = k_stages + kStages * KvTile::kElems;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m_block = pr.causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);
  const int h = blockIdx.x, b = blockIdx.z, kh = h / (pr.heads / pr.kv_heads);
  const int m0 = m_block * kBlockM;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const bf16* q_base = q + (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
  const bf16* k_base = k + int64_t(b) * pr.seq_k * k_row + kh * kD;
  const bf16* v_base = v + int64_t(b) * pr.seq_k * k_row + kh * kD;

  const int n_end = VisibleKeyEnd(min(m0 + kBlockM, pr.seq_q), pr.seq_k, pr.causal, pr.q_minus_k);
  const int n_tiles = (n_end + kBlockN - 1) / kBlockN;

  // Commit groups: Q, then per key tile K and V (split) or K+V (joint), empty past the end, so the
  // waits below count a fixed number of newer groups.
  sq.template Load<C::kThreads>(q_base, q_row, pr.seq_q - m0);
  CpAsyncCommit();
  auto load_kv = [&](int t) {
    if (t < n_tiles) {
      const int n = t * kBlockN, stage = t % kStages;
      KvTile{k_stages + stage * KvTile::kElems}.template Load<C::kThreads>(k_base + n * k_row, k_row, pr.seq_k - n);
      if constexpr (C::kSplitKV) CpAsyncCommit();
      KvTile{v_stages + stage * KvTile::kElems}.template Load<C::kThreads>(v_base + n * k_row, k_row, pr.seq_k - n);
    } else if constexpr (C::kSplitKV) {
      CpAsyncCommit();
    }
    CpAsyncCommit();
  };
  constexpr int kGroupsPerTile = C::kSplitKV ? 2 : 1;
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) load_kv(t);

  const int row0 = warp * 16 * kMTiles;  // this warp's first row within the tile
  uint32_t qf[kMTiles][C::kQInRegs ? kD / 16 : 1][4];
  if constexpr (C::kQInRegs) {
    CpAsyncWait<kGroupsPerTile * (kStages - 1)>();  // the Q group
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) LoadA(qf[mt][kk], sq, row0 + 16 * mt, kk * 16, lane);
    }
  }

  float o[kMTiles][kD / 8][4] = {};
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const int first_row = m0 + row0 + lane / 4;  // rows of this thread: first_row + 16 mt + 8 r

  for (int t = 0; t < n_tiles; ++t) {
    // K(t) (and with joint groups V(t)) landed; every thread is done with tile t - 1, whose
    // stage the copy below refills.
    CpAsyncWait<kGroupsPerTile * (kStages - 1) - 1>();
    __syncthreads();
    load_kv(t + kStages - 1);
    const int stage = t % kStages, n0 = t * kBlockN;
    const KvTile sk{k_stages + stage * KvTile::kElems}, sv{v_stages + stage * KvTile::kElems};

    // S = Q K^T: each K fragment feeds every m-tile of the warp.
    float s[kMTiles][kBlockN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (C::kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = qf[mt][kk][i];
        } else {
          LoadA(a[mt], sq, row0 + 16 * mt, kk * 16, lane);
        }
      }
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t bk[4];
        LoadBNk(bk, sk, nn * 16, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(s[mt][2 * nn], a[mt], bk[0], bk[1]);
          Mma(s[mt][2 * nn + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // Mask keys past the end and (causal) after the query; without kFold, into the log2 domain.
    const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (!C::kFold) s[mt][nt][e] *= pr.scale_log2;
          if (need_mask) {
            const int col = n0 + nt * 8 + 2 * (lane % 4) + (e & 1);
            const int row = first_row + 16 * mt + (e >= 2 ? 8 : 0);
            if (col >= pr.seq_k || (pr.causal && int64_t(col) > row + pr.q_minus_k)) {
              s[mt][nt][e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax in the log2 domain. alpha = 2^(old max - new max) is 1 where the max did not
    // change; kLazyRescale skips a row half's O rescale when that holds for the whole warp.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt) {
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        }
        mx = QuadMax(mx);
        // With kFold s are raw scores and c > 0 maps their max to the log2 domain's.
        mx = fmaxf(row_max[mt][r], C::kFold ? mx * pr.scale_log2 : mx);
        const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: keep 2^x finite
        const bool changed = mx != row_max[mt][r];
        const float alpha = changed ? FastExp2(row_max[mt][r] - m_use) : 1.f;
        row_max[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt) {
          if constexpr (C::kFold) {
            s[mt][nt][2 * r] = FastExp2(fmaf(s[mt][nt][2 * r], pr.scale_log2, -m_use));
            s[mt][nt][2 * r + 1] = FastExp2(fmaf(s[mt][nt][2 * r + 1], pr.scale_log2, -m_use));
          } else {
            s[mt][nt][2 * r] = FastExp2(s[mt][nt][2 * r] - m_use);
            s[mt][nt][2 * r + 1] = FastExp2(s[mt][nt][2 * r + 1] - m_use);
          }
          sum += s[mt][nt][2 * r] + s[mt][nt][2 * r + 1];
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;  // per-thread partial; quad-reduced at the end
        if (!C::kLazyRescale || __any_sync(0xffffffffu, changed)) {
#pragma unroll
          for (int dt = 0; dt < kD / 8; ++dt) {
            o[mt][dt][2 * r] *= alpha;
            o[mt][dt][2 * r + 1] *= alpha;
          }
        }
      }
    }

    if constexpr (C::kSplitKV) {  // V(t) landed (the newer groups are tiles t+1 .. t+kStages-1)
      CpAsyncWait<2 * (kStages - 1)>();
      __syncthreads();
    }

    // O += P V: each V fragment feeds every m-tile of the warp.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) AccToA(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < kD / 16; ++dd) {
        uint32_t bv[4];
        LoadBKn(bv, sv, kk * 16, dd * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(o[mt][2 * dd], a[mt], bv[0], bv[1]);
          Mma(o[mt][2 * dd + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }
  CpAsyncWait<0>();  // with no key tiles the Q copy (by all threads) may still be in flight
  __syncthreads();

  // Normalize and stage this warp's rows in its own rows of the Q tile (only this warp reads them),
  // then write them out with coalesced 16-byte stores. lse as v2 (natural log, [b, h, row]).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = QuadSum(row_sum[mt][r]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = first_row + 16 * mt + 8 * r;
      if (lane % 4 == 0 && row < pr.seq_q) {
        lse[(int64_t(b) * pr.heads + h) * pr.seq_q + row] =
            l > 0.f ? (row_max[mt][r] + __log2f(l)) * kLn2 : -INFINITY;
      }
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(sq.at(row - m0, dt * 8 + 2 * (lane % 4))) =
            PackBf16(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      }
    }
  }
  __syncwarp();
  bf16* out_base = out + (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
  constexpr int kChunksPerRow = kD / 8, kWarpRows = 16 * kMTiles;
#pragma unroll
  for (int i = lane; i < kWarpRows * kChunksPerRow; i += 32) {
    const int r = row0 + i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
    if (m0 + r < pr.seq_q) {
      *reinterpret_cast<uint4*>(out_base + r * q_row + col) = *reinterpret_cast<const uint4*>(sq.at(r, col));
    }
  }
}

template <class C>
absl::Status LaunchMma(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                       void* out, float* lse, cudaStream_t stream) {
  const int m_blocks = (pr.seq_q + C::kBlockM - 1) / C::kBlockM;
  SG_CHECK_ARG(m_blocks <= 65535, "attention v4 forward: at most 65535 query tiles of ", C::kBlockM,
               " rows, found seq_q ", pr.seq_q);
  SG_RETURN_IF_ERROR(AllowSmem(MmaFwdKernel<C>, C::kSmemBytes));
  MmaFwdKernel<C><<<dim3(pr.heads, m_blocks, batch), C::kThreads, C::kSmemBytes, stream>>>(
      pr, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<bf16*>(out), lse);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(MmaFwdKernel);
  return absl::OkStatus();
}

// The configurations, per head dim. Shared memory per block (D128 / D64) in the comments; all
// fit the block count given as the last argument.
//            D   warps rows/16 keys stages Qregs split lazy fold blocks/SM
// k4x32:  v2's layout, split K/V waits, lazy rescale, folded scale (104 KB / 72 KB).
template <int kD>
using Cfg4x32 = MmaFwdConfig<kD, 4, 2, 64, kD == 64 ? 3 : 2, kD == 64, true, true, true, 2>;
// k4x32j: as k4x32 with one cp.async group and one barrier per tile.
template <int kD>
using Cfg4x32j = MmaFwdConfig<kD, 4, 2, 64, kD == 64 ? 3 : 2, kD == 64, false, true, true, 2>;
// k8x16q: Q in registers, 128-key tiles, one block of 8 warps per SM (174 KB / 88 KB).
template <int kD>
using Cfg8x16q = MmaFwdConfig<kD, 8, 1, 128, 2, true, true, true, true, 1>;
// k8x16: Q from shared memory, 64-key tiles, two blocks of 8 warps per SM (104 KB / 54 KB).
template <int kD>
using Cfg8x16 = MmaFwdConfig<kD, 8, 1, 64, 2, false, true, true, true, 2>;

template <template <int> class Cfg>
absl::Status LaunchFor(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                       const void* v, void* out, float* lse, cudaStream_t stream) {
  if (head_dim == 64) return LaunchMma<Cfg<64>>(pr, batch, q, k, v, out, lse, stream);
  return LaunchMma<Cfg<128>>(pr, batch, q, k, v, out, lse, stream);
}

}  // namespace

absl::Status LaunchForwardV4Mma(FwdV4Variant variant, const Problem& pr, int head_dim, int batch,
                                const void* q, const void* k, const void* v, void* out, float* lse,
                                cudaStream_t stream) {
  switch (variant) {
    case FwdV4Variant::k4x32:
      return LaunchFor<Cfg4x32>(pr, head_dim, batch, q, k, v, out, lse, stream);
    case FwdV4Variant::k4x32j:
      return LaunchFor<Cfg4x32j>(pr, head_dim, batch, q, k, v, out, lse, stream);
    case FwdV4Variant::k8x16q:
      return LaunchFor<Cfg8x16q>(pr, head_dim, batch, q, k, v, out, lse, stream);
    case FwdV4Variant::k8x16:
      return LaunchFor<Cfg8x16>(pr, head_dim, batch, q, k, v, out, lse, stream);
    default:
      return absl::InvalidArgumentError("attention v4 forward: not an mma.sync variant");
  }
}

}  // namespace sg::kernels::internal::attention_device
