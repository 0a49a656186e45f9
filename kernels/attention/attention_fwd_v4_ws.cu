// CUDA flash attention forward, v4 variant "ws" (the default forward of families v4 and v5;
// SG_ATTN_FWD_VARIANT=ws): the FlashAttention-3 structure on Hopper -- warp specialization, a TMA
// producer and two wgmma consumer warpgroups, the softmax overlapped with the tensor cores.
//
// One block of 3 warpgroups per (128-query tile, head, batch), one block per SM:
//   warpgroup 0, the producer (setmaxnreg 24): one thread has the TMA unit load Q once and then,
//     per 128-key tile t, K(t) and V(t) into stage t % kStages of two rings (K and V apart, so a K
//     stage is refilled as soon as its QK^T is done, a V stage after its PV). Each load completes
//     its stage's `full` mbarrier with the bytes; the producer first waits for the stage's `empty`
//     mbarrier (one arrival per consumer warp, 8 in all).
//   warpgroups 1 and 2, the consumers (setmaxnreg 240): query rows [m0 + 64 cg, + 64), cg = wg - 1.
//     Per tile, intra-warpgroup pipelining (FA3's "intra-warpgroup overlap"):
//       issue S(t) = Q K(t)^T, then O += P(t-1) V(t-1)     (two wgmma groups)
//       wait for S(t) (PV still running); release K(t); mask and softmax S(t) under the PV
//       wait for the PV; release V(t-1); rescale O by alpha(t); pack P(t)
//     so the exp2s of tile t run while the tensor cores do P(t-1) V(t-1).
//   Inter-warpgroup ping-pong: the consumers issue their GEMMs in turns (named barriers 1 and 2:
//     warpgroup cg syncs on 1 + cg before issuing and arrives on 2 - cg after), so one warpgroup's
//     softmax runs while the other's GEMMs hold the tensor cores. (Without it, the deleted "wsi",
//     288.2 / 457.4 TFLOP/s causal at D64 / D128 against 334.9 / 503.2 on the H200.)
// Ring parity: tile t uses stage t % kStages in round t / kStages; consumers wait `full` for parity
// round & 1, the producer waits `empty` for (round & 1) ^ 1 (a fresh barrier reads parity 1 as done).
// Every mbarrier wait traps after ~20 s (sm90::MbarWait, kernels/core/sm90.h) instead of hanging.
// Shared memory: Q [128][D], kStages K and V tiles [128][D] (128-byte swizzled column blocks of 64,
// attention_wgmma.cuh), the barriers; TMA zero-fills positions past the sequence (masked as keys;
// P = 0 there against zero V rows; query rows past seq_q are computed and not written).
// Numerics as "wgmma": log2-domain online softmax on raw scores (scale > 0), f32 O, lse in natural
// log as [b, h, row]; T = bf16 or f16 (P rounded to T for P V).
//
// Resources (nvcc 13.0, sm_90a, -Xptxas -v): every instantiation (bf16 / f16, D64 / D128) 168
// registers at launch (the warpgroups then run at 24 / 240), 0 bytes spilled, no C7512
// (wgmma serialization) warning -- the mbarrier timeout's trap sits out of line (sm90::TrapOnTimeout
// says why: inline, it made D128 spill 240 bytes). Shared memory: D64 4 stages, 16 + 4 * 32 KiB +
// 1 KiB = 145 KiB; D128 2 stages, 32 + 2 * 64 + 1 = 161 KiB. One block (384 threads) per SM.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_fwd_v4.cuh"
#include "kernels/attention/attention_tiling.h"
#include "kernels/attention/attention_tma.cuh"
#include "kernels/attention/attention_wgmma.cuh"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kDim>
struct WsFwdConfig {
  static constexpr int kD = kDim, kBlockM = 128, kBlockN = 128;
  static constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers);
  static constexpr int kStages = kD == 64 ? 4 : 2;
  static constexpr int kQBytes = kBlockM * kD * 2, kKvBytes = kBlockN * kD * 2;
  // full_q, then full_k, full_v, empty_k, empty_v, kStages each.
  static constexpr int kBarriers = 1 + 4 * kStages;
  // + 1 KiB to align the tiles to the 1024-byte swizzle atoms.
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 8 * kBarriers + 1024;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128 (whole 64-column TMA boxes)");
  static_assert(kBlockM == 64 * kConsumers, "each consumer warpgroup owns 64 query rows (wgmma m64)");
  static_assert(kQBytes % 1024 == 0 && kKvBytes % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
  // The launch gives 65536 / 384 = 168 registers a thread; the producer's release pays for the raise.
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 168 * kThreads,
                "register reallocation must fit the registers the block was launched with");
};

