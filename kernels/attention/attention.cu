// CUDA flash attention, variant v1 (FlashAttention-2 structure, the first correct version; kept as
// the fallback selected by SG_ATTENTION_KERNEL=v1), plus the kernels both variants share: delta, dq
// conversion, merge; and the entry points that pick the variant. v2 lives in attention_fwd_v2.cu and
// attention_bwd_v2.cu, v3's forward in attention_fwd_v2.cu (v2's kernel with two switches) and its
// backward in attention_bwd_v3.cu; v4 is v3's backward with the Hopper forward variants of
// attention_fwd_v4.h ("ws", the default, in attention_fwd_v4_ws.cu; "wgmma" in
// attention_fwd_v4_wgmma.cu); v5 (the default family) is v4's forward with the wgmma backward of
// attention_bwd_v5.cu.
//
// Data are bf16 for every family. f16 (IEEE half) runs on families v4 and v5 only, with either v4
// forward (the delta and merge kernels take both); the older families are Unimplemented for f16,
// naming the family.
//
// v1 forward: one block per (128-query tile, head, batch), 8 warps of 16 query rows each, looping
//   over 64-key tiles. Causal grids start with the heaviest (last) query tiles.
// v1 backward: one block per (128-key tile, kv head, batch), 8 warps of 16 key rows each, looping
//   over the group's query heads and 64-query tiles; dk/dv accumulate in registers (deterministic),
//   dq is added with f32 atomics into a workspace and converted (scaled) at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_fwd_v4.cuh"
#include "kernels/attention/attention_internal.h"
#include "kernels/attention/attention_tiling.h"
#include "kernels/core/status.h"

