// CUDA flash attention backward, family v5 (SG_ATTENTION_KERNEL=v5: v4's wgmma forward and this
// backward): Hopper warpgroup MMA (wgmma.mma_async, sm_90a), FlashAttention-3's decomposition. v3's
// mma.sync backward (attention_bwd_v3.cu) tops out near two thirds of the tensor throughput, as the
// mma.sync forward did before the wgmma forward.
//
// One block of 2 warpgroups per (kv head, 128-key block, batch), grid ordered as v3 (key blocks
// heaviest first under a causal mask, kv heads fastest). Warpgroup wg owns keys [64 wg, 64 wg + 64)
// of the block; K and V stay in shared memory; the block loops over the query tiles of every query
// head of its GQA group (dK and dV sum over the group in registers, as v3), kBlockM = 128 queries
// at head_dim 64, 64 at 128. Q, dO and delta of the next tile are copied (cp.async, all threads)
// into the other stage of a 2-stage ring while a tile is computed; its lse is loaded into a
// register and stored to that stage in the log2 domain at the end of the tile. Per query tile:
//   S^T  = K Q^T     wgmma m64n{kBlockM}k16 SS, K and Q K-major
//   P^T  = 2^(S^T scale log2e - lse log2e) (masked: 0; lse log2e from shared memory), packed to T
//   dP^T = V dO^T    wgmma m64n{kBlockM}k16 SS, V and dO K-major        } issued together
//   dV  += P^T dO    wgmma m64n{D}k16 RS: A = P^T from registers,       }
//                    B = dO MN-major (as V in the forward's P V)
//   dS^T = P^T (dP^T - delta), under the dV product; packed to T; stored to shared memory
//                    (swizzled [key][query])
//   dK  += dS^T Q    wgmma m64n{D}k16 RS: A = dS^T from registers, B = Q MN-major
//   barrier (dS^T of both warpgroups complete)
//   dQ   = dS K      wgmma m64n64k16 SS: A = dS from the dS^T tile MN-major (transposed A), B = K
//                    MN-major; warpgroup wg takes query rows [64 wg, ..) at D64, columns at D128
//   dQ tile (f32) -> shared memory (DqSwizzle), added to the workspace by one thread with v3's
//                    TMA bulk reduction at the next iteration's barrier; v3's ConvertDqV3Kernel
//                    turns the workspace into dq.
// P uses lse from the forward (no running max); dS is computed from the T-rounded P that dV uses.
// Rows past seq_q are zero-filled (Q, dO, lse, delta), so their P is 1 but dS = 0 and every
// product with dO vanishes; keys past seq_k are masked.
// Element types: bf16 and f16 (IEEE half), the same kernel with the f16 wgmma.
//
// Order (kOverlapDp, SG_ATTN_BWD_V5_ORDER=overlap, read once per process; opt-in): S^T and dP^T
// are issued together, then the next tile's copies, and P is computed while dP^T runs; dV follows.
// It runs 5.4% / 7.6% faster alone at D64 / D128 causal on the H200, but 0.4% slower in the
// power-limited 1b step (2026-12-03, benchmarks/README.md), so the default keeps the order above.
//
// Not here (FA3): a producer warp with TMA loads and mbarriers, register reallocation between
// producer and consumers, overlap of the dQ product with the next tile's S^T / dP^T.
//
// Occupancy: one block of 256 threads per SM; dynamic shared memory 163 KB at D64, 178 KB at
// D128 (BwdV5Config::kSmemBytes). ptxas (nvcc 13.0, -Xptxas -v, sm_90a): bf16 254 / 251 registers
// at D64 / D128, f16 254 / 245, the overlap order 255 at both; zero spills, no wgmma serialization
// warning.
//
// Instructions (2026-12-04, Nsight Compute at the 1b's shape, D64 causal): 276.6 M warp
// instructions a call, 15.5 a score, from 353.5 M before two changes. The wgmma descriptors of a
// product are advanced from one base (sm90::Sw128DescAdvance) instead of built per k-step, from a
// warpgroup index the compiler knows is warp-uniform. Before, each descriptor took ~3-4 integer
// instructions and a move to a uniform register. And lse is stored in the log2 domain once a row
// instead of converted once a score. 3.0% faster a call at both head dims. (An
// earlier order -- S^T and dP^T issued together, P computed under the dP^T product -- held both
// accumulators with dK and dV and spilled 8 bytes at D64.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/attention/attention_bwd_v5.cuh"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_tiling.h"
#include "kernels/core/device.h"
#include "kernels/attention/attention_wgmma.cuh"

