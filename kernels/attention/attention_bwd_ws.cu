// CUDA flash attention backward, variant "ws" of family v5 (SG_ATTN_BWD_VARIANT=ws; v5's kernel,
// attention_bwd_v5.cu, stays the default until this one is measured): FlashAttention-3's warp
// specialization around v5's products. v5's loads are cp.async by all 256 threads, waited for at a
// block barrier each query tile; here a producer warp has the TMA unit fill mbarrier rings, so the
// consumers never issue or wait for a copy, and only the tensor cores' operands gate them.
//
// One block of 3 warpgroups per (kv head, 128-key block, batch), grid as v5 (key blocks heaviest
// first under a causal mask). Shapes and numerics as v5 (BwdV5Config: kBlockM = 128 query rows at
// D64, 64 at D128; P from the forward's lse; dS from the T-rounded P):
//   warpgroup 0, the producer (setmaxnreg 24): one thread loads K and V once (full_kv), then per
//     iteration `it` (the query tiles of every query head of the GQA group, as v5) Q, dO (4-D
//     tensor maps, 128-byte swizzled: the tile layout of attention_wgmma.cuh) and the lse and
//     delta rows (1-D maps of the flattened [b, h, seq_q] vectors) into stage it % kStages,
//     completing full[stage] with the bytes, after waiting for empty[stage] (one arrival per
//     consumer warp).
//   warpgroups 1 and 2, the consumers (setmaxnreg 240): warpgroup cg = wg - 1 owns keys
//     [64 cg, 64 cg + 64) of the block (v5's wg). Per iteration, as v5:
//       S^T = K Q^T; P^T (masked; rows past seq_q too: their lse is the next row's, see below)
//       dP^T = V dO^T and dV += P^T dO issued together; dS^T = P^T (dP^T - delta) under dV
//       dS^T stored (buffer it % 2)
//       named barrier 1 (both halves of dS^T stored)
//       dK += dS^T Q, A = dS^T read back from shared memory (v5: from registers; see
//       IssueDkShared), and dQ = dS K (warpgroup cg: rows or columns, as v5) issued together;
//       wait; release the stage (empty)
//       dQ -> the f32 tile in shared memory; named barrier 2, on which only the reducing warp
//       (consumer warp 0) waits -- the others arrive and go on to the next tile -- and whose lane
//       0 adds the tile to the workspace (TMA bulk reduce-add, v3's layout) while the consumers
//       compute the next S^T, P, dP^T.
//   Overlap: the next tiles' loads run under the current tile's math (2 stages); the dQ reduction
//   under the next tile's products; dV under the dS^T math (as v5).
// Buffers: dS^T is double-buffered, so that a warpgroup storing dS^T(it + 1) cannot overwrite
// what the other's dQ(it) product still reads (barrier 1 of it + 1 orders dS^T(it + 2) after it);
// the single f32 dQ tile is rewritten after barrier 1, which the reducing thread passes only once
// its previous bulk reduction has read the tile (BulkWaitRead).
// Rows past seq_q: Q and dO rows are zero-filled by the TMA unit, and their P is set to 0 by the
// mask (the 1-D lse / delta boxes run into the next head's rows, or zeros past the vector), so dS,
// dV and dK get nothing from them; the dQ tile's padding rows land in the workspace's padding.
// Every mbarrier wait traps after ~20 s (attention_tma.cuh) instead of hanging.
//
// Shared memory (D64 / D128): K, V 16 / 32 KiB each; Q and dO 2 stages of 16 KiB each; dS^T 2 x
// 32 / 16 KiB; dQ f32 32 KiB; lse and delta 2 stages; barriers; 1 KiB alignment slack:
// 195 / 194 KiB (BwdWsConfig::kSmemBytes). One block (384 threads) per SM.
// Resources (nvcc 13.0, sm_90a, -Xptxas -v): bf16 and f16, D64 and D128: 168 registers at launch
// (the warpgroups then run at 24 / 240), 0 bytes spilled, no wgmma serialization warning. (With dK's
// A operand in registers, as v5, D128 spilled 60 bytes under the 240 cap; v5 itself runs at 254.)
// Not measured yet (written without a GPU): compare with v5 on attention_benchmark backward_v5.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_bwd_v5.cuh"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_tiling.h"
#include "kernels/attention/attention_tma.cuh"
#include "kernels/attention/attention_wgmma.cuh"
#include "kernels/core/device.h"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kDim>
struct BwdWsConfig {
  using V5 = BwdV5Config<kDim>;
  static constexpr int kBlockN = V5::kBlockN, kBlockM = V5::kBlockM;
  static constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kStages = 2;
  static constexpr int kKvBytes = V5::kKvBytes, kQBytes = V5::kQBytes;
  static constexpr int kDsBytes = V5::kDsBytes, kDqBytes = V5::kDqBytes;
  static constexpr int kStatBytes = kBlockM * 4;  // lse or delta of one stage
  static constexpr int kBarriers = 1 + 2 * kStages;  // full_kv; full[s]; empty[s]
  // K, V, Q[kStages], dO[kStages], dS^T[2], dQ, lse[kStages], delta[kStages], barriers, + 1 KiB to
  // align the tiles to the 1024-byte swizzle atoms.
  static constexpr int kSmemBytes = 2 * kKvBytes + 2 * kStages * kQBytes + 2 * kDsBytes + kDqBytes +
                                    2 * kStages * kStatBytes + 8 * kBarriers + 1024;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  // Named barriers (0 is __syncthreads): dS^T complete; dQ tile complete.
  static constexpr int kBarDs = 1, kBarDq = 2, kConsumerThreads = 128 * kConsumers;
  static_assert(kBarDs != kBarDq && kBarDs > 0 && kBarDq > 0 && kConsumerThreads % 32 == 0,
                "named barriers 1..15 (0 is __syncthreads) over whole warps");
  static_assert(kBlockN == 64 * kConsumers, "each consumer warpgroup owns 64 keys (wgmma m64)");
  static_assert(kKvBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDsBytes % 1024 == 0 && kDqBytes % 1024 == 0,
                "tiles stay 1024-byte aligned");
  static_assert(kStatBytes % 128 == 0, "TMA destinations are 128-byte aligned");
  static_assert(kBlockM <= 256, "a TMA box has at most 256 rows");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                "register reallocation must fit the register file (one block per SM)");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Issues dK += dS^T Q for this warpgroup's 64 keys as one wgmma group, both operands from shared