template <typename T, int kD>
__global__ void __launch_bounds__(384, 1)
    WsFwdKernel(const __grid_constant__ CUtensorMap tmap_q, const __grid_constant__ CUtensorMap tmap_k,
                const __grid_constant__ CUtensorMap tmap_v, Problem pr, T* __restrict__ out,
                float* __restrict__ lse) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WsFwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sq = (SmemAddr(smem) + 1023) & ~1023u;
  const uint32_t sk = sq + C::kQBytes, sv = sk + kStages * C::kKvBytes;  // stage s at + s * kKvBytes
  const uint32_t bars = sv + kStages * C::kKvBytes;
  const uint32_t full_q = bars;
  auto full_k = [&](int s) { return bars + 8 * (1 + s); };
  auto full_v = [&](int s) { return bars + 8 * (1 + kStages + s); };
  auto empty_k = [&](int s) { return bars + 8 * (1 + 2 * kStages + s); };
  auto empty_v = [&](int s) { return bars + 8 * (1 + 3 * kStages + s); };

  const int m_block = pr.causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);  // heaviest first
  const int h = blockIdx.x, b = blockIdx.z, kh = h / (pr.heads / pr.kv_heads);
  const int m0 = m_block * kBlockM;
  const int n_end = VisibleKeyEnd(min(m0 + kBlockM, pr.seq_q), pr.seq_k, pr.causal, pr.q_minus_k);
  const int n_tiles = (n_end + kBlockN - 1) / kBlockN;

  if (threadIdx.x == 0) {
    MbarInit(full_q, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_k(s), 1);  // the producer's arrive.expect_tx
      MbarInit(full_v(s), 1);
      MbarInit(empty_k(s), 4 * C::kConsumers);  // one arrival per consumer warp
      MbarInit(empty_v(s), 4 * C::kConsumers);
    }
    FenceMbarInit();
  }
  __syncthreads();

  // Through a shuffle, so the compiler knows the warpgroup is warp-uniform and may keep the
  // consumers' tile addresses and wgmma descriptors in uniform registers (as in the v5 backward,
  // where it removed the moves to them; here the forward's time did not change, gpu_call127.sh).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {  // the producer
    SetMaxRegsDec<C::kProducerRegs>();
    // With no visible keys nothing is loaded (the consumers wait for nothing and write zeros).
    if (threadIdx.x == 0 && n_tiles > 0) {
      PrefetchTensorMap(&tmap_q);
      PrefetchTensorMap(&tmap_k);
      PrefetchTensorMap(&tmap_v);
      MbarArriveExpectTx(full_q, C::kQBytes);
#pragma unroll
      for (int cb = 0; cb < kD / 64; ++cb) TmaLoad4d(sq + cb * kBlockM * 128, &tmap_q, 64 * cb, h, m0, b, full_q);
      for (int t = 0; t < n_tiles; ++t) {
        const int s = t % kStages, n0 = t * kBlockN;
        const uint32_t free_parity = ((t / kStages) & 1) ^ 1;
        MbarWait(empty_k(s), free_parity);
        MbarArriveExpectTx(full_k(s), C::kKvBytes);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb) {
          TmaLoad4d(sk + s * C::kKvBytes + cb * kBlockN * 128, &tmap_k, 64 * cb, kh, n0, b, full_k(s));
        }
        MbarWait(empty_v(s), free_parity);
        MbarArriveExpectTx(full_v(s), C::kKvBytes);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb) {
          TmaLoad4d(sv + s * C::kKvBytes + cb * kBlockN * 128, &tmap_v, 64 * cb, kh, n0, b, full_v(s));
        }
      }
    }
    return;
  }

  // The consumers.
  SetMaxRegsInc<C::kConsumerRegs>();
  const int cg = wg - 1, warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  auto release = [&](uint32_t bar) {  // this warp is done reading the stage (its wgmma groups waited)
    if (lane == 0) MbarArrive(bar);
  };
  // Ping-pong turns: warpgroup cg issues its GEMMs between my_turn (named barrier 1 + cg: the other
  // warpgroup's hand-off is in) and their_turn (hands off on 2 - cg). Warpgroup 1 hands warpgroup 0
  // the first turn and skips its last hand-off, so each barrier's arrivals match its syncs.
  auto my_turn = [&] { NamedBarrierSync(1 + cg, 256); };
  auto their_turn = [&] { NamedBarrierArrive(2 - cg, 256); };

  float o[kD / 2];  // m64n{kD} accumulator: n8 chunk j holds (row g, 8j + 2t..), (row g + 8, ..)
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float s[kBlockN / 2];
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.f;  // read (and overwritten) by the first QK^T
  uint32_t p[kBlockN / 16][4];
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
  const int first_row = m0 + 64 * cg + 16 * warp + lane / 4;  // and first_row + 8
  const uint32_t q_tile = sq + cg * 64 * 128;                  // this warpgroup's 64 rows of Q

  if (n_tiles > 0) {
    if (cg == 1) NamedBarrierArrive(1, 256);  // warpgroup 0 goes first
    MbarWait(full_q, 0);
    MbarWait(full_k(0), 0);
    my_turn();
    IssueQK<T, kD, kBlockM, kBlockN>(s, q_tile, sk);
    their_turn();
    WgmmaWait<0>();
    FenceOperands(s);
    release(empty_k(0));
    MaskTile<kBlockN>(s, pr, m0, 0, first_row, lane);
    SoftmaxTile<kBlockN>(s, row_max, row_sum, alpha, pr.scale_log2);
    PackP<T, kBlockN>(p, s);  // O is still zero: no rescale
    for (int t = 1; t < n_tiles; ++t) {
      const int sk_t = t % kStages, sv_prev = (t - 1) % kStages;
      MbarWait(full_k(sk_t), (t / kStages) & 1);
      my_turn();
      IssueQK<T, kD, kBlockM, kBlockN>(s, q_tile, sk + sk_t * C::kKvBytes);
      MbarWait(full_v(sv_prev), ((t - 1) / kStages) & 1);
      IssuePV<T, kD, kBlockN>(o, p, sv + sv_prev * C::kKvBytes);
      their_turn();
      WgmmaWait<1>();  // groups complete in order: S(t) is done, PV(t - 1) may still run
      FenceOperands(s);
      release(empty_k(sk_t));
      MaskTile<kBlockN>(s, pr, m0, t * kBlockN, first_row, lane);
      SoftmaxTile<kBlockN>(s, row_max, row_sum, alpha, pr.scale_log2);
      WgmmaWait<0>();
      FenceOperands(o);
      FenceOperands(p);
      release(empty_v(sv_prev));
      RescaleO<kD>(o, alpha);
      PackP<T, kBlockN>(p, s);
    }
    // The last tile's PV (its V stage is never refilled, so it is not released).
    const int last = n_tiles - 1, sv_last = last % kStages;
    MbarWait(full_v(sv_last), (last / kStages) & 1);
    my_turn();
    IssuePV<T, kD, kBlockN>(o, p, sv + sv_last * C::kKvBytes);
    if (cg == 0) their_turn();
    WgmmaWait<0>();
    FenceOperands(o);
    FenceOperands(p);
  }

  StoreForwardRows<T, kD>(o, row_max, row_sum, pr, b, h, first_row, lane, out, lse);