namespace sg::kernels::internal::attention_device {
namespace {

// T: the element type of q, k, v, dout, dk, dv (bf16 or f16).
template <typename T, int kD, bool kOverlapDp>
__global__ void __launch_bounds__(BwdV5Config<kD>::kThreads, 1)
    AttentionBackwardV5Kernel(Problem pr, int m_pad, const T* __restrict__ q,
                              const T* __restrict__ k, const T* __restrict__ v,
                              const T* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ delta, float* __restrict__ dq_accum,
                              T* __restrict__ dk, T* __restrict__ dv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = BwdV5Config<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kThreads = C::kThreads;
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const base = smem + (1024 - SmemAddr(smem) % 1024) % 1024;
  const uint32_t sk = SmemAddr(base), sv = sk + C::kKvBytes;
  const uint32_t sq = sv + C::kKvBytes, sdo = sq + 2 * C::kQBytes;  // stage s at + s * kQBytes
  const uint32_t sds = sdo + 2 * C::kQBytes, sdq = sds + C::kDsBytes;
  float* const s_dq = reinterpret_cast<float*>(base + (sdq - sk));  // [kBlockM][kD], DqSwizzle
  float* const s_lse = s_dq + kBlockM * kD;                         // [2][kBlockM], log2 domain
  float* const s_delta = s_lse + 2 * kBlockM;                       // [2][kBlockM]

  // The warpgroup through a shuffle, so the compiler knows it is warp-uniform and keeps the tile
  // addresses and wgmma descriptors built from it in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int n0 = blockIdx.y * kBlockN, kh = blockIdx.x, b = blockIdx.z;
  const int group = pr.heads / pr.kv_heads;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const int64_t kv_off = (int64_t(b) * pr.seq_k + n0) * k_row + kh * kD;

  // Query tiles that can see this key block: causal rows i >= n0 - q_minus_k; every head of the
  // group in turn.
  const int m_tiles = (pr.seq_q + kBlockM - 1) / kBlockM;
  const int m_first = FirstQueryTile(n0, kBlockM, m_tiles, pr.causal, pr.q_minus_k);
  const int per_head = m_tiles - m_first, iters = per_head * group;
  auto head_of = [&](int it) { return kh * group + it / per_head; };
  auto row_of = [&](int it) { return (m_first + it % per_head) * kBlockM; };

  // Issues the copies of iteration `it` (Q, dO tiles; delta; zeros past seq_q) into `stage`, and
  // the load of its lse into `lse_next` (threads < kBlockM: row threadIdx.x), which store_lse puts
  // into the stage in the log2 domain the exponentials take (-inf, a row that sees no key: +inf, so
  // P = 0): once a row per iteration instead of once a score.
  float lse_next = 0.f;
  auto load_q = [&](int it, int stage) {
    const int h = head_of(it), m0 = row_of(it);
    const int64_t off = (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
    LoadSwizzled<kBlockM, kD, kThreads>(sq + stage * C::kQBytes, q + off, q_row, pr.seq_q - m0);
    LoadSwizzled<kBlockM, kD, kThreads>(sdo + stage * C::kQBytes, dout + off, q_row, pr.seq_q - m0);
    if (threadIdx.x < 2 * kBlockM) {
      const int i = threadIdx.x % kBlockM;
      const bool valid = m0 + i < pr.seq_q;
      const int64_t st = (int64_t(b) * pr.heads + h) * pr.seq_q + (valid ? m0 + i : 0);
      if (threadIdx.x < kBlockM) {
        lse_next = valid ? lse[st] : 0.f;
      } else {
        CpAsync4(SmemAddr(s_delta + stage * kBlockM + i), delta + st, valid);
      }
    }
  };
  // Before the barrier that hands `stage` to the next iteration (its previous reader is past it).
  auto store_lse = [&](int stage) {
    if (threadIdx.x < kBlockM) {
      s_lse[stage * kBlockM + threadIdx.x] = lse_next == -INFINITY ? INFINITY : lse_next * kLog2e;
    }
  };
  // Adds the dQ tile of iteration `it` (complete in s_dq, fenced for the async proxy by every
  // writer, then a barrier) to the workspace. Thread 0 only.
  auto reduce_dq = [&](int it) {
    float* dst = dq_accum + ((int64_t(b) * pr.heads + head_of(it)) * m_pad + row_of(it)) * kD;
    BulkReduceAddF32(dst, SmemAddr(s_dq), C::kDqBytes);
    BulkCommit();
  };

  LoadSwizzled<kBlockN, kD, kThreads>(sk, k + kv_off, k_row, pr.seq_k - n0);
  LoadSwizzled<kBlockN, kD, kThreads>(sv, v + kv_off, k_row, pr.seq_k - n0);
  if (iters > 0) {
    load_q(0, 0);
    store_lse(0);
  }
  CpAsyncCommit();

  float dk_acc[kD / 2], dv_acc[kD / 2];  // this warpgroup's 64 keys x kD (accumulator layout)
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk_acc[i] = dv_acc[i] = 0.f;
  const int key_row = 64 * wg + 16 * warp + lane / 4;  // this thread's keys in the block: + 0, + 8
  const uint32_t k_wg = sk + wg * 64 * 128, v_wg = sv + wg * 64 * 128;  // the warpgroup's rows

  for (int it = 0; it < iters; ++it) {
    const int stage = it & 1, m0 = row_of(it);
    const uint32_t q_t = sq + stage * C::kQBytes, do_t = sdo + stage * C::kQBytes;
    const float* const lse_t = s_lse + stage * kBlockM;
    const float* const delta_t = s_delta + stage * kBlockM;
    // This iteration's tiles have landed and are visible to wgmma; every thread is done with the
    // previous iteration (its stage, dS^T, and its dQ tile writes, fenced for the bulk reduction).
    CpAsyncWait<0>();
    FenceProxyAsyncShared();
    __syncthreads();
    if (threadIdx.x == 0 && it > 0) reduce_dq(it - 1);
    if (!kOverlapDp) {
      if (it + 1 < iters) load_q(it + 1, stage ^ 1);
      CpAsyncCommit();
    }

    float s[kBlockM / 2], dp[kBlockM / 2];
#pragma unroll
    for (int i = 0; i < kBlockM / 2; ++i) s[i] = dp[i] = 0.f;
    IssueQK<T, kD, kBlockN, kBlockM>(s, k_wg, q_t);  // S^T = K Q^T
    if constexpr (kOverlapDp) {
      IssueQK<T, kD, kBlockN, kBlockM>(dp, v_wg, do_t);  // dP^T = V dO^T, under P's exponentials
      // The next tile's copies are issued under both products (the stage they fill was last read
      // by the previous iteration's products, all waited for before the barrier).
      if (it + 1 < iters) load_q(it + 1, stage ^ 1);
      CpAsyncCommit();
      WgmmaWait<1>();
    } else {
      WgmmaWait<0>();
    }
    FenceOperands(s);

    // P^T in place. Element i: key n0 + key_row + 8 ((i / 2) % 2), query m0 + 8 (i / 4) +
    // 2 (lane % 4) + i % 2. lse = -inf (the query sees no key): P = 0.
    const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      const float2 l2v = *reinterpret_cast<const float2*>(lse_t + col);
      const float l2[2] = {l2v.x, l2v.y};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float prob = FastExp2(fmaf(s[4 * j + e], pr.scale_log2, -l2[e & 1]));
        if (need_mask) {
          const int key = n0 + key_row + 8 * (e / 2), query = m0 + col + (e & 1);
          if (key >= pr.seq_k || (pr.causal && int64_t(key) > int64_t(query) + pr.q_minus_k)) prob = 0.f;
        }
        s[4 * j + e] = prob;
      }
    }
    uint32_t pp[kBlockM / 16][4], ds[kBlockM / 16][4];
    PackP<T, kBlockM>(pp, s);
    if constexpr (kOverlapDp) {
      WgmmaWait<0>();  // dP^T done
      FenceOperands(dp);
      IssuePV<T, kD, kBlockM>(dv_acc, pp, do_t);  // dV += P^T dO
    } else {
      IssueQK<T, kD, kBlockN, kBlockM>(dp, v_wg, do_t);  // dP^T = V dO^T
      IssuePV<T, kD, kBlockM>(dv_acc, pp, do_t);  // dV += P^T dO
      WgmmaWait<1>();  // dP^T done; dV may still run
      FenceOperands(dp);
    }

    // dS^T = P^T (dP^T - delta) from the T-rounded P, under the dV product. pp is only read here
    // while that product reads it too (no write: nothing to serialize, and no ptxas warning);
    // FenceOperands(pp) below keeps its registers allocated until the product is waited for.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = 8 * kk + 2 * i, col = 8 * (e / 4) + 2 * (lane % 4);
        const float2 dl = *reinterpret_cast<const float2*>(delta_t + col);
        ds[kk][i] = Pack2<T>(Unpack2Lo<T>(pp[kk][i]) * (dp[e] - dl.x),
                             Unpack2Hi<T>(pp[kk][i]) * (dp[e + 1] - dl.y));
      }
    }
    StoreDsT<kBlockM, kBlockN>(sds, ds, key_row, lane);
    IssuePV<T, kD, kBlockM>(dk_acc, ds, q_t);   // dK += dS^T Q
    FenceProxyAsyncShared();  // the dS^T stores, before the dQ wgmma (async proxy) reads them
    // The previous dQ tile's bulk reduction has finished reading s_dq before anyone passes the
    // barrier, so this iteration's dQ may overwrite it.
    if (threadIdx.x == 0) BulkWaitRead<0>();
    __syncthreads();  // dS^T of both warpgroups complete

