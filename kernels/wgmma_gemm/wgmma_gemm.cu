// The Hopper GEMM with a per-row scale epilogue: d = diag(row_scale) (a b^T), bf16 operands both
// K-major, f32 accumulation, bf16 output (the standard sm_90 recipe, written for this one layout).
//
// One persistent thread block per SM, 384 threads in three warpgroups:
//   warpgroup 0, the producer: gives its registers away (setmaxnreg 40); one thread walks the
//     block's tiles and k-blocks and, per k-block, waits for a free stage of the ring (its `empty`
//     mbarrier), then has the TMA unit load the A tile [128][64] and the B tile [256][64] into it
//     (128-byte swizzle), completing the stage's `full` mbarrier with the bytes.
//   warpgroups 1 and 2, the consumers (setmaxnreg 232): rows 64 (wg - 1).. of the 128 x 256 tile,
//     a 64 x 256 f32 accumulator in 128 registers per thread. Per k-block: wait `full`, issue four
//     wgmma m64n256k16 as one group, then wait until the previous group is done (one group stays
//     in flight) and release the previous stage (one arrival per warp: `empty` counts 8).
//     Epilogue: the accumulator times the row's scale, rounded to bf16, stored straight from
//     registers (bf16x2; each warp store covers 8 rows x 16 contiguous bytes). The producer keeps
//     loading the next tile's stages meanwhile.
// Ring: kStages stages of 48 KiB (one fewer with the SwiGLU backward epilogue, Stages()). Iteration `it` (counted over the block's tiles and k-blocks, the
// same sequence on both sides) uses stage it % kStages in round it / kStages: the consumers wait
// `full` for parity round & 1, the producer waits `empty` for parity (round & 1) ^ 1 (a fresh
// barrier reports parity 1 complete, so round 0 starts on free slots).
// Variants (WgmmaGemmVariant; the kernel template's kTmaStore and kCluster): the epilogue above, or
// the tile staged through shared memory and written by TMA stores that overlap the next tile's
// k-loop; and single blocks, or 2-block clusters whose B loads are multicast (see WgmmaGemmKernel).
// The SwiGLU epilogues (WgmmaGemmSwiGlu, on the TMA-store form) write h = silu(gate) * up from a tile
// of 128 gate and 128 up columns of the interleaved W13, with or without the tile itself.
// The SwiGLU backward epilogue (WgmmaGemmSwiGluBackward) takes the tile as dh and writes dgate and
// dup from the gate and up TMA-loaded into shared memory at the same positions.
// Tile order: the persistent index t = blockIdx.x + i gridDim.x walks groups of kGroupM tile rows,
// tile rows fastest inside a group, so the ~132 tiles in flight share ~8 A row-panels and ~17 B
// panels: both stay in L2 even when B (up to 64 MiB at N = 16384) does not fit.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/core/device.h"
#include "kernels/core/status.h"
#include "kernels/wgmma_gemm/wgmma_gemm_device.cuh"
#include "kernels/wgmma_gemm/wgmma_gemm_internal.h"