// memory: A = its rows of the dS^T tile (ds_rows; K-major, the queries run along a row, as K in
// IssueQK), B = the Q tile through an MN-major descriptor (as dO in IssuePV). v5 takes A from
// registers; reading it back from the tile StoreDsT wrote frees those registers before the dQ
// product (ptxas: D128 spilled 60 bytes under the 240-register cap with dS^T in registers).
template <typename T, int kD, int kBlockM, int kBlockN>
__device__ __forceinline__ void IssueDkShared(float (&dk)[kD / 2], uint32_t ds_rows, uint32_t q_tile) {
  FenceOperands(dk);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; ++kk) {  // k16 step: queries 16 kk..
    const uint64_t a_desc = Sw128Desc(ds_rows + (kk / 4) * (kBlockN * 128) + (kk % 4) * 32, 16, 1024);
    const uint64_t b_desc = Sw128Desc(q_tile + kk * 16 * 128, kBlockM * 128, 1024);
    if constexpr (kD == 128) {
      WgmmaSS128<T, 0, 1>(dk, a_desc, b_desc, 1);
    } else {
      WgmmaSS64<T, 0, 1>(dk, a_desc, b_desc, 1);
    }
  }
  WgmmaCommit();
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename T, int kD>
__global__ void __launch_bounds__(384, 1)
    BwdWsKernel(const __grid_constant__ CUtensorMap tmap_q, const __grid_constant__ CUtensorMap tmap_do,
                const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                const __grid_constant__ CUtensorMap tmap_lse, const __grid_constant__ CUtensorMap tmap_delta,
                Problem pr, int m_pad, float* __restrict__ dq_accum, T* __restrict__ dk, T* __restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = BwdWsConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sk = (SmemAddr(smem) + 1023) & ~1023u;
  unsigned char* const base = smem + (sk - SmemAddr(smem));  // generic address of sk
  const uint32_t sv = sk + C::kKvBytes, sq = sv + C::kKvBytes;    // Q stage s at sq + s * kQBytes
  const uint32_t sdo = sq + kStages * C::kQBytes;                  // dO stage s at + s * kQBytes
  const uint32_t sds = sdo + kStages * C::kQBytes;                 // dS^T buffer i at + i * kDsBytes
  const uint32_t sdq = sds + 2 * C::kDsBytes;                      // [kBlockM][kD] f32, DqSwizzle
  const uint32_t slse = sdq + C::kDqBytes, sdelta = slse + kStages * C::kStatBytes;
  const uint32_t bars = sdelta + kStages * C::kStatBytes;
  float* const s_dq = reinterpret_cast<float*>(base + (sdq - sk));
  const float* const s_lse = reinterpret_cast<const float*>(base + (slse - sk));
  const float* const s_delta = reinterpret_cast<const float*>(base + (sdelta - sk));
  const uint32_t full_kv = bars;
  auto full = [&](int s) { return bars + 8 * (1 + s); };
  auto empty = [&](int s) { return bars + 8 * (1 + kStages + s); };

  const int n0 = blockIdx.y * kBlockN, kh = blockIdx.x, b = blockIdx.z;
  const int group = pr.heads / pr.kv_heads;
  // Query tiles that can see this key block, for every head of the group in turn (as v5).
  const int m_tiles = (pr.seq_q + kBlockM - 1) / kBlockM;
  const int m_first = FirstQueryTile(n0, kBlockM, m_tiles, pr.causal, pr.q_minus_k);
  const int per_head = m_tiles - m_first, iters = per_head * group;
  auto head_of = [&](int it) { return kh * group + it / per_head; };
  auto row_of = [&](int it) { return (m_first + it % per_head) * kBlockM; };

  if (threadIdx.x == 0) {
    MbarInit(full_kv, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full(s), 1);                // the producer's arrive.expect_tx
      MbarInit(empty(s), 4 * C::kConsumers);  // one arrival per consumer warp
    }
    FenceMbarInit();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {  // the producer
    SetMaxRegsDec<C::kProducerRegs>();
    if (threadIdx.x == 0 && iters > 0) {  // no query tiles: nothing to load, dK = dV = 0
      PrefetchTensorMap(&tmap_q);
      PrefetchTensorMap(&tmap_do);
      PrefetchTensorMap(&tmap_lse);
      PrefetchTensorMap(&tmap_delta);
      MbarArriveExpectTx(full_kv, 2 * C::kKvBytes);
#pragma unroll
      for (int cb = 0; cb < kD / 64; ++cb) {
        TmaLoad4d(sk + cb * kBlockN * 128, &tmap_k, 64 * cb, kh, n0, b, full_kv);
        TmaLoad4d(sv + cb * kBlockN * 128, &tmap_v, 64 * cb, kh, n0, b, full_kv);
      }
      for (int it = 0; it < iters; ++it) {
        const int s = it % kStages, h = head_of(it), m0 = row_of(it);
        MbarWait(empty(s), ((it / kStages) & 1) ^ 1);  // a fresh barrier reads parity 1 as done
        MbarArriveExpectTx(full(s), 2 * C::kQBytes + 2 * C::kStatBytes);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb) {
          TmaLoad4d(sq + s * C::kQBytes + cb * kBlockM * 128, &tmap_q, 64 * cb, h, m0, b, full(s));
          TmaLoad4d(sdo + s * C::kQBytes + cb * kBlockM * 128, &tmap_do, 64 * cb, h, m0, b, full(s));
        }
        const int stat = (b * pr.heads + h) * pr.seq_q + m0;  // < 2^31 (the launcher checks)
        TmaLoad1d(slse + s * C::kStatBytes, &tmap_lse, stat, full(s));
        TmaLoad1d(sdelta + s * C::kStatBytes, &tmap_delta, stat, full(s));
      }
    }
    return;
  }

  // The consumers.
  SetMaxRegsInc<C::kConsumerRegs>();
  const int cg = wg - 1, warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  const bool reducer = cg == 0 && warp == 0;  // lane 0 issues the dQ reductions
  float dk_acc[kD / 2], dv_acc[kD / 2];       // this warpgroup's 64 keys x kD (accumulator layout)
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk_acc[i] = dv_acc[i] = 0.f;
  const int key_row = 64 * cg + 16 * warp + lane / 4;  // this thread's keys in the block: + 0, + 8
  const uint32_t k_wg = sk + cg * 64 * 128, v_wg = sv + cg * 64 * 128;  // the warpgroup's rows

  if (iters > 0) MbarWait(full_kv, 0);
  for (int it = 0; it < iters; ++it) {
    const int stage = it % kStages, m0 = row_of(it);
    const uint32_t q_t = sq + stage * C::kQBytes, do_t = sdo + stage * C::kQBytes;
    const uint32_t ds_t = sds + (it & 1) * C::kDsBytes;
    const float* const lse_t = s_lse + stage * kBlockM;
    const float* const delta_t = s_delta + stage * kBlockM;
    MbarWait(full(stage), (it / kStages) & 1);

    float s[kBlockM / 2], dp[kBlockM / 2];
#pragma unroll
    for (int i = 0; i < kBlockM / 2; ++i) s[i] = dp[i] = 0.f;
    IssueQK<T, kD, kBlockN, kBlockM>(s, k_wg, q_t);  // S^T = K Q^T
    WgmmaWait<0>();
    FenceOperands(s);

    // P^T in place. Element i: key n0 + key_row + 8 ((i / 2) % 2), query m0 + 8 (i / 4) +
    // 2 (lane % 4) + i % 2. lse = -inf (the query sees no key): P = 0. Queries past seq_q: P = 0.
    const bool need_mask =
        m0 + kBlockM > pr.seq_q || TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      const float2 raw = *reinterpret_cast<const float2*>(lse_t + col);
      const float l2[2] = {raw.x == -INFINITY ? INFINITY : raw.x * kLog2e,
                           raw.y == -INFINITY ? INFINITY : raw.y * kLog2e};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float prob = FastExp2(fmaf(s[4 * j + e], pr.scale_log2, -l2[e & 1]));
        if (need_mask) {
          const int key = n0 + key_row + 8 * (e / 2), query = m0 + col + (e & 1);
          if (query >= pr.seq_q || key >= pr.seq_k ||
              (pr.causal && int64_t(key) > int64_t(query) + pr.q_minus_k)) {
            prob = 0.f;
          }
        }
        s[4 * j + e] = prob;
      }
    }
    uint32_t pp[kBlockM / 16][4], ds[kBlockM / 16][4];
    PackP<T, kBlockM>(pp, s);
    IssueQK<T, kD, kBlockN, kBlockM>(dp, v_wg, do_t);  // dP^T = V dO^T
    IssuePV<T, kD, kBlockM>(dv_acc, pp, do_t);         // dV += P^T dO
    WgmmaWait<1>();  // dP^T done; dV may still run
    FenceOperands(dp);

    // dS^T = P^T (dP^T - delta) from the T-rounded P, under the dV product (pp only read, as v5).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = 8 * kk + 2 * i, col = 8 * (e / 4) + 2 * (lane % 4);
        const float2 dl = *reinterpret_cast<const float2*>(delta_t + col);
        ds[kk][i] = Pack2<T>(Unpack2Lo<T>(pp[kk][i]) * (dp[e] - dl.x), Unpack2Hi<T>(pp[kk][i]) * (dp[e + 1] - dl.y));
      }
    }
    StoreDsT<kBlockM, kBlockN>(ds_t, ds, key_row, lane);
    FenceProxyAsyncShared();  // the dS^T stores, before the dK and dQ wgmmas read them
    // The previous dQ tile's reduction has read s_dq before anyone passes barrier 1, so this
    // iteration's dQ may overwrite it.
    if (reducer && lane == 0) BulkWaitRead<0>();
    NamedBarrierSync(C::kBarDs, C::kConsumerThreads);  // dS^T of both warpgroups stored

    float dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[i] = 0.f;
    IssueDkShared<T, kD, kBlockM, kBlockN>(dk_acc, ds_t + cg * 64 * 128, q_t);  // dK += dS^T Q
    IssueDq<T, kD, kBlockM, kBlockN>(dq, ds_t, sk, cg);
    WgmmaWait<0>();  // dV, dK and dQ done: Q, dO, lse and delta of this stage are no longer read
    FenceOperands(dv_acc);
    FenceOperands(dk_acc);
    FenceOperands(dq);
    FenceOperands(pp);
    if (lane == 0) MbarArrive(empty(stage));
    StoreDq<kD, kBlockM>(s_dq, dq, cg, warp, lane);
    FenceProxyAsyncShared();  // these writes before the TMA reads them
    if (reducer) {
      NamedBarrierSync(C::kBarDq, C::kConsumerThreads);  // the dQ tile is complete
      if (lane == 0) {
        float* dst = dq_accum + ((int64_t(b) * pr.heads + head_of(it)) * m_pad + m0) * kD;
        BulkReduceAddF32(dst, sdq, C::kDqBytes);
        BulkCommit();
      }
    } else {
      NamedBarrierArrive(C::kBarDq, C::kConsumerThreads);
    }
  }
  if (reducer && lane == 0 && iters > 0) BulkWait<0>();  // shared memory must outlive the reads

  const float scale = pr.scale;