namespace sg::kernels::internal {
namespace {

using namespace attention_device;  // NOLINT: this file is the helpers' main user

// --- Forward -----------------------------------------------------------------------------------------

template <int kD>
struct FwdConfig {
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kBlockM = kFwdBlockM, kBlockN = kFwdBlockN;
  static_assert(kBlockM == 16 * kWarps, "one 16-row slice of the query tile per warp");
  using QTile = SmemTile<kBlockM, kD>;
  using KvTile = SmemTile<kBlockN, kD>;
  static constexpr int kSmemBytes = (QTile::kElems + 4 * KvTile::kElems) * int(sizeof(bf16));
};

template <int kD>
__global__ void __launch_bounds__(FwdConfig<kD>::kThreads, 1)
    AttentionForwardKernel(Problem pr, const bf16* __restrict__ q, const bf16* __restrict__ k,
                           const bf16* __restrict__ v, bf16* __restrict__ out,
                           float* __restrict__ lse) {
  using C = FwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  using KvTile = typename C::KvTile;
  const typename C::QTile sq{reinterpret_cast<bf16*>(smem)};
  // Stage s of K is at k_stages + s * kElems, then the two V stages (pointer arithmetic, not an
  // array of tiles: a run-time index into a local array would go to local memory).
  bf16* const k_stages = sq.p + C::QTile::kElems;
  bf16* const v_stages = k_stages + 2 * KvTile::kElems;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m_block = pr.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kh = h / (pr.heads / pr.kv_heads);
  const int m0 = m_block * kBlockM;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const bf16* q_base = q + (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
  const bf16* k_base = k + int64_t(b) * pr.seq_k * k_row + kh * kD;
  const bf16* v_base = v + int64_t(b) * pr.seq_k * k_row + kh * kD;

  const int n_end = VisibleKeyEnd(min(m0 + kBlockM, pr.seq_q), pr.seq_k, pr.causal, pr.q_minus_k);
  const int n_tiles = (n_end + kBlockN - 1) / kBlockN;

  sq.template Load<C::kThreads>(q_base, q_row, pr.seq_q - m0);
  if (n_tiles > 0) {
    KvTile{k_stages}.template Load<C::kThreads>(k_base, k_row, pr.seq_k);
    KvTile{v_stages}.template Load<C::kThreads>(v_base, k_row, pr.seq_k);
  }
  CpAsyncCommit();

  float o[kD / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const int warp_row = m0 + warp * 16 + lane / 4;  // query rows warp_row and warp_row + 8

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1, n0 = t * kBlockN;
    const KvTile sk{k_stages + stage * KvTile::kElems}, sv{v_stages + stage * KvTile::kElems};
    if (t + 1 < n_tiles) {
      const int n1 = n0 + kBlockN, next = (stage ^ 1) * KvTile::kElems;
      KvTile{k_stages + next}.template Load<C::kThreads>(k_base + n1 * k_row, k_row, pr.seq_k - n1);
      KvTile{v_stages + next}.template Load<C::kThreads>(v_base + n1 * k_row, k_row, pr.seq_k - n1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    // S = Q K^T for this warp's 16 rows.
    float s[kBlockN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[4];
      LoadA(a, sq, warp * 16, kk * 16, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t bk[4];
        LoadBNk(bk, sk, nn * 16, kk * 16, lane);
        Mma(s[2 * nn], a, bk[0], bk[1]);
        Mma(s[2 * nn + 1], a, bk[2], bk[3]);
      }
    }

    // Scale into the log2 domain; mask keys past the end and (causal) after the query.
    const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= pr.scale_log2;
        if (need_mask) {
          const int col = n0 + nt * 8 + 2 * (lane % 4) + (e & 1), row = warp_row + (e >= 2 ? 8 : 0);
          if (col >= pr.seq_k || (pr.causal && int64_t(col) > row + pr.q_minus_k)) s[nt][e] = -INFINITY;
        }
      }
    }

    // Online softmax: rescale the running output by e^(old max - new max).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = QuadMax(mx);
      const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: keep exp2 finite
      const float alpha = exp2f(row_max[r] - m_use);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - m_use);
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m_use);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + sum;  // per-thread partial; reduced over the quad at the end
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      AccToA(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < kD / 16; ++dd) {
        uint32_t bv[4];
        LoadBKn(bv, sv, kk * 16, dd * 16, lane);
        Mma(o[2 * dd], a, bv[0], bv[1]);
        Mma(o[2 * dd + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this stage
  }
  CpAsyncWait<0>();  // no key tiles: the Q copy may still be in flight (in every thread)
  __syncthreads();

  // Normalize and stage this warp's rows in its own (no longer read) rows of the Q tile, then write
  // them out with coalesced 16-byte stores.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = QuadSum(row_sum[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = warp_row + 8 * r;
    if (lane % 4 == 0 && row < pr.seq_q) {
      lse[(int64_t(b) * pr.heads + h) * pr.seq_q + row] = l > 0.f ? (row_max[r] + log2f(l)) * kLn2 : -INFINITY;
    }
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(sq.at(warp * 16 + lane / 4 + 8 * r, dt * 8 + 2 * (lane % 4))) =
          PackBf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
  }
  __syncwarp();
  bf16* out_base = out + (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
  constexpr int kChunksPerRow = kD / 8;
#pragma unroll
  for (int c = lane; c < 16 * kChunksPerRow; c += 32) {
    const int r = warp * 16 + c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    if (m0 + r < pr.seq_q) {
      *reinterpret_cast<uint4*>(out_base + r * q_row + col) = *reinterpret_cast<const uint4*>(sq.at(r, col));
    }
  }
}

// --- Backward ----------------------------------------------------------------------------------------

// The two-element vector of T (bf16 or f16) and its conversion to floats.
template <typename T>
using Pair = std::conditional_t<kIsF16<T>, __half2, __nv_bfloat162>;
__device__ __forceinline__ float2 PairToFloat2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 PairToFloat2(__half2 v) { return __half22float2(v); }

// delta[b, h, i] = dout_i . out_i: one warp per (b, i, h) row; T is bf16 or f16.
template <typename T, int kD>
__global__ void AttentionDeltaKernel(int64_t rows, int seq, int heads, const T* __restrict__ out,
                                     const T* __restrict__ dout, float* __restrict__ delta) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  constexpr int kPer = kD / 32;
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < kPer; e += 2) {
    const Pair<T> o = *reinterpret_cast<const Pair<T>*>(out + row * kD + lane * kPer + e);
    const Pair<T> d = *reinterpret_cast<const Pair<T>*>(dout + row * kD + lane * kPer + e);
    const float2 of = PairToFloat2(o), df = PairToFloat2(d);
    acc += of.x * df.x + of.y * df.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t b = row / (int64_t(seq) * heads), i = (row / heads) % seq, h = row % heads;
    delta[(b * heads + h) * seq + i] = acc;
  }
}

template <int kD>
struct BwdConfig {
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kBlockN = kBwdBlockN;  // keys per block, 16 per warp
  static constexpr int kBlockM = kBwdBlockM;  // queries per iteration
  static_assert(kBlockN == 16 * kWarps, "one 16-key slice of the key tile per warp");
  static constexpr int kQGroups = kBlockM / 16, kDqSplit = kWarps / kQGroups, kDqCols = kD / kDqSplit;
  static_assert(kWarps % kQGroups == 0 && kDqCols % 16 == 0, "dq tile must split over the warps");
  using KvTile = SmemTile<kBlockN, kD>;
  using QTile = SmemTile<kBlockM, kD>;
  using DsTile = SmemTile<kBlockN, kBlockM>;  // dS^T: [key][query]
  static constexpr int kSmemBytes =
      (2 * KvTile::kElems + 4 * QTile::kElems + DsTile::kElems) * int(sizeof(bf16)) +
      4 * kBlockM * int(sizeof(float));
};

template <int kD>
__global__ void __launch_bounds__(BwdConfig<kD>::kThreads, 1)
    AttentionBackwardKernel(Problem pr, const bf16* __restrict__ q, const bf16* __restrict__ k,
                            const bf16* __restrict__ v, const bf16* __restrict__ dout,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            float* __restrict__ dq_accum, bf16* __restrict__ dk,
                            bf16* __restrict__ dv) {
  using C = BwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* p = reinterpret_cast<bf16*>(smem);
  const typename C::KvTile sk{p}, sv{p + C::KvTile::kElems};
  p += 2 * C::KvTile::kElems;
  using QTile = typename C::QTile;
  bf16* const q_stages = p;                           // [2] Q tiles
  bf16* const do_stages = p + 2 * QTile::kElems;      // [2] dO tiles
  const typename C::DsTile sds{p + 4 * QTile::kElems};
  float* s_lse = reinterpret_cast<float*>(sds.p + C::DsTile::kElems);  // [2][kBlockM], log2 units
  float* s_delta = s_lse + 2 * kBlockM;                                  // [2][kBlockM]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = blockIdx.x * kBlockN, kh = blockIdx.y, b = blockIdx.z;
  const int group = pr.heads / pr.kv_heads;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const int64_t kv_off = (int64_t(b) * pr.seq_k + n0) * k_row + kh * kD;

  // Query tiles that can see this key tile: causal rows i >= n0 - q_minus_k.
  const int m_tiles = (pr.seq_q + kBlockM - 1) / kBlockM;
  const int m_first = FirstQueryTile(n0, kBlockM, m_tiles, pr.causal, pr.q_minus_k);
  const int per_head = m_tiles - m_first, iters = per_head * group;

  // Issues the copies of iteration `it` (Q, dO tiles; lse, delta) into `stage`.
  auto load_q = [&](int it, int stage) {
    const int h = kh * group + it / per_head, m0 = (m_first + it % per_head) * kBlockM;
    const int64_t off = (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
    QTile{q_stages + stage * QTile::kElems}.template Load<C::kThreads>(q + off, q_row, pr.seq_q - m0);
    QTile{do_stages + stage * QTile::kElems}.template Load<C::kThreads>(dout + off, q_row, pr.seq_q - m0);
    if (threadIdx.x < kBlockM) {
      const int i = m0 + threadIdx.x;
      const int64_t st = (int64_t(b) * pr.heads + h) * pr.seq_q + i;
      // Rows past the end and rows with no visible key anywhere (lse = -inf) get P = 0.
      const float l = i < pr.seq_q ? lse[st] : INFINITY;
      s_lse[stage * kBlockM + threadIdx.x] = l == -INFINITY ? INFINITY : l * kLog2e;
      s_delta[stage * kBlockM + threadIdx.x] = i < pr.seq_q ? delta[st] : 0.f;
    }
  };

  sk.template Load<C::kThreads>(k + kv_off, k_row, pr.seq_k - n0);
  sv.template Load<C::kThreads>(v + kv_off, k_row, pr.seq_k - n0);
  if (iters > 0) load_q(0, 0);
  CpAsyncCommit();

  float dk_acc[kD / 8][4] = {}, dv_acc[kD / 8][4] = {};
  const int key = n0 + warp * 16 + lane / 4;  // this thread's key rows: key, key + 8

  for (int it = 0; it < iters; ++it) {
    const int stage = it & 1;
    const int h = kh * group + it / per_head, m0 = (m_first + it % per_head) * kBlockM;
    const QTile sq{q_stages + stage * QTile::kElems}, sdo{do_stages + stage * QTile::kElems};
    if (it + 1 < iters) {
      load_q(it + 1, stage ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x kBlockM queries.
    float st[kBlockM / 8][4] = {}, dpt[kBlockM / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ak[4], av[4];
      LoadA(ak, sk, warp * 16, kk * 16, lane);
      LoadA(av, sv, warp * 16, kk * 16, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockM / 16; ++nn) {
        uint32_t bq[4], bdo[4];
        LoadBNk(bq, sq, nn * 16, kk * 16, lane);
        LoadBNk(bdo, sdo, nn * 16, kk * 16, lane);
        Mma(st[2 * nn], ak, bq[0], bq[1]);
        Mma(st[2 * nn + 1], ak, bq[2], bq[3]);
        Mma(dpt[2 * nn], av, bdo[0], bdo[1]);
        Mma(dpt[2 * nn + 1], av, bdo[2], bdo[3]);
      }
    }

    // P^T = exp2(S^T scale_log2 - lse_log2), dS^T = P^T (dP^T - delta); dS^T -> shared for dq.
    const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
    const float* l2 = s_lse + stage * kBlockM;
    const float* dl = s_delta + stage * kBlockM;
#pragma unroll
    for (int nt = 0; nt < kBlockM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + 2 * (lane % 4) + (e & 1), kr = key + (e >= 2 ? 8 : 0);
        float prob = exp2f(st[nt][e] * pr.scale_log2 - l2[qc]);
        if (need_mask && (kr >= pr.seq_k || (pr.causal && int64_t(kr) > m0 + qc + pr.q_minus_k))) {
          prob = 0.f;
        }
        st[nt][e] = prob;
        dpt[nt][e] = prob * (dpt[nt][e] - dl[qc]);
      }
      *reinterpret_cast<uint32_t*>(sds.at(warp * 16 + lane / 4, nt * 8 + 2 * (lane % 4))) =
          PackBf16(dpt[nt][0], dpt[nt][1]);
      *reinterpret_cast<uint32_t*>(sds.at(warp * 16 + lane / 4 + 8, nt * 8 + 2 * (lane % 4))) =
          PackBf16(dpt[nt][2], dpt[nt][3]);
    }

    // dV += P^T dO, dK += dS^T Q (contraction over this tile's queries).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t ap[4], ads[4];
      AccToA(ap, st[2 * kk], st[2 * kk + 1]);
      AccToA(ads, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < kD / 16; ++dd) {
        uint32_t bdo[4], bq[4];
        LoadBKn(bdo, sdo, kk * 16, dd * 16, lane);
        LoadBKn(bq, sq, kk * 16, dd * 16, lane);
        Mma(dv_acc[2 * dd], ap, bdo[0], bdo[1]);
        Mma(dv_acc[2 * dd + 1], ap, bdo[2], bdo[3]);
        Mma(dk_acc[2 * dd], ads, bq[0], bq[1]);
        Mma(dk_acc[2 * dd + 1], ads, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS^T complete

    // dQ (unscaled) += dS K over all kBlockN keys: warp -> 16 queries x kDqCols columns.
    {
      const int qg = warp % C::kQGroups, c0 = (warp / C::kQGroups) * C::kDqCols;
      float dq[C::kDqCols / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        LoadATransposed(a, sds, qg * 16, kk * 16, lane);
#pragma unroll
        for (int dd = 0; dd < C::kDqCols / 16; ++dd) {
          uint32_t bk[4];
          LoadBKn(bk, sk, kk * 16, c0 + dd * 16, lane);
          Mma(dq[2 * dd], a, bk[0], bk[1]);
          Mma(dq[2 * dd + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = m0 + qg * 16 + lane / 4 + 8 * r;
        if (i >= pr.seq_q) continue;
        float* dst = dq_accum + (int64_t(b) * pr.seq_q + i) * q_row + h * kD + c0 + 2 * (lane % 4);
#pragma unroll
        for (int nt = 0; nt < C::kDqCols / 8; ++nt) {
          atomicAdd(reinterpret_cast<float2*>(dst + nt * 8), make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]));
        }
      }
    }
    // No barrier here: the next iteration's copy targets the other stage (read before the barrier
    // above), and its barrier orders this dq read of dS^T before the next dS^T write.
  }
  CpAsyncWait<0>();  // no query tiles: the K/V copies may still be in flight

  const float scale = pr.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = key + 8 * r;
    if (j >= pr.seq_k) continue;
    const int64_t off = (int64_t(b) * pr.seq_k + j) * k_row + kh * kD + 2 * (lane % 4);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(dk + off + dt * 8) = PackBf16(dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + dt * 8) = PackBf16(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
    }
  }
}

// dq = scale * dq_accum, 4 elements per thread.
__global__ void ConvertDqKernel(int64_t n4, float scale, const float4* __restrict__ acc,
                                __nv_bfloat162* __restrict__ dq) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 a = acc[i];
  dq[2 * i] = __floats2bfloat162_rn(a.x * scale, a.y * scale);
  dq[2 * i + 1] = __floats2bfloat162_rn(a.z * scale, a.w * scale);
}

// --- Merge --------------------------------------------------------------------------------------------

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF(f16 x) { return __half2float(x); }
template <typename T> __device__ T FromF(float x);
template <> __device__ __forceinline__ float FromF<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 FromF<bf16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ f16 FromF<f16>(float x) { return __float2half_rn(x); }

// One warp per (b, s, h) row. Every lane reads the statistics before any lane writes, so out/lse
// may alias the a or b side.
template <typename T>
__global__ void AttentionMergeKernel(int64_t rows, int seq, int heads, int dim, const T* out_a,
                                     const float* lse_a, const T* out_b, const float* lse_b, T* out,
                                     float* lse) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t b = row / (int64_t(seq) * heads), s = (row / heads) % seq, h = row % heads;
  const int64_t st = (b * heads + h) * seq + s;
  const float la = lse_a[st], lb = lse_b[st], m = fmaxf(la, lb);
  float l = -INFINITY, wa = 0.f, wb = 0.f;
  if (m != -INFINITY) {
    l = m + logf(expf(la - m) + expf(lb - m));
    wa = expf(la - l);
    wb = expf(lb - l);
  }
  __syncwarp();
  for (int d = lane; d < dim; d += 32) {
    out[row * dim + d] = FromF<T>(wa * ToF(out_a[row * dim + d]) + wb * ToF(out_b[row * dim + d]));
  }
  if (lane == 0) lse[st] = l;
}

// --- Launch helpers -----------------------------------------------------------------------------------

template <int kD>
absl::Status LaunchForward(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                           void* out, float* lse, cudaStream_t stream) {
  using C = FwdConfig<kD>;
  SG_RETURN_IF_ERROR(AllowSmem(AttentionForwardKernel<kD>, C::kSmemBytes));
  const dim3 grid((pr.seq_q + C::kBlockM - 1) / C::kBlockM, pr.heads, batch);
  AttentionForwardKernel<kD><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      pr, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<bf16*>(out), lse);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionForwardKernel);
  return absl::OkStatus();
}

template <int kD>
absl::Status LaunchBackward(const Problem& pr, int batch, const void* q, const void* k,
                            const void* v, const void* dout, const float* lse, const float* delta,
                            float* dq_accum, void* dk, void* dv, cudaStream_t stream) {
  using C = BwdConfig<kD>;
  SG_RETURN_IF_ERROR(AllowSmem(AttentionBackwardKernel<kD>, C::kSmemBytes));
  const dim3 grid((pr.seq_k + C::kBlockN - 1) / C::kBlockN, pr.kv_heads, batch);
  AttentionBackwardKernel<kD><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      pr, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<const bf16*>(dout), lse, delta, dq_accum, static_cast<bf16*>(dk),
      static_cast<bf16*>(dv));
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionBackwardKernel);
  return absl::OkStatus();
}