namespace sg::kernels::wgmma_gemm_internal {
namespace {

using namespace sm90;  // NOLINT: the Hopper primitives this kernel is built from
using bf16 = __nv_bfloat16;

constexpr int kBlockM = int(kTileM), kBlockN = int(kTileN), kBlockK = int(kTileK);
constexpr int kStages = 4;
// The SwiGLU backward epilogue's ring is one stage shorter, for its gate / up boxes (below).
__host__ __device__ constexpr int Stages(Epilogue e) { return e == Epilogue::kSwiGluBackward ? 3 : kStages; }
constexpr int kConsumerGroups = 2;
constexpr int kThreads = 128 * (1 + kConsumerGroups);
constexpr uint32_t kABytes = kBlockM * kBlockK * 2;  // 16 KiB
constexpr uint32_t kBBytes = kBlockN * kBlockK * 2;  // 32 KiB
constexpr uint32_t kStageBytes = kABytes + kBBytes;
// The TMA-store epilogue: per consumer warpgroup, two staging buffers of one 64 x 64 bf16 box (one
// 128-byte swizzle row per tile row), so one box is filled while the previous one drains.
constexpr int kEpiCols = 64;
constexpr uint32_t kEpiBoxBytes = 64 * kEpiCols * 2;  // 8 KiB
// kSwiGluBackward: per consumer warpgroup two pairs of boxes (gate, up), each loaded by TMA,
// overwritten in place with (dgate, dup) and stored from there; its 4 `loaded` mbarriers follow
// the ring's.
__host__ __device__ constexpr uint32_t EpilogueBytes(bool tma_store, Epilogue e = Epilogue::kScale) {
  return !tma_store ? 0 : kConsumerGroups * (e == Epilogue::kSwiGluBackward ? 4 : 2) * kEpiBoxBytes;
}
// The ring, the epilogue buffers, the 2 kStages mbarriers, and slack to align the ring to 1024
// bytes (the swizzle atom).
__host__ __device__ constexpr int SmemBytes(bool tma_store, Epilogue e = Epilogue::kScale) {
  return Stages(e) * int(kStageBytes) + int(EpilogueBytes(tma_store, e)) + 2 * Stages(e) * 8 +
         (e == Epilogue::kSwiGluBackward ? 2 * kConsumerGroups * 8 : 0) + 1024;
}
constexpr int kProducerRegs = 40, kConsumerRegs = 232;

static_assert(kBlockK * 2 == 128, "a tile row must be one 128-byte swizzle row (the TMA box's inner extent)");
static_assert(kEpiCols * 2 == 128, "an epilogue box row must be one 128-byte swizzle row");
static_assert(kBlockM == 64 * kConsumerGroups, "each consumer warpgroup owns 64 rows (wgmma m64)");
static_assert(kBlockN == 256 && kBlockN % kEpiCols == 0, "the consumer issues m64n256k16");
static_assert(kABytes % 1024 == 0 && kBBytes % 2048 == 0 && kEpiBoxBytes % 1024 == 0,
              "tiles, half B tiles and epilogue boxes must stay 1024-byte aligned (swizzle atoms)");
static_assert(SmemBytes(true) <= 227 * 1024 && SmemBytes(true, Epilogue::kSwiGluBackward) <= 227 * 1024,
              "the ring and epilogue must fit the 227 KiB a block may use");
static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerGroups <= 65536,
              "register reallocation must fit the SM's 64K registers");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kGroupM = 8;  // tile rows per group of the persistent order (even: see kCluster below)

// The origin (first row, first column) of the block's persistent tile t.
__device__ __forceinline__ void TileOrigin(int t, int tiles_m, int tiles_n, int& m0, int& n0) {
  const int per_group = kGroupM * tiles_n;
  const int first_m = (t / per_group) * kGroupM;
  const int rows = min(kGroupM, tiles_m - first_m);
  const int r = t % per_group;
  m0 = (first_m + r % rows) * kBlockM;
  n0 = (r / rows) * kBlockN;
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two adjacent columns of h = silu(g) * u from the scaled f32 accumulators of gate and up: g and u
// rounded to bf16 first (the values the unfused GEMM writes and the backward reads back), then
// kernels/swiglu's flat-kernel arithmetic, g / (1 + e^-g) * u by __expf and __fdividef, so h equals
// WgmmaGemm followed by SwiGluPackedForward bit for bit.
__device__ __forceinline__ uint32_t SwiGluBf16x2(float g0, float g1, float u0, float u1) {
  const float2 g = __bfloat1622float2(__floats2bfloat162_rn(g0, g1));
  const float2 u = __bfloat1622float2(__floats2bfloat162_rn(u0, u1));
  return PackBf16x2(__fdividef(g.x, 1.f + __expf(-g.x)) * u.x, __fdividef(g.y, 1.f + __expf(-g.y)) * u.y);
}
// kernels/swiglu's backward of one element from dh d, gate g and up u (its flat kernel's expression
// and operation order, so the fused form matches the unfused one bit for bit).
__device__ __forceinline__ void SwiGluBackward1(float d, float g, float u, float& dg, float& du) {
  const float s = __fdividef(1.f, 1.f + __expf(-g));
  const float silu = g * s;
  dg = d * u * s * (1.f + g * (1.f - s));
  du = d * silu;
}

// Two adjacent columns of dgate and dup from the f32 accumulators of dh (rounded to bf16 first, the
// dh an unfused GEMM writes) and the bf16x2 gate and up there.
// (dgate and dup may be gate's and up's registers: both are read first.)
__device__ __forceinline__ void SwiGluBackwardBf16x2(float d0, float d1, uint32_t gate, uint32_t up, uint32_t& dgate,
                                                     uint32_t& dup) {
  const float2 d = __bfloat1622float2(__floats2bfloat162_rn(d0, d1));
  const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gate));
  const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&up));
  float dg0, du0, dg1, du1;
  SwiGluBackward1(d.x, g.x, u.x, dg0, du0);
  SwiGluBackward1(d.y, g.y, u.y, dg1, du1);
  dgate = PackBf16x2(dg0, dg1);
  dup = PackBf16x2(du0, du1);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// kTmaStore: the epilogue writes the scaled bf16 tile into swizzled shared-memory boxes and a TMA
