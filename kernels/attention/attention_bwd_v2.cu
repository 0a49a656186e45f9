// CUDA flash attention backward, variant v2 (the default): FlashAttention-2's decomposition on
// mma.sync m16n8k16 bf16. The deleted v1 kept P^T and dS^T in the registers of the warp that computed them,
// which fixed every warp to 16 keys and every shared-memory fragment to feed two MMAs (0.58
// ldmatrix.x4 per MMA: shared-memory bound). Here P and dS go through shared memory, so each of
// the three products gets the warp tiling that suits it, with 32-row warp tiles (0.45 per MMA):
//
//   phase 1  S = Q K^T, dP = dO V^T       warps 2 (32 queries) x 4 (32 keys); P, dS -> smem
//   phase 2  dV += P^T dO, dK += dS^T Q   warps 4 (32 keys) x 2 (head_dim / 2); registers
//   phase 3  dQ += dS K                   warps 2 (32 queries) x 4 (head_dim / 4); f32 atomics
//
// One block of 8 warps per (128-key tile, kv head, batch) loops over the group's query heads and
// 64-query tiles (Q, dO, lse, delta in a 2-stage cp.async ring). dK and dV are summed in a fixed
// order in registers (deterministic); dQ partials are added to an f32 workspace with atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_tiling.h"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kD>
struct BwdV2Config {
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kBlockN = kBwdBlockN;  // keys per block
  static constexpr int kBlockM = kBwdBlockM;  // queries per iteration
  static_assert(kBlockM == 2 * 32 && kBlockN == 4 * 32, "phase tilings assume a 64 x 128 tile");
  static constexpr int kDvCols = kD / 2, kDqCols = kD / 4;  // per-warp columns in phases 2, 3
  static_assert(kDvCols % 16 == 0 && kDqCols % 16 == 0, "head_dim must split into 16-wide slices");
  using KvTile = SmemTile<kBlockN, kD>;
  using QTile = SmemTile<kBlockM, kD>;
  using PTile = SmemTile<kBlockM, kBlockN>;  // P and dS: [query][key]
  // 171 KB at kD = 128, 107 KB at kD = 64: one block (8 warps) per SM.
  static constexpr int kSmemBytes =
      (2 * KvTile::kElems + 4 * QTile::kElems + 2 * PTile::kElems) * int(sizeof(bf16)) +
      4 * kBlockM * int(sizeof(float));
};

