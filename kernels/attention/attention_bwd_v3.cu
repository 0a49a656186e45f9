// CUDA flash attention backward, variant v3 (SG_ATTENTION_KERNEL=v3): v2's three-phase
// decomposition (see attention_bwd_v2.cu) with four changes aimed at the measured gap to
// FlashAttention-2 (H200, B=8 S=2048 H=32 KV=8 causal: v2 172 / 206 TFLOP/s at D = 64 / 128, SDPA
// 200 / 229):
//
// 1. dQ without per-thread atomics. v2 issued 8 (D64) or 16 (D128) red.global.v2.f32 per thread per
//    query tile, 2.3 GB of scattered f32 reductions into L2 for the D128 benchmark. v3 stores the dQ
//    tile (f32) to shared memory and one thread hands the whole tile (32 KB) to the TMA unit with a
//    single cp.reduce.async.bulk .add.f32 into a tile-contiguous workspace [batch, heads, m_pad, D]
//    (row r's 8-float chunks XOR-swizzled by r % 8, so the fragment stores are conflict-free); the
//    warps go straight on. ConvertDqV3Kernel turns the workspace into bf16 (or f16) dq.
// 2. D64 uses 128 x 128 tiles (FlashAttention-2's choice for head_dim 64; v2 used 64 x 128 for
//    both). Per 128-key block and 128 queries: 8 warps x {phase 1: 64 q x 32 k, phase 2: 32 k x 32
//    d, phase 3: 32 q x 32 d} read 1152 ldmatrix.x4 for 2560 MMAs (0.45 per MMA; v2 at D64: 1408
//    for 2560, 0.55), and the per-tile costs (two barriers, lse/delta, pipeline bubbles) are paid
//    half as often.
// 3. P is exponentiated and packed to bf16 before dP is computed, so S and dP are never live
//    together (v2 at D128 spilled at 255 registers; v3 does not).
// 4. Grid order (kv head, key block, batch): blocks are issued per batch, key blocks heaviest
//    first (under a causal mask key block j sees S - 128 j queries), kv heads fastest. v2's
//    (block, kv head, batch) grid runs each head's blocks heaviest first but mixes heavy and
//    light blocks in the last wave: a list-scheduling model of the causal benchmark (1024 blocks
//    on 132 SMs) puts v2's makespan 15% over the ideal, this order 3%. One batch in flight at a
//    time keeps the L2 working set (Q, dO, dq workspace of 32 heads) the size v2's order had.
//
// Element types: bf16, and f16 (IEEE half; v4's backward):
// the same kernels with the f16 MMA and f16 roundings of P, dS, dk, dv and dq.
//
// Occupancy: one block of 8 warps per SM (launch bound 256 threads, 1 block; shared memory
// 203 KB at D128, 210 KB at D64; ptxas: 255 registers, zero spills, both head dims).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_tiling.h"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kD, typename T = bf16>
struct BwdV3Config {
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kBlockN = kBwdV3BlockN;           // keys per block
  static constexpr int kBlockM = BwdV3BlockM(kD);        // queries per iteration
  static_assert(kBlockN == 128, "phase tilings assume 4 warps x 32 keys");
  static_assert(kBlockM == 64 || kBlockM == 128, "query tile must be 2 x (32 or 64) rows");
  static_assert(kDqAccumRowAlign % kBlockM == 0, "the dq workspace pads rows to whole tiles");
  // Phase 1: warps 2 (queries) x 4 (keys), kP1Rows x 32 each.
  static constexpr int kP1Rows = kBlockM / 2, kP1MTiles = kP1Rows / 16;
  // Phase 2: warps 4 (keys) x 2 (head_dim), 32 x kDvCols each.
  static constexpr int kDvCols = kD / 2;
  // Phase 3: warps kDqWarpsM (queries) x kDqWarpsD (head_dim), 32 x kDqCols each.
  static constexpr int kDqWarpsM = kBlockM / 32, kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqCols = kD / kDqWarpsD;
  static_assert(kDvCols % 16 == 0 && kDqCols % 16 == 0, "head_dim must split into 16-wide slices");
  static_assert(kD / 8 >= 8, "the dq swizzle permutes 8 chunks of 8 floats within a row");
  using KvTile = SmemTile<kBlockN, kD, T>;
  using QTile = SmemTile<kBlockM, kD, T>;
  using PTile = SmemTile<kBlockM, kBlockN, T>;  // P and dS: [query][key]
  static constexpr int kDqBytes = kBlockM * kD * int(sizeof(float));  // one bulk reduction
  static constexpr int kSmemBytes =
      kDqBytes + (2 * KvTile::kElems + 4 * QTile::kElems + 2 * PTile::kElems) * int(sizeof(T)) +
      4 * kBlockM * int(sizeof(float));
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the sm_90 shared memory per block");
};