// store per box drains them while the consumers go on with the next tile (instead of bf16x2 stores
// from registers, each warp store scattered over 8 rows, with the math stopped until they issue).
// kCluster == 2: the blocks run in pairs (a 2-CTA cluster) on the M-adjacent tiles 2u, 2u + 1 of
// the persistent unit u (adjacent in the grouped order because kGroupM and tiles_m are even), which
// share their B tile: each block loads its own A and half of B, multicast to both, so B crosses
// L2 -> SM once per pair. A stage is then written by both producers, so its `empty` barrier counts
// the consumer warps of both blocks (each warp arrives on its own and on the peer's), and a block
// may exit only after the peer's last remote arrival (the closing cluster barrier).
// kEpi (Epilogue; kTmaStore single blocks only): the SwiGLU epilogues write h's 64 x 128 half-tile per
// consumer warpgroup, from gate columns [0, 128) and up columns [128, 256) of its accumulator (thread
// registers i and i + 64 hold the same row and column of the two halves), as two more 64 x 64 boxes
// through the same pair of staging buffers (4 + 2 boxes a tile with d, 2 without: even, so box c of
// every tile uses buffer c % 2). tmap_h, tmap_g and tmap_u come last among the parameters so the
// kScale kernels' others keep their offsets.
// kSwiGluBackward: the tile is dh. Its 64-column box c (per warpgroup) uses box pair c % 2: the
// warpgroup's leader has TMA load the gate box (tmap_g) and the up box (tmap_u) at the tile's
// position into the pair, completing the pair's `loaded` mbarrier; each thread reads its
// accumulator's positions there, writes dgate and dup over them (the same thread, the same
// addresses), and the leader stores the two boxes (tmap_d: dgate, tmap_h: dup). Boxes 0 and 1 are
// loaded while the tile's k-loop runs (once the previous tile's stores have read their pairs);
// box c + 2 once box c's stores have read its pair, while box c + 1 is computed. Each pair is
// loaded twice a tile, so the wait for box c has parity (c / 2) & 1. dgate and dup may overwrite
// gate and up in memory: each tile reads its region before it writes it.
template <bool kTmaStore, int kCluster, Epilogue kEpi = Epilogue::kScale>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaGemmKernel(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_b,
                    const __grid_constant__ CUtensorMap tmap_d, bf16* __restrict__ d,
                    const float* __restrict__ row_scale, int m, int n, int k,
                    const __grid_constant__ CUtensorMap tmap_h, const __grid_constant__ CUtensorMap tmap_g,
                    const __grid_constant__ CUtensorMap tmap_u) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kCluster == 1 || (kCluster == 2 && kGroupM % 2 == 0), "pairs must be M-adjacent tiles");
  static_assert(kEpi == Epilogue::kScale || (kTmaStore && kCluster == 1),
                "the SwiGLU epilogues exist on the single-block TMA-store kernel only");
  static_assert(kBlockN == 2 * 128, "SwiGLU tiles hold 128 gate and 128 up columns (kSwiGluBlock)");
  constexpr int kSt = Stages(kEpi);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t ring = SmemAddr(smem_raw) + (1024 - SmemAddr(smem_raw) % 1024) % 1024;
  const uint32_t epi = ring + kSt * kStageBytes;
  const uint32_t bars = epi + EpilogueBytes(kTmaStore, kEpi);  // full[s] at bars + 8 s, empty[s] after them
  auto loaded = [&](int cg, int pair) { return bars + 8 * (2 * kSt + 2 * cg + pair); };  // kSwiGluBackward
  const int tiles_m = m / kBlockM, tiles_n = n / kBlockN, k_blocks = k / kBlockK;
  const int units = tiles_m * tiles_n / kCluster;  // a unit: one tile, or one pair of tiles
  const int wg = int(threadIdx.x) / 128;
  const int rank = kCluster > 1 ? int(ClusterCtaRank()) : 0;
  const int first_unit = int(blockIdx.x) / kCluster, unit_step = int(gridDim.x) / kCluster;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kSt; ++s) {
      MbarInit(bars + 8 * s, 1);                                           // the producer's arrive.expect_tx
      MbarInit(bars + 8 * (kSt + s), 4 * kConsumerGroups * kCluster);  // each consumer warp of the cluster
    }
    if constexpr (kEpi == Epilogue::kSwiGluBackward) {
      for (int i = 0; i < 2 * kConsumerGroups; ++i) MbarInit(loaded(i / 2, i % 2), 1);
    }
    FenceMbarInit();
  }
  if constexpr (kCluster > 1) {
    ClusterSync();  // the peer's barriers are initialized before anything arrives on them
  } else {
    __syncthreads();
  }

  if (wg == 0) {  // the producer
    SetMaxRegsDec<kProducerRegs>();
    if (threadIdx.x == 0) {
      PrefetchTensorMap(&tmap_a);
      PrefetchTensorMap(&tmap_b);
      int it = 0;
      for (int u = first_unit; u < units; u += unit_step) {
        int m0, n0;
        TileOrigin(u * kCluster + rank, tiles_m, tiles_n, m0, n0);
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const int s = it % kSt;
          const uint32_t stage = ring + s * kStageBytes, full = bars + 8 * s, empty = bars + 8 * (kSt + s);
          MbarWait<true>(empty, ((it / kSt) & 1) ^ 1);
          MbarArriveExpectTx(full, kStageBytes);  // A, and B from both halves' multicasts
          TmaLoad2d(stage, &tmap_a, kb * kBlockK, m0, full);
          if constexpr (kCluster == 1) {
            TmaLoad2d(stage + kABytes, &tmap_b, kb * kBlockK, n0, full);
          } else {
            constexpr int kHalfRows = kBlockN / kCluster;
            TmaLoad2dMulticast(stage + kABytes + rank * (kBBytes / kCluster), &tmap_b, kb * kBlockK,
                               n0 + rank * kHalfRows, full, uint16_t((1u << kCluster) - 1));
          }
        }
      }
    }
  } else {  // the consumers
    SetMaxRegsInc<kConsumerRegs>();
    const int cg = wg - 1, warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
    const bool leader = threadIdx.x % 128 == 0;  // issues the warpgroup's TMA stores
    auto release = [&](int s) {  // the stage's reads are done: one arrival per warp and block
      if (lane != 0) return;
      if constexpr (kCluster == 1) {
        MbarArrive(bars + 8 * (kSt + s));
      } else {
#pragma unroll
        for (int r = 0; r < kCluster; ++r) MbarArriveCluster(bars + 8 * (kSt + s), uint32_t(r));
      }
    };
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    // kSwiGluBackward: this warpgroup's box pairs, and box c of the tile at (m0, n0) loaded into pair c % 2.
    const uint32_t pairs = epi + cg * 4 * kEpiBoxBytes;
    auto load_box = [&](int c, int m0, int n0) {
      const uint32_t gate = pairs + (c % 2) * 2 * kEpiBoxBytes, bar = loaded(cg, c % 2);
      MbarArriveExpectTx(bar, 2 * kEpiBoxBytes);
      TmaLoad2d(gate, &tmap_g, n0 + c * kEpiCols, m0 + 64 * cg, bar);
      TmaLoad2d(gate + kEpiBoxBytes, &tmap_u, n0 + c * kEpiCols, m0 + 64 * cg, bar);
    };
    int it = 0;
    for (int u = first_unit; u < units; u += unit_step) {
      int m0, n0;
      TileOrigin(u * kCluster + rank, tiles_m, tiles_n, m0, n0);
      if constexpr (kEpi != Epilogue::kScale) {
        // The first wgmma ignores the accumulator, but its asm operands read it: zeros here let each
        // register die at its last use in the previous tile's epilogue (the SwiGLU epilogues need the
        // room for their temporaries; with the old tile live throughout, ptxas spills).
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      }
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int s = it % kSt;
        const uint32_t a_tile = ring + s * kStageBytes + cg * 64 * 128, b_tile = ring + s * kStageBytes + kABytes;
        MbarWait<true>(bars + 8 * s, (it / kSt) & 1);
        FenceOperands(acc);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk) {  // k16 step: +32 bytes inside the 128-byte rows
          WgmmaM64N256K16(acc, KMajorSw128Desc(a_tile + kk * 32), KMajorSw128Desc(b_tile + kk * 32),
                          kb > 0 || kk > 0);
        }
        WgmmaCommit();
        if constexpr (kEpi == Epilogue::kSwiGluBackward) {
          if (kb == 0 && leader) {  // the first group is in flight: the previous tile's stores
            BulkWaitRead<0>();      // have read both pairs, which now take boxes 0 and 1
            load_box(0, m0, n0);
            load_box(1, m0, n0);
          }
        }
        WgmmaWait<1>();  // the previous k-block's group is done reading its stage
        FenceOperands(acc);
        if (kb > 0) release((it - 1) % kSt);
      }
      WgmmaWait<0>();
      FenceOperands(acc);
      release((it - 1) % kSt);

      const int row_in_wg = 16 * warp + lane / 4;  // and row_in_wg + 8
      const int row = m0 + 64 * cg + row_in_wg;
      const float s0 = row_scale != nullptr ? row_scale[row] : 1.f;
      const float s1 = row_scale != nullptr ? row_scale[row + 8] : 1.f;
      if constexpr (kTmaStore) {
        // Box c holds columns 64 c.. (registers 32 c..). In the swizzled box, the 16-byte chunk jj of
        // a row r sits at chunk jj ^ (r % 8); r % 8 = lane / 4 for both rows, so a warp store hits 8
        // distinct chunks x 4 words: all 32 banks.
        const uint32_t boxes = epi + cg * 2 * kEpiBoxBytes, swz = uint32_t(lane / 4);
        // Box c of the tile (buffer c % 2): value(jj, half) gives the bf16x2 of row row_in_wg + 8 half in
        // the box's 16-byte chunk jj; the box is stored at column `col` of `map`.
        auto store_box = [&](int c, const CUtensorMap* map, int col, auto value) {
          const uint32_t box = boxes + (c % 2) * kEpiBoxBytes;
          if (leader) BulkWaitRead<1>();  // the store that last read this box (two boxes back) is done
          NamedBarrierSync(1 + cg, 128);
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const uint32_t off = ((uint32_t(jj) ^ swz) * 16) + 4 * (lane % 4);
            StShared32(box + row_in_wg * 128 + off, value(jj, 0));
            StShared32(box + (row_in_wg + 8) * 128 + off, value(jj, 1));
          }
          FenceProxyAsyncShared();
          NamedBarrierSync(1 + cg, 128);
          if (leader) {
            TmaStore2d(map, box, col, m0 + 64 * cg);
            BulkCommit();
          }
        };
        // Two adjacent columns of d (registers i, i + 1 of row row_in_wg + 8 half).
        auto d_pair = [&](int i, int half) {
          const float sc = half ? s1 : s0;
          return PackBf16x2(acc[i] * sc, acc[i + 1] * sc);
        };
        // Two adjacent columns of h from gate registers i, i + 1 and up registers i + 64, i + 65.
        auto h_pair = [&](int i, int half) {
          const float sc = half ? s1 : s0;
          return SwiGluBf16x2(acc[i] * sc, acc[i + 1] * sc, acc[64 + i] * sc, acc[64 + i + 1] * sc);
        };
        if constexpr (kEpi == Epilogue::kScale) {
#pragma unroll
          for (int c = 0; c < kBlockN / kEpiCols; ++c) {
            store_box(c, &tmap_d, n0 + c * kEpiCols,
                      [&](int jj, int half) { return d_pair(4 * (8 * c + jj) + 2 * half, half); });
          }
        } else if constexpr (kEpi == Epilogue::kSwiGluBackward) {
#pragma unroll
          for (int c = 0; c < kBlockN / kEpiCols; ++c) {
            const uint32_t gate = pairs + (c % 2) * 2 * kEpiBoxBytes, up = gate + kEpiBoxBytes;
            MbarWait<true>(loaded(cg, c % 2), uint32_t(c / 2) & 1);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
              const uint32_t off = ((uint32_t(jj) ^ swz) * 16) + 4 * (lane % 4);
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const uint32_t at = uint32_t(row_in_wg + 8 * half) * 128 + off;
                const int i = 4 * (8 * c + jj) + 2 * half;
                uint32_t g = LdShared32(gate + at), u = LdShared32(up + at);
                SwiGluBackwardBf16x2(acc[i], acc[i + 1], g, u, g, u);
                StShared32(gate + at, g);
                StShared32(up + at, u);
              }
            }
            FenceProxyAsyncShared();
            NamedBarrierSync(1 + cg, 128);
            if (leader) {
              TmaStore2d(&tmap_d, gate, n0 + c * kEpiCols, m0 + 64 * cg);
              TmaStore2d(&tmap_h, up, n0 + c * kEpiCols, m0 + 64 * cg);
              BulkCommit();
              if (c + 2 < kBlockN / kEpiCols) {
                BulkWaitRead<0>();  // the stores just issued have read the pair: box c + 2 goes there
                load_box(c + 2, m0, n0);
              }
            }
          }
        } else {
          // h's box c (columns 64 c.. of the half-tile) from d's boxes c (gate) and c + 2 (up): with
          // kSwiGluGateUp those two go first, so each register dies within its three boxes.
#pragma unroll
          for (int c = 0; c < kBlockN / 2 / kEpiCols; ++c) {
            constexpr int kBoxes = kEpi == Epilogue::kSwiGluGateUp ? 3 : 1;  // per c: 6 or 2 a tile, even
            if constexpr (kEpi == Epilogue::kSwiGluGateUp) {
              for (const int dc : {c, c + 2}) {
                store_box(kBoxes * c + (dc - c) / 2, &tmap_d, n0 + dc * kEpiCols,
                          [&](int jj, int half) { return d_pair(4 * (8 * dc + jj) + 2 * half, half); });
              }
            }
            store_box(kBoxes * c + kBoxes - 1, &tmap_h, n0 / 2 + c * kEpiCols,
                      [&](int jj, int half) { return h_pair(4 * (8 * c + jj) + 2 * half, half); });
          }
        }
      } else {
        bf16* const out0 = d + int64_t(row) * n + n0 + 2 * (lane % 4);
        bf16* const out1 = out0 + int64_t(8) * n;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<__nv_bfloat162*>(out0 + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j] * s0, acc[4 * j + 1] * s0);
          *reinterpret_cast<__nv_bfloat162*>(out1 + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j + 2] * s1, acc[4 * j + 3] * s1);
        }
      }
    }
    if (kTmaStore && leader) BulkWait<0>();  // the boxes stay valid (and d written) until the block ends
  }
  if constexpr (kCluster > 1) ClusterSync();  // no block exits while its peer may still arrive on it