template <int kD>
__global__ void __launch_bounds__(BwdV2Config<kD>::kThreads, 1)
    AttentionBackwardV2Kernel(Problem pr, const bf16* __restrict__ q, const bf16* __restrict__ k,
                              const bf16* __restrict__ v, const bf16* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              float* __restrict__ dq_accum, bf16* __restrict__ dk,
                              bf16* __restrict__ dv) {
  using C = BwdV2Config<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  using QTile = typename C::QTile;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* p = reinterpret_cast<bf16*>(smem);
  const typename C::KvTile sk{p}, sv{p + C::KvTile::kElems};
  p += 2 * C::KvTile::kElems;
  bf16* const q_stages = p;                       // [2] Q tiles
  bf16* const do_stages = p + 2 * QTile::kElems;  // [2] dO tiles
  p += 4 * QTile::kElems;
  const typename C::PTile sp{p}, sds{p + C::PTile::kElems};
  float* const s_lse = reinterpret_cast<float*>(sds.p + C::PTile::kElems);  // [2][kBlockM]
  float* const s_delta = s_lse + 2 * kBlockM;                               // [2][kBlockM]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = blockIdx.x * kBlockN, kh = blockIdx.y, b = blockIdx.z;
  const int group = pr.heads / pr.kv_heads;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const int64_t kv_off = (int64_t(b) * pr.seq_k + n0) * k_row + kh * kD;

  // Query tiles that can see this key tile: causal rows i >= n0 - q_minus_k.
  const int m_tiles = (pr.seq_q + kBlockM - 1) / kBlockM;
  const int m_first = FirstQueryTile(n0, kBlockM, m_tiles, pr.causal, pr.q_minus_k);
  const int per_head = m_tiles - m_first, iters = per_head * group;

  // Issues the copies of iteration `it` (Q, dO tiles; raw lse, delta; zeros past seq_q) into
  // `stage`.
  auto load_q = [&](int it, int stage) {
    const int h = kh * group + it / per_head, m0 = (m_first + it % per_head) * kBlockM;
    const int64_t off = (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
    QTile{q_stages + stage * QTile::kElems}.template Load<C::kThreads>(q + off, q_row, pr.seq_q - m0);
    QTile{do_stages + stage * QTile::kElems}.template Load<C::kThreads>(dout + off, q_row, pr.seq_q - m0);
    if (threadIdx.x < 2 * kBlockM) {
      const int i = threadIdx.x % kBlockM;
      const bool valid = m0 + i < pr.seq_q;
      const int64_t st = (int64_t(b) * pr.heads + h) * pr.seq_q + (valid ? m0 + i : 0);
      const bool is_lse = threadIdx.x < kBlockM;
      float* dst = (is_lse ? s_lse : s_delta) + stage * kBlockM + i;
      CpAsync4(SmemAddr(dst), (is_lse ? lse : delta) + st, valid);
    }
  };

  sk.template Load<C::kThreads>(k + kv_off, k_row, pr.seq_k - n0);
  sv.template Load<C::kThreads>(v + kv_off, k_row, pr.seq_k - n0);
  if (iters > 0) load_q(0, 0);
  CpAsyncCommit();

  // Phase tilings (see the file comment).
  const int p1_q = (warp / 4) * 32, p1_k = (warp % 4) * 32;  // phase 1: queries, keys
  const int p2_k = (warp % 4) * 32, p2_d = (warp / 4) * C::kDvCols;
  const int p3_q = (warp / 4) * 32, p3_d = (warp % 4) * C::kDqCols;
  constexpr int kDvTiles = C::kDvCols / 8, kDqTiles = C::kDqCols / 8;  // n8 tiles

  float dk_acc[2][kDvTiles][4] = {}, dv_acc[2][kDvTiles][4] = {};

  for (int it = 0; it < iters; ++it) {
    const int stage = it & 1;
    const int h = kh * group + it / per_head, m0 = (m_first + it % per_head) * kBlockM;
    const QTile sq{q_stages + stage * QTile::kElems}, sdo{do_stages + stage * QTile::kElems};
    CpAsyncWait<0>();
    // This iteration's tiles are visible, and every thread is done with the previous iteration
    // (its stage of Q/dO, and P/dS, which phase 1 below overwrites).
    __syncthreads();
    if (it + 1 < iters) load_q(it + 1, stage ^ 1);
    CpAsyncCommit();

    // Phase 1: S = Q K^T and dP = dO V^T for 32 queries x 32 keys.
    float s[2][4][4] = {}, dp[2][4][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[2][4];
      LoadA(a[0], sq, p1_q, kk * 16, lane);
      LoadA(a[1], sq, p1_q + 16, kk * 16, lane);
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        uint32_t bk[4];
        LoadBNk(bk, sk, p1_k + nn * 16, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          Mma(s[mt][2 * nn], a[mt], bk[0], bk[1]);
          Mma(s[mt][2 * nn + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[2][4];
      LoadA(a[0], sdo, p1_q, kk * 16, lane);
      LoadA(a[1], sdo, p1_q + 16, kk * 16, lane);
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        uint32_t bv[4];
        LoadBNk(bv, sv, p1_k + nn * 16, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          Mma(dp[mt][2 * nn], a[mt], bv[0], bv[1]);
          Mma(dp[mt][2 * nn + 1], a[mt], bv[2], bv[3]);
        }
      }
    }

    // P = 2^(S scale_log2 - lse log2e), dS = P (dP - delta); both to shared memory as bf16. Rows
    // past seq_q have Q = dO = 0 and zero-filled lse/delta, so P is 1 there but dS and the
    // products with dO are 0. A row with lse = -inf sees no key at all: every entry is masked.
    const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = p1_q + 16 * mt + lane / 4 + 8 * r;  // query within the tile
        const float raw_lse = s_lse[stage * kBlockM + qi];
        const float l2 = raw_lse == -INFINITY ? INFINITY : raw_lse * kLog2e;
        const float dl = s_delta[stage * kBlockM + qi];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          float pr2[2], ds2[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int kj = p1_k + nt * 8 + 2 * (lane % 4) + e;  // key within the tile
            float prob = FastExp2(s[mt][nt][2 * r + e] * pr.scale_log2 - l2);
            if (need_mask && (n0 + kj >= pr.seq_k ||
                              (pr.causal && int64_t(n0 + kj) > int64_t(m0 + qi) + pr.q_minus_k))) {
              prob = 0.f;
            }
            pr2[e] = prob;
            ds2[e] = prob * (dp[mt][nt][2 * r + e] - dl);
          }
          const int col = p1_k + nt * 8 + 2 * (lane % 4);
          *reinterpret_cast<uint32_t*>(sp.at(qi, col)) = PackBf16(pr2[0], pr2[1]);
          *reinterpret_cast<uint32_t*>(sds.at(qi, col)) = PackBf16(ds2[0], ds2[1]);
        }
      }
    }
    __syncthreads();  // P and dS complete

    // Phase 2: dV += P^T dO, dK += dS^T Q for 32 keys x kDvCols (contraction over the queries).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t ap[2][4], ads[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        LoadATransposed(ap[mt], sp, p2_k + 16 * mt, kk * 16, lane);
        LoadATransposed(ads[mt], sds, p2_k + 16 * mt, kk * 16, lane);
      }
#pragma unroll
      for (int dd = 0; dd < C::kDvCols / 16; ++dd) {
        uint32_t bdo[4], bq[4];
        LoadBKn(bdo, sdo, kk * 16, p2_d + dd * 16, lane);
        LoadBKn(bq, sq, kk * 16, p2_d + dd * 16, lane);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          Mma(dv_acc[mt][2 * dd], ap[mt], bdo[0], bdo[1]);
          Mma(dv_acc[mt][2 * dd + 1], ap[mt], bdo[2], bdo[3]);
          Mma(dk_acc[mt][2 * dd], ads[mt], bq[0], bq[1]);
          Mma(dk_acc[mt][2 * dd + 1], ads[mt], bq[2], bq[3]);
        }
      }
    }

    // Phase 3: dQ (unscaled) += dS K for 32 queries x kDqCols over the block's keys. Reads only
    // dS and K, so it needs no barrier after phase 2; the next iteration's first barrier orders
    // it before dS is overwritten.
    {
      float dq[2][kDqTiles][4] = {};
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[2][4];
        LoadA(a[0], sds, p3_q, kk * 16, lane);
        LoadA(a[1], sds, p3_q + 16, kk * 16, lane);
#pragma unroll
        for (int dd = 0; dd < C::kDqCols / 16; ++dd) {
          uint32_t bk[4];
          LoadBKn(bk, sk, kk * 16, p3_d + dd * 16, lane);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            Mma(dq[mt][2 * dd], a[mt], bk[0], bk[1]);
            Mma(dq[mt][2 * dd + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = m0 + p3_q + 16 * mt + lane / 4 + 8 * r;
          if (i >= pr.seq_q) continue;
          float* dst = dq_accum + (int64_t(b) * pr.seq_q + i) * q_row + h * kD + p3_d + 2 * (lane % 4);
#pragma unroll
          for (int nt = 0; nt < kDqTiles; ++nt) {
            atomicAdd(reinterpret_cast<float2*>(dst + nt * 8), make_float2(dq[mt][nt][2 * r], dq[mt][nt][2 * r + 1]));
          }
        }
      }
    }
  }
  CpAsyncWait<0>();  // no query tiles: the K/V copies may still be in flight

  const float scale = pr.scale;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = n0 + p2_k + 16 * mt + lane / 4 + 8 * r;
      if (j >= pr.seq_k) continue;
      const int64_t off = (int64_t(b) * pr.seq_k + j) * k_row + kh * kD + p2_d + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < kDvTiles; ++dt) {
        *reinterpret_cast<uint32_t*>(dk + off + dt * 8) =
            PackBf16(dk_acc[mt][dt][2 * r] * scale, dk_acc[mt][dt][2 * r + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv + off + dt * 8) = PackBf16(dv_acc[mt][dt][2 * r], dv_acc[mt][dt][2 * r + 1]);
      }
    }
  }
}

template <int kD>
absl::Status Launch(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                    const void* dout, const float* lse, const float* delta, float* dq_accum,
                    void* dk, void* dv, cudaStream_t stream) {
  using C = BwdV2Config<kD>;
  SG_RETURN_IF_ERROR(AllowSmem(AttentionBackwardV2Kernel<kD>, C::kSmemBytes));
  const dim3 grid((pr.seq_k + C::kBlockN - 1) / C::kBlockN, pr.kv_heads, batch);
  AttentionBackwardV2Kernel<kD><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      pr, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<const bf16*>(dout), lse, delta, dq_accum, static_cast<bf16*>(dk),
      static_cast<bf16*>(dv));
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionBackwardV2Kernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchBackwardV2(const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dk, void* dv,
                              cudaStream_t stream) {
  if (head_dim == 64) return Launch<64>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dk, dv, stream);
  return Launch<128>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dk, dv, stream);
}

}  // namespace sg::kernels::internal::attention_device