template <typename T>
void LaunchDelta(const AttentionParams& p, int64_t blocks, int threads, const void* out,
                 const void* dout, float* delta, cudaStream_t s) {
  const int64_t rows = p.batch * p.seq_q * p.heads;
  const auto* o = static_cast<const T*>(out);
  const auto* d = static_cast<const T*>(dout);
  if (p.head_dim == 64) {
    AttentionDeltaKernel<T, 64><<<unsigned(blocks), threads, 0, s>>>(rows, int(p.seq_q), int(p.heads), o, d, delta);
  } else {
    AttentionDeltaKernel<T, 128><<<unsigned(blocks), threads, 0, s>>>(rows, int(p.seq_q), int(p.heads), o, d, delta);
  }
}

// f16 runs on v4 (the wgmma forward, v3's backward) and on the default family v5 (the wgmma forward
// and backward); the others are bf16.
absl::Status CheckF16Family(const AttentionParams& p, AttentionKernel variant, absl::string_view what) {
  if (p.dtype != DType::kF16 || variant == AttentionKernel::kV4 || variant == AttentionKernel::kV5) {
    return absl::OkStatus();
  }
  const char* names[] = {"v1", "v2", "v3", "v3a", "v4", "v5"};
  return absl::UnimplementedError(absl::StrCat(
      "CUDA attention ", what, ": f16 runs on the kernel families v4 and v5 only; SG_ATTENTION_KERNEL=",
      names[int(variant)], " is bf16-only"));
}

}  // namespace