#else
  __trap();  // wgmma needs sm_90a; WgmmaGemmCuda launches this kernel only there
#endif
}

// The map of a contiguous bf16 [rows][k] matrix read in boxes of [box_rows][kBlockK], 128-byte swizzled.
absl::Status EncodeKMajor(CUtensorMap* map, const void* base, int64_t rows, int64_t k, int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};  // innermost first
  const cuuint64_t strides[1] = {cuuint64_t(k) * sizeof(bf16)};  // bytes, of dims 1.. (a row)
  const cuuint32_t box[2] = {cuuint32_t(kBlockK), cuuint32_t(box_rows)};
  return EncodeTensorMapSw128(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, "WgmmaGemm");
}

template <bool kTmaStore, int kCluster, Epilogue kEpi = Epilogue::kScale>
absl::Status Launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_d,
                    const CUtensorMap& map_h, void* d, const float* row_scale, int64_t m, int64_t n, int64_t k,
                    int sms, cudaStream_t stream, const CUtensorMap* map_g = nullptr,
                    const CUtensorMap* map_u = nullptr) {
  auto* const kernel = WgmmaGemmKernel<kTmaStore, kCluster, kEpi>;
  constexpr int kSmem = SmemBytes(kTmaStore, kEpi);
  SG_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int64_t units = (m / kBlockM) * (n / kBlockN) / kCluster;
  int64_t resident = sms / kCluster;  // persistent: one unit of blocks per SM (pair of SMs)
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attrs[1] = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  if constexpr (kCluster > 1) {
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = kCluster;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    config.attrs = attrs;
    config.numAttrs = 1;
    // GPCs need not hold a whole number of pairs: ask how many clusters fit at once, so that no
    // pair waits for a second wave.
    config.gridDim = dim3(unsigned(kCluster * std::min(units, resident)));
    int clusters = 0;
    SG_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    if (clusters > 0) resident = std::min<int64_t>(resident, clusters);
  }
  config.gridDim = dim3(unsigned(kCluster * std::min(units, resident)));
  SG_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_d, static_cast<bf16*>(d), row_scale,
                                             int(m), int(n), int(k), map_h, map_g ? *map_g : map_h,
                                             map_u ? *map_u : map_h));
  return absl::OkStatus();
}

}  // namespace