#else
  __trap();  // wgmma and TMA need sm_90a; the dispatch launches this kernel only there
#endif
}

template <typename T, int kD>
absl::Status LaunchWs(const Problem& pr, int batch, const void* q, const void* k, const void* v, void* out,
                      float* lse, cudaStream_t stream) {
  using C = WsFwdConfig<kD>;
  const DType dtype = kIsF16<T> ? DType::kF16 : DType::kBF16;
  CUtensorMap map_q, map_k, map_v;
  SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_q, dtype, q, batch, pr.seq_q, pr.heads, kD, C::kBlockM));
  SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_k, dtype, k, batch, pr.seq_k, pr.kv_heads, kD, C::kBlockN));
  SG_RETURN_IF_ERROR(EncodeHeadTileMap(&map_v, dtype, v, batch, pr.seq_k, pr.kv_heads, kD, C::kBlockN));
  auto* kernel = WsFwdKernel<T, kD>;
  const int m_blocks = (pr.seq_q + C::kBlockM - 1) / C::kBlockM;
  SG_CHECK_ARG(m_blocks <= 65535, "attention v4 ws forward: at most 65535 query tiles of ", C::kBlockM,
               " rows, found seq_q ", pr.seq_q);
  SG_RETURN_IF_ERROR(AllowSmem(kernel, C::kSmemBytes));
  kernel<<<dim3(pr.heads, m_blocks, batch), C::kThreads, C::kSmemBytes, stream>>>(
      map_q, map_k, map_v, pr, static_cast<T*>(out), lse);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(WsFwdKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchWsDim(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                         const void* v, void* out, float* lse, cudaStream_t stream) {
  if (head_dim == 64) return LaunchWs<T, 64>(pr, batch, q, k, v, out, lse, stream);
  return LaunchWs<T, 128>(pr, batch, q, k, v, out, lse, stream);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status EncodeHeadTileMap(CUtensorMap* map, DType dtype, const void* base, int64_t batch, int64_t seq,
                               int64_t heads, int64_t head_dim, int box_rows) {
  SG_CHECK_ARG(Aligned16(base), "attention ws forward: TMA needs 16-byte-aligned tensors, found address ",
               reinterpret_cast<uintptr_t>(base) % 16, " mod 16");
  constexpr int64_t kElem = 2;  // bf16 or f16
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(seq), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(head_dim * kElem), cuuint64_t(heads * head_dim * kElem),
                                 cuuint64_t(seq * heads * head_dim * kElem)};  // bytes, of dims 1..3
  const cuuint32_t box[4] = {64, 1, cuuint32_t(box_rows), 1};
  return EncodeTensorMapSw128(
      map, dtype == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims,
      strides, box, "attention ws forward");
}

absl::Status LaunchForwardV4Ws(DType dtype, const Problem& pr, int head_dim, int batch, const void* q,
                               const void* k, const void* v, void* out, float* lse, cudaStream_t stream) {
  if (!Aligned16(q) || !Aligned16(k) || !Aligned16(v)) {
    return absl::UnimplementedError("attention ws forward: TMA needs 16-byte-aligned q, k and v");
  }
  if (dtype == DType::kF16) return LaunchWsDim<f16>(pr, head_dim, batch, q, k, v, out, lse, stream);
  return LaunchWsDim<bf16>(pr, head_dim, batch, q, k, v, out, lse, stream);
}

}  // namespace sg::kernels::internal::attention_device