absl::Status AttentionForwardCuda(const AttentionParams& p, const void* q, const void* k,
                                  const void* v, void* out, float* lse, void* stream) {
  if (p.batch * p.seq_q * p.heads == 0) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(Problem pr, MakeProblem(p));
  SG_ASSIGN_OR_RETURN(AttentionKernel variant, AttentionKernelFromEnv());
  SG_RETURN_IF_ERROR(CheckF16Family(p, variant, "forward"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // v4's kernels (v5's forward too) take the row max on raw scores (scale > 0) and put 128-row
  // query tiles in the grid's y (at most 65535); v3 covers the rest (bf16 only).
  const bool v4_forward = variant == AttentionKernel::kV4 || variant == AttentionKernel::kV5;
  if (v4_forward && pr.scale_log2 > 0.f && p.seq_q <= int64_t(65535) * 128) {
    SG_ASSIGN_OR_RETURN(FwdV4Variant fwd, FwdV4VariantFromEnv());
    return LaunchForwardV4Wgmma(fwd, p.dtype, pr, int(p.head_dim), int(p.batch), q, k, v, out, lse, s);
  }
  if (p.dtype == DType::kF16) {
    return absl::UnimplementedError(absl::StrCat(
        "CUDA attention forward: f16 needs the v4 wgmma forward, which takes scale > 0 and seq_q <= ",
        int64_t(65535) * 128, "; found scale ", p.scale, ", seq_q ", p.seq_q));
  }
  if (variant == AttentionKernel::kV3 || variant == AttentionKernel::kV3a || v4_forward) {
    return LaunchForwardV3(pr, int(p.head_dim), int(p.batch), q, k, v, out, lse, s);
  }
  if (variant == AttentionKernel::kV2) {
    return LaunchForwardV2(pr, int(p.head_dim), int(p.batch), q, k, v, out, lse, s);
  }
  if (p.head_dim == 64) return LaunchForward<64>(pr, int(p.batch), q, k, v, out, lse, s);
  return LaunchForward<128>(pr, int(p.batch), q, k, v, out, lse, s);
}

absl::Status AttentionBackwardDeltaCuda(const AttentionParams& p, const void* out,
                                        const void* dout, float* delta, void* stream) {
  const int64_t rows = p.batch * p.seq_q * p.heads;
  if (rows == 0) return absl::OkStatus();
  SG_CHECK_ARG(p.seq_q < (int64_t(1) << 30) && p.heads <= 65535, "CUDA attention delta: sizes out of range");
  constexpr int kThreads = 256;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  SG_CHECK_ARG(blocks < (int64_t(1) << 31), "CUDA attention delta: too many rows (", rows, ")");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kF16) {
    LaunchDelta<f16>(p, blocks, kThreads, out, dout, delta, s);
  } else {
    LaunchDelta<bf16>(p, blocks, kThreads, out, dout, delta, s);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionDeltaKernel);
  return absl::OkStatus();
}

absl::Status AttentionBlockBackwardCuda(const AttentionParams& p, const void* q, const void* k,
                                        const void* v, const void* dout, const float* lse,
                                        const float* delta, float* dq_accum, void* dq, void* dk,
                                        void* dv, void* stream) {
  SG_ASSIGN_OR_RETURN(Problem pr, MakeProblem(p));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t nq = p.batch * p.seq_q * p.heads * p.head_dim;
  const int64_t nk = p.batch * p.seq_k * p.kv_heads * p.head_dim;
  if (nq == 0) {  // no queries: no gradient reaches k or v
    if (nk > 0) {
      SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dk, 0, size_t(nk) * 2, s));
      SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dv, 0, size_t(nk) * 2, s));
    }
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(AttentionKernel variant, AttentionKernelFromEnv());
  SG_RETURN_IF_ERROR(CheckF16Family(p, variant, "backward"));
  // v4's backward is v3's; v5's shares v3's grid limit, workspace layout and dq conversion.
  const bool v3 = variant == AttentionKernel::kV3 || variant == AttentionKernel::kV3a ||
                  variant == AttentionKernel::kV4 || variant == AttentionKernel::kV5;
  if (v3 && (p.seq_k + kBwdV3BlockN - 1) / kBwdV3BlockN > 65535) {
    if (p.dtype == DType::kF16) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA attention backward: f16 runs on the v3 and v5 backward, which take seq_k <= ",
          int64_t(65535) * kBwdV3BlockN, ", found ", p.seq_k));
    }
    variant = AttentionKernel::kV2;  // v3's grid holds at most 65535 key blocks (seq_k <= 8M)
  } else if (v3) {  // its own workspace layout and dq conversion
    SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_accum, 0, size_t(DqWorkspaceElems(p)) * sizeof(float), s));
    // seq_k = 0 (nk = 0): no key blocks; the conversion alone writes dq = 0.
    if (variant == AttentionKernel::kV5) {
      return LaunchBackwardV5(p.dtype, pr, int(p.head_dim), int(p.batch), q, k, v, dout, lse, delta,
                              dq_accum, dq, dk, dv, s);
    }
    return LaunchBackwardV3(p.dtype, pr, int(p.head_dim), int(p.batch), q, k, v, dout, lse, delta,
                            dq_accum, dq, dk, dv, /*bulk_dq=*/variant != AttentionKernel::kV3a, s);
  }
  SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_accum, 0, size_t(nq) * sizeof(float), s));
  if (nk > 0 && variant == AttentionKernel::kV2) {
    SG_RETURN_IF_ERROR(LaunchBackwardV2(pr, int(p.head_dim), int(p.batch), q, k, v, dout, lse,
                                        delta, dq_accum, dk, dv, s));
  } else if (nk > 0) {
    if (p.head_dim == 64) {
      SG_RETURN_IF_ERROR(LaunchBackward<64>(pr, int(p.batch), q, k, v, dout, lse, delta, dq_accum, dk, dv, s));
    } else {
      SG_RETURN_IF_ERROR(LaunchBackward<128>(pr, int(p.batch), q, k, v, dout, lse, delta, dq_accum, dk, dv, s));
    }
  }
  constexpr int kThreads = 256;
  const int64_t n4 = nq / 4;  // head_dim is a multiple of 4
  ConvertDqKernel<<<unsigned((n4 + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      n4, float(p.scale), reinterpret_cast<const float4*>(dq_accum), static_cast<__nv_bfloat162*>(dq));
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ConvertDqKernel);
  return absl::OkStatus();
}