// T: the element type of q, k, v, dout, dk, dv (bf16 or f16).
template <typename T, int kD>
__global__ void __launch_bounds__(BwdV3Config<kD, T>::kThreads, 1)
    AttentionBackwardV3Kernel(Problem pr, int m_pad, const T* __restrict__ q,
                              const T* __restrict__ k, const T* __restrict__ v,
                              const T* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ delta, float* __restrict__ dq_accum,
                              T* __restrict__ dk, T* __restrict__ dv) {
  using C = BwdV3Config<kD, T>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kP1MTiles = C::kP1MTiles;
  using QTile = typename C::QTile;
  extern __shared__ __align__(128) unsigned char smem[];
  float* const s_dq = reinterpret_cast<float*>(smem);  // [kBlockM * kD], swizzled
  T* p = reinterpret_cast<T*>(smem + C::kDqBytes);
  const typename C::KvTile sk{p}, sv{p + C::KvTile::kElems};
  p += 2 * C::KvTile::kElems;
  T* const q_stages = p;                       // [2] Q tiles
  T* const do_stages = p + 2 * QTile::kElems;  // [2] dO tiles
  p += 4 * QTile::kElems;
  const typename C::PTile sp{p}, sds{p + C::PTile::kElems};
  float* const s_lse = reinterpret_cast<float*>(sds.p + C::PTile::kElems);  // [2][kBlockM]
  float* const s_delta = s_lse + 2 * kBlockM;                               // [2][kBlockM]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Grid (kv head, key block, batch): issued per batch, key blocks in order (the heaviest first
  // under a causal mask), kv heads fastest.
  const int n0 = blockIdx.y * kBlockN, kh = blockIdx.x, b = blockIdx.z;
  const int group = pr.heads / pr.kv_heads;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const int64_t kv_off = (int64_t(b) * pr.seq_k + n0) * k_row + kh * kD;

  // Query tiles that can see this key tile: causal rows i >= n0 - q_minus_k.
  const int m_tiles = (pr.seq_q + kBlockM - 1) / kBlockM;
  const int m_first = FirstQueryTile(n0, kBlockM, m_tiles, pr.causal, pr.q_minus_k);
  const int per_head = m_tiles - m_first, iters = per_head * group;
  auto head_of = [&](int it) { return kh * group + it / per_head; };
  auto row_of = [&](int it) { return (m_first + it % per_head) * kBlockM; };

  // Issues the copies of iteration `it` (Q, dO tiles; raw lse, delta; zeros past seq_q) into
  // `stage`.
  auto load_q = [&](int it, int stage) {
    const int h = head_of(it), m0 = row_of(it);
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
  // Adds the dQ tile of iteration `it` (complete in s_dq, fenced for the async proxy by every
  // writer, then a barrier) to the workspace. Thread 0 only.
  auto reduce_dq = [&](int it) {
    float* dst = dq_accum + ((int64_t(b) * pr.heads + head_of(it)) * m_pad + row_of(it)) * kD;
    BulkReduceAddF32(dst, SmemAddr(s_dq), C::kDqBytes);
    BulkCommit();
  };

  sk.template Load<C::kThreads>(k + kv_off, k_row, pr.seq_k - n0);
  sv.template Load<C::kThreads>(v + kv_off, k_row, pr.seq_k - n0);
  if (iters > 0) load_q(0, 0);
  CpAsyncCommit();

  // Phase tilings (see BwdV3Config).
  const int p1_q = (warp / 4) * C::kP1Rows, p1_k = (warp % 4) * 32;
  const int p2_k = (warp % 4) * 32, p2_d = (warp / 4) * C::kDvCols;
  const int p3_q = (warp % C::kDqWarpsM) * 32, p3_d = (warp / C::kDqWarpsM) * C::kDqCols;
  constexpr int kDvTiles = C::kDvCols / 8, kDqTiles = C::kDqCols / 8;  // n8 tiles

  float dk_acc[2][kDvTiles][4] = {}, dv_acc[2][kDvTiles][4] = {};

  for (int it = 0; it < iters; ++it) {
    const int stage = it & 1;
    const int m0 = row_of(it);
    const QTile sq{q_stages + stage * QTile::kElems}, sdo{do_stages + stage * QTile::kElems};
    CpAsyncWait<0>();
    // This iteration's tiles are visible; every thread is done with the previous iteration (its
    // Q/dO stage, P/dS, and its dQ tile writes, fenced for the bulk reduction issued next).
    __syncthreads();
    if (threadIdx.x == 0 && it > 0) reduce_dq(it - 1);
    if (it + 1 < iters) load_q(it + 1, stage ^ 1);
    CpAsyncCommit();

    // Phase 1a: S = Q K^T for kP1Rows queries x 32 keys.
    uint32_t p_pack[kP1MTiles][4][2];  // P as T pairs: [m-tile][n8 tile][row half]
    {
      float s[kP1MTiles][4][4] = {};
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t a[kP1MTiles][4];
#pragma unroll
        for (int mt = 0; mt < kP1MTiles; ++mt) LoadA(a[mt], sq, p1_q + 16 * mt, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          uint32_t bk[4];
          LoadBNk(bk, sk, p1_k + nn * 16, kk * 16, lane);
#pragma unroll
          for (int mt = 0; mt < kP1MTiles; ++mt) {
            Mma<T>(s[mt][2 * nn], a[mt], bk[0], bk[1]);
            Mma<T>(s[mt][2 * nn + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
      // P = 2^(S scale_log2 - lse log2e), masked entries 0; to shared memory and kept packed.
      // Rows past seq_q have Q = 0 and zero-filled lse, so P = 1 there, but their dO and delta
      // are 0, which zeroes dS and every product with dO. lse = -inf (no visible key): P = 0.
      const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
      for (int mt = 0; mt < kP1MTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qi = p1_q + 16 * mt + lane / 4 + 8 * r;  // query within the tile
          const float raw_lse = s_lse[stage * kBlockM + qi];
          const float l2 = raw_lse == -INFINITY ? INFINITY : raw_lse * kLog2e;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            float pr2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int kj = p1_k + nt * 8 + 2 * (lane % 4) + e;  // key within the tile
              float prob = FastExp2(s[mt][nt][2 * r + e] * pr.scale_log2 - l2);
              if (need_mask && (n0 + kj >= pr.seq_k ||
                                (pr.causal && int64_t(n0 + kj) > int64_t(m0 + qi) + pr.q_minus_k))) {
                prob = 0.f;
              }
              pr2[e] = prob;
            }
            p_pack[mt][nt][r] = Pack2<T>(pr2[0], pr2[1]);
            *reinterpret_cast<uint32_t*>(sp.at(qi, p1_k + nt * 8 + 2 * (lane % 4))) = p_pack[mt][nt][r];
          }
        }
      }
    }

    // Phase 1b: dP = dO V^T, then dS = P (dP - delta) -> shared memory (T). P here is the
    // T-rounded value that dV also uses; dS is rounded to T after this product anyway.
    {
      float dp[kP1MTiles][4][4] = {};
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t a[kP1MTiles][4];
#pragma unroll
        for (int mt = 0; mt < kP1MTiles; ++mt) LoadA(a[mt], sdo, p1_q + 16 * mt, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          uint32_t bv[4];
          LoadBNk(bv, sv, p1_k + nn * 16, kk * 16, lane);
#pragma unroll
          for (int mt = 0; mt < kP1MTiles; ++mt) {
            Mma<T>(dp[mt][2 * nn], a[mt], bv[0], bv[1]);
            Mma<T>(dp[mt][2 * nn + 1], a[mt], bv[2], bv[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kP1MTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qi = p1_q + 16 * mt + lane / 4 + 8 * r;
          const float dl = s_delta[stage * kBlockM + qi];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const uint32_t pp = p_pack[mt][nt][r];
            *reinterpret_cast<uint32_t*>(sds.at(qi, p1_k + nt * 8 + 2 * (lane % 4))) =
                Pack2<T>(Unpack2Lo<T>(pp) * (dp[mt][nt][2 * r] - dl),
                         Unpack2Hi<T>(pp) * (dp[mt][nt][2 * r + 1] - dl));
          }
        }
      }
    }
    // The previous dQ tile's bulk reduction has finished reading s_dq before anyone passes the
    // barrier below, so phase 3 may overwrite it.
    if (threadIdx.x == 0) BulkWaitRead<0>();
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
          Mma<T>(dv_acc[mt][2 * dd], ap[mt], bdo[0], bdo[1]);
          Mma<T>(dv_acc[mt][2 * dd + 1], ap[mt], bdo[2], bdo[3]);
          Mma<T>(dk_acc[mt][2 * dd], ads[mt], bq[0], bq[1]);
          Mma<T>(dk_acc[mt][2 * dd + 1], ads[mt], bq[2], bq[3]);
        }
      }
    }

    // Phase 3: dQ (unscaled) = dS K for 32 queries x kDqCols over the block's keys, into s_dq.
    // Reads only dS and K; the next iteration's first barrier orders it before dS is rewritten
    // and before thread 0 hands s_dq to the bulk reduction.
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
            Mma<T>(dq[mt][2 * dd], a[mt], bk[0], bk[1]);
            Mma<T>(dq[mt][2 * dd + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
      float* const dst = s_dq;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = p3_q + 16 * mt + lane / 4 + 8 * r;
#pragma unroll
          for (int nt = 0; nt < kDqTiles; ++nt) {
            const int col = p3_d + nt * 8 + 2 * (lane % 4);
            const float2 val = make_float2(dq[mt][nt][2 * r], dq[mt][nt][2 * r + 1]);
            *reinterpret_cast<float2*>(dst + DqSwizzle<kD>(row, col)) = val;
          }
        }
      }
      FenceProxyAsyncShared();  // these writes before the TMA reads them
    }
  }
  CpAsyncWait<0>();  // no query tiles: the K/V copies may still be in flight
  if (iters > 0) {
    __syncthreads();  // the last dQ tile is complete
    if (threadIdx.x == 0) {
      reduce_dq(iters - 1);
      BulkWait<0>();  // shared memory must outlive the reduction's reads
    }
  }

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
            Pack2<T>(dk_acc[mt][dt][2 * r] * scale, dk_acc[mt][dt][2 * r + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv + off + dt * 8) = Pack2<T>(dv_acc[mt][dt][2 * r], dv_acc[mt][dt][2 * r + 1]);
      }
    }
  }
}