// The current device's SM count, or Unimplemented naming `op` on a GPU other than sm_90.
absl::StatusOr<int> Sm90MultiProcessors(const char* op) {
  SG_RETURN_IF_ERROR(RequireSm90(op));
  int device = 0, sms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

absl::Status WgmmaGemmCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b, const float* row_scale,
                           void* d, void* stream, KernelVariant variant) {
  SG_ASSIGN_OR_RETURN(const int sms, Sm90MultiProcessors("WgmmaGemm"));
  // Pairs need an even number of tile rows (M-adjacent tiles share B); else the single-block form.
  if (variant == KernelVariant::kClusterMulticast && (m / kBlockM) % 2 != 0) variant = KernelVariant::kTmaStore;
  const bool pairs = variant == KernelVariant::kClusterMulticast;
  CUtensorMap map_a, map_b, map_d;
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_a, a, m, k, kBlockM));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_b, b, n, k, pairs ? kBlockN / 2 : kBlockN));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_d, d, m, n, 64));  // the epilogue's 64 x 64 boxes
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (variant) {
    case KernelVariant::kRegisterStores:
      return Launch<false, 1>(map_a, map_b, map_d, map_d, d, row_scale, m, n, k, sms, s);
    case KernelVariant::kTmaStore:
      return Launch<true, 1>(map_a, map_b, map_d, map_d, d, row_scale, m, n, k, sms, s);
    case KernelVariant::kClusterMulticast:
      return Launch<true, 2>(map_a, map_b, map_d, map_d, d, row_scale, m, n, k, sms, s);
  }
  return absl::InvalidArgumentError("WgmmaGemm: unknown kernel variant");
}

absl::Status WgmmaGemmSwiGluCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                                 const float* row_scale, void* d, void* h, void* stream) {
  SG_ASSIGN_OR_RETURN(const int sms, Sm90MultiProcessors("WgmmaGemmSwiGlu"));
  CUtensorMap map_a, map_b, map_d, map_h;
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_a, a, m, k, kBlockM));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_b, b, n, k, kBlockN));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_h, h, m, n / 2, 64));  // the epilogue's 64 x 64 boxes
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (d == nullptr) {
    return Launch<true, 1, Epilogue::kSwiGlu>(map_a, map_b, map_h, map_h, h, row_scale, m, n, k, sms, s);
  }
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_d, d, m, n, 64));
  return Launch<true, 1, Epilogue::kSwiGluGateUp>(map_a, map_b, map_d, map_h, d, row_scale, m, n, k, sms, s);
}

absl::Status WgmmaGemmSwiGluBackwardCuda(int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                                         const void* gate, const void* up, void* dgate, void* dup, void* stream) {
  SG_ASSIGN_OR_RETURN(const int sms, Sm90MultiProcessors("WgmmaGemmSwiGluBackward"));
  CUtensorMap map_a, map_b, map_dgate, map_dup, map_gate, map_up;
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_a, a, m, k, kBlockM));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_b, b, n, k, kBlockN));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_dgate, dgate, m, n, 64));  // the epilogue's 64 x 64 boxes
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_dup, dup, m, n, 64));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_gate, gate, m, n, 64));
  SG_RETURN_IF_ERROR(EncodeKMajor(&map_up, up, m, n, 64));
  return Launch<true, 1, Epilogue::kSwiGluBackward>(map_a, map_b, map_dgate, map_dup, dgate, nullptr, m, n, k, sms,
                                                    static_cast<cudaStream_t>(stream), &map_gate, &map_up);
}