absl::Status AttentionMergeCuda(DType dtype, int64_t batch, int64_t seq, int64_t heads,
                                int64_t head_dim, const void* out_a, const float* lse_a,
                                const void* out_b, const float* lse_b, void* out, float* lse,
                                void* stream) {
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  SG_CHECK_ARG(blocks < (int64_t(1) << 31) && seq < (int64_t(1) << 31) && heads < (int64_t(1) << 31),
               "CUDA attention merge: sizes out of range");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kF32) {
    AttentionMergeKernel<float><<<unsigned(blocks), kThreads, 0, s>>>(
        rows, int(seq), int(heads), int(head_dim), static_cast<const float*>(out_a), lse_a,
        static_cast<const float*>(out_b), lse_b, static_cast<float*>(out), lse);
  } else if (dtype == DType::kF16) {
    AttentionMergeKernel<f16><<<unsigned(blocks), kThreads, 0, s>>>(
        rows, int(seq), int(heads), int(head_dim), static_cast<const f16*>(out_a), lse_a,
        static_cast<const f16*>(out_b), lse_b, static_cast<f16*>(out), lse);
  } else {
    AttentionMergeKernel<bf16><<<unsigned(blocks), kThreads, 0, s>>>(
        rows, int(seq), int(heads), int(head_dim), static_cast<const bf16*>(out_a), lse_a,
        static_cast<const bf16*>(out_b), lse_b, static_cast<bf16*>(out), lse);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionMergeKernel);
  return absl::OkStatus();
}

}  // namespace sg::kernels::internal