// dq[b, i, h, :] = scale * workspace[b, h, i, :] (un-swizzled), 8 elements per thread: one float4
// pair in, one 16-byte store out, consecutive threads on consecutive output chunks.
template <typename T, int kD>
__global__ void ConvertDqV3Kernel(int64_t n8, int seq, int heads, int m_pad, float scale,
                                  const float* __restrict__ acc, T* __restrict__ dq) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  constexpr int kChunks = kD / 8;
  const int chunk = int(i % kChunks);
  const int64_t rest = i / kChunks;
  const int h = int(rest % heads);
  const int64_t bs = rest / heads;  // b * seq + row
  const int row = int(bs % seq);
  const int64_t b = bs / seq;
  const float* src = acc + ((b * heads + h) * m_pad + row) * kD + ((chunk ^ (row & 7)) << 3);
  const float4 lo = reinterpret_cast<const float4*>(src)[0];
  const float4 hi = reinterpret_cast<const float4*>(src)[1];
  uint4 out;
  out.x = Pack2<T>(lo.x * scale, lo.y * scale);
  out.y = Pack2<T>(lo.z * scale, lo.w * scale);
  out.z = Pack2<T>(hi.x * scale, hi.y * scale);
  out.w = Pack2<T>(hi.z * scale, hi.w * scale);
  reinterpret_cast<uint4*>(dq)[i] = out;
}