    float dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[i] = 0.f;
    IssueDq<T, kD, kBlockM, kBlockN>(dq, sds, sk, wg);
    WgmmaWait<0>();  // dV, dK and dQ done
    FenceOperands(dv_acc);
    FenceOperands(dk_acc);
    FenceOperands(dq);
    FenceOperands(pp);
    FenceOperands(ds);
    StoreDq<kD, kBlockM>(s_dq, dq, wg, warp, lane);
    FenceProxyAsyncShared();  // these writes before the TMA reads them
    if (it + 1 < iters) store_lse(stage ^ 1);
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
  for (int i = 0; i < kD / 2; i += 2) {
    const int key = n0 + key_row + 8 * ((i / 2) % 2);
    if (key >= pr.seq_k) continue;
    const int64_t off = (int64_t(b) * pr.seq_k + key) * k_row + kh * kD + 8 * (i / 4) + 2 * (lane % 4);
    *reinterpret_cast<uint32_t*>(dk + off) = Pack2<T>(dk_acc[i] * scale, dk_acc[i + 1] * scale);
    *reinterpret_cast<uint32_t*>(dv + off) = Pack2<T>(dv_acc[i], dv_acc[i + 1]);
  }
#else
  __trap();  // wgmma needs sm_90a; the dispatch launches this kernel only there
#endif
}