#pragma unroll
  for (int i = 0; i < kD / 2; i += 2) {
    const int key = n0 + key_row + 8 * ((i / 2) % 2);
    if (key >= pr.seq_k) continue;
    const int64_t off = (int64_t(b) * pr.seq_k + key) * (int64_t(pr.kv_heads) * kD) + kh * kD + 8 * (i / 4) +
                        2 * (lane % 4);
    *reinterpret_cast<uint32_t*>(dk + off) = Pack2<T>(dk_acc[i] * scale, dk_acc[i + 1] * scale);
    *reinterpret_cast<uint32_t*>(dv + off) = Pack2<T>(dv_acc[i], dv_acc[i + 1]);
  }
#else
  __trap();  // wgmma and TMA need sm_90a; the dispatch launches this kernel only there
#endif
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int kD>
absl::Status LaunchWs(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                      const void* dout, const float* lse, const float* delta, float* dq_accum, void* dq,
                      void* dk, void* dv, cudaStream_t stream) {
  using C = BwdWsConfig<kD>;
  const DType dtype = kIsF16<T> ? DType::kF16 : DType::kBF16;
  const int m_pad = int(DqAccumRows(pr.seq_q));
  if (pr.seq_k > 0) {
    const int64_t stat_elems = int64_t(batch) * pr.heads * pr.seq_q;
    CUtensorMap map_q, map_do, map_k, map_v, map_lse, map_delta;
    SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_q, dtype, q, batch, pr.seq_q, pr.heads, kD, C::kBlockM));
    SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_do, dtype, dout, batch, pr.seq_q, pr.heads, kD, C::kBlockM));
    SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_k, dtype, k, batch, pr.seq_k, pr.kv_heads, kD, C::kBlockN));
    SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_v, dtype, v, batch, pr.seq_k, pr.kv_heads, kD, C::kBlockN));
    SG_RETURN_IF_ERROR(EncodeF32VectorMap(&map_lse, lse, stat_elems, C::kBlockM));
    SG_RETURN_IF_ERROR(EncodeF32VectorMap(&map_delta, delta, stat_elems, C::kBlockM));
    auto* kernel = BwdWsKernel<T, kD>;
    SG_RETURN_IF_ERROR(AllowSmem(kernel, C::kSmemBytes));
    const int n_blocks = (pr.seq_k + C::kBlockN - 1) / C::kBlockN;
    SG_CHECK_ARG(n_blocks <= 65535, "CUDA attention backward ws: seq_k ", pr.seq_k,
                 " needs more than 65535 key blocks (the grid's y limit)");
    const dim3 grid(pr.kv_heads, n_blocks, batch);
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(map_q, map_do, map_k, map_v, map_lse, map_delta, pr,
                                                         m_pad, dq_accum, static_cast<T*>(dk), static_cast<T*>(dv));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(BwdWsKernel);
  }
  return LaunchConvertDqV3(dtype, pr, kD, batch, dq_accum, dq, stream);
}