template <typename T, int kD>
absl::Status Launch(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                    const void* dout, const float* lse, const float* delta, float* dq_accum,
                    void* dq, void* dk, void* dv, cudaStream_t stream) {
  using C = BwdV3Config<kD, T>;
  const int m_pad = int(DqAccumRows(pr.seq_q));
  if (pr.seq_k > 0) {
    SG_RETURN_IF_ERROR(AllowSmem(AttentionBackwardV3Kernel<T, kD>, C::kSmemBytes));
    const int n_blocks = (pr.seq_k + C::kBlockN - 1) / C::kBlockN;
    SG_CHECK_ARG(n_blocks <= 65535, "CUDA attention backward v3: seq_k ", pr.seq_k,
                 " needs more than 65535 key blocks (the grid's y limit); use v2");
    const dim3 grid(pr.kv_heads, n_blocks, batch);
    AttentionBackwardV3Kernel<T, kD><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
        pr, m_pad, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<const T*>(dout), lse, delta, dq_accum, static_cast<T*>(dk), static_cast<T*>(dv));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionBackwardV3Kernel);
  }
  return LaunchConvertDqV3(kIsF16<T> ? DType::kF16 : DType::kBF16, pr, kD, batch, dq_accum, dq, stream);
}

template <typename T, int kD>
absl::Status LaunchConvert(const Problem& pr, int batch, const float* dq_accum, void* dq,
                           cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int m_pad = int(DqAccumRows(pr.seq_q));
  const int64_t n8 = int64_t(batch) * pr.seq_q * pr.heads * (kD / 8);
  ConvertDqV3Kernel<T, kD><<<unsigned((n8 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      n8, pr.seq_q, pr.heads, m_pad, pr.scale, dq_accum, static_cast<T*>(dq));
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ConvertDqV3Kernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchConvertDqV3(DType dtype, const Problem& pr, int head_dim, int batch,
                               const float* dq_accum, void* dq, cudaStream_t stream) {
  if (dtype == DType::kF16) {
    return head_dim == 64 ? LaunchConvert<f16, 64>(pr, batch, dq_accum, dq, stream)
                          : LaunchConvert<f16, 128>(pr, batch, dq_accum, dq, stream);
  }
  return head_dim == 64 ? LaunchConvert<bf16, 64>(pr, batch, dq_accum, dq, stream)
                        : LaunchConvert<bf16, 128>(pr, batch, dq_accum, dq, stream);
}

absl::Status LaunchBackwardV3(DType dtype, const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dq, void* dk, void* dv,
                              cudaStream_t stream) {
  if (dtype == DType::kF16) {
    return head_dim == 64 ? Launch<f16, 64>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream)
                          : Launch<f16, 128>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
  }
  return head_dim == 64 ? Launch<bf16, 64>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream)
                        : Launch<bf16, 128>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
}

}  // namespace sg::kernels::internal::attention_device