template <typename T, int kD>
absl::Status Launch(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                    const void* dout, const float* lse, const float* delta, float* dq_accum,
                    void* dq, void* dk, void* dv, cudaStream_t stream) {
  using C = BwdV5Config<kD>;
  const int m_pad = int(DqAccumRows(pr.seq_q));
  if (pr.seq_k > 0) {
    static const bool overlap = [] {
      const char* e = std::getenv("SG_ATTN_BWD_V5_ORDER");
      return e != nullptr && std::string_view(e) == "overlap";
    }();
    auto* kernel = overlap ? AttentionBackwardV5Kernel<T, kD, true> : AttentionBackwardV5Kernel<T, kD, false>;
    SG_RETURN_IF_ERROR(AllowSmem(kernel, C::kSmemBytes));
    const int n_blocks = (pr.seq_k + C::kBlockN - 1) / C::kBlockN;
    SG_CHECK_ARG(n_blocks <= 65535, "CUDA attention backward v5: seq_k ", pr.seq_k,
                 " needs more than 65535 key blocks (the grid's y limit)");
    const dim3 grid(pr.kv_heads, n_blocks, batch);
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(
        pr, m_pad, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<const T*>(dout), lse, delta, dq_accum, static_cast<T*>(dk), static_cast<T*>(dv));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionBackwardV5Kernel);
  }
  return LaunchConvertDqV3(kIsF16<T> ? DType::kF16 : DType::kBF16, pr, kD, batch, dq_accum, dq, stream);
}

}  // namespace

absl::Status LaunchBackwardV5(DType dtype, const Problem& pr, int head_dim, int batch, const void* q,
                              const void* k, const void* v, const void* dout, const float* lse,
                              const float* delta, float* dq_accum, void* dq, void* dk, void* dv,
                              cudaStream_t stream) {
  SG_RETURN_IF_ERROR(RequireSm90("attention v5 wgmma backward"));
  if (dtype == DType::kF16) {
    return head_dim == 64
               ? Launch<f16, 64>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream)
               : Launch<f16, 128>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
  }
  return head_dim == 64
             ? Launch<bf16, 64>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream)
             : Launch<bf16, 128>(pr, batch, q, k, v, dout, lse, delta, dq_accum, dq, dk, dv, stream);
}

}  // namespace sg::kernels::internal::attention_device