template <typename T>
absl::Status LaunchWsDim(const Problem& pr, int head_dim, int batch, const void* q, const void* k, const void* v,
                         const void* dout, const float* lse, const float* delta, float* dq_accum, void* dq,
                         void* dk, void* dv, cudaStream_t stream) {
  if (head_dim == 64) return LaunchWs<T, 64>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
  return LaunchWs<T, 128>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
}

}  // namespace

absl::Status LaunchBackwardWs(DType dtype, const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dq, void* dk, void* dv,
                              cudaStream_t stream) {
  SG_RETURN_IF_ERROR(RequireSm90("attention ws wgmma backward"));
  for (const void* p : {q, k, v, dout, static_cast<const void*>(lse), static_cast<const void*>(delta)}) {
    if (!Aligned16(p)) {
      return absl::UnimplementedError("attention ws backward: TMA needs 16-byte-aligned q, k, v, dout, lse, delta");
    }
  }
  // The stat coordinate (b * heads + h) * seq_q + m0 is a 32-bit TMA coordinate.
  if (int64_t(batch) * pr.heads * pr.seq_q + 256 > (int64_t(1) << 31) - 1) {
    return absl::UnimplementedError("attention ws backward: batch * heads * seq_q must fit in 2^31 - 256");
  }
  if (dtype == DType::kF16) {
    return LaunchWsDim<f16>(pr, head_dim, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
  }
  return LaunchWsDim<bf16>(pr, head_dim, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
}

}  // namespace sg::kernels::internal::attention_device