namespace {

// dst = src^T through a 64 x 64 shared-memory tile (one more column against bank conflicts): 256
// threads, each reading 16 elements down the tile's rows and writing 16 down its columns.
constexpr int kTransposeTile = 64, kTransposeThreads = 256;

__global__ void __launch_bounds__(kTransposeThreads)
    Transpose2ByteKernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t rows, int64_t cols) {
  __shared__ uint16_t tile[kTransposeTile][kTransposeTile + 1];
  const int64_t r0 = int64_t(blockIdx.y) * kTransposeTile, c0 = int64_t(blockIdx.x) * kTransposeTile;
  const int tx = int(threadIdx.x) % kTransposeTile, ty = int(threadIdx.x) / kTransposeTile;
  constexpr int kStep = kTransposeThreads / kTransposeTile;
  for (int i = ty; i < kTransposeTile; i += kStep) {
    if (r0 + i < rows && c0 + tx < cols) tile[i][tx] = src[(r0 + i) * cols + c0 + tx];
  }
  __syncthreads();
  for (int i = ty; i < kTransposeTile; i += kStep) {
    if (c0 + i < cols && r0 + tx < rows) dst[(c0 + i) * rows + r0 + tx] = tile[tx][i];
  }
}

}  // namespace

absl::Status Transpose2ByteCuda(int64_t rows, int64_t cols, const void* src, void* dst, void* stream) {
  const dim3 grid(unsigned((cols + kTransposeTile - 1) / kTransposeTile),
                  unsigned((rows + kTransposeTile - 1) / kTransposeTile));
  Transpose2ByteKernel<<<grid, kTransposeThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), rows, cols);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(Transpose2ByteKernel);
  return absl::OkStatus();
}

absl::Status CopyRuns2dCuda(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                            int64_t rows, void* stream) {
  SG_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, size_t(dst_pitch), src, size_t(src_pitch), size_t(width),
                                            size_t(rows), cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

}  // namespace sg::kernels::wgmma_gemm_internal
