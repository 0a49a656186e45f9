// CUDA flash attention forward, variant v2: mma.sync m16n8k16 bf16 like the deleted v1, but each
// warp owns 32 query rows (two m16 tiles), so every K or V fragment read from shared memory feeds
// two MMAs. v1 (8 warps x 16 rows) read 0.56 ldmatrix.x4 per MMA, which at 128 B/clk of shared
// memory per SM was its limit; this layout reads 0.31 (0.25 at head_dim 64, where the Q fragments
// stay in registers for the whole key loop).
//
// One block of 4 warps per (128-query tile, head, batch), two blocks per SM (so one block's softmax
// overlaps the other's MMAs), K/V tiles of 64 keys in a kStages-deep cp.async ring with one barrier
// per key tile. Causal grids start with the heaviest (last) query tiles.
//
// Variant v3's forward is this kernel with kV3 = true, two changes on trial against v2:
// - Grid order (head, query tile, batch): blocks are issued per batch, query tiles heaviest first,
//   heads fastest. v2's (tile, head, batch) grid is heaviest-first only within each head, so its
//   last wave mixes heavy and light blocks; a list-scheduling model of the causal benchmark (B=8
//   S=2048 H=32, 264 resident blocks) puts v2's makespan 7.5% over the ideal, this order 1.7%.
//   The blocks in flight stay on one batch's K/V (8 MB at D128), as before.
// - At head_dim 64, one FFMA per score: P = 2^(s c - m) with the row max taken on the raw scores
//   (c = scale log2 e > 0 keeps the order) instead of scaling every score first. At 128 this made
//   ptxas spill 36 bytes (255 registers), so D128 keeps v2's softmax.
// v3 with scale <= 0, or more than 65535 query tiles (the grid's y limit), runs the v2 kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/attention_tiling.h"

namespace sg::kernels::internal::attention_device {
namespace {

template <int kD>
struct FwdV2Config {
  static constexpr int kWarps = 4, kThreads = kWarps * 32;
  static constexpr int kMTiles = 2;  // m16 tiles per warp
  static constexpr int kBlockM = kFwdBlockM, kBlockN = kFwdBlockN;
  static_assert(kBlockM == kWarps * kMTiles * 16, "two 16-row slices of the query tile per warp");
  // Registers per thread: O is kD/2 floats, S kBlockN/2; Q fragments (kD/2 words) fit beside them
  // only at kD = 64.
  static constexpr bool kQInRegs = kD == 64;
  // Shared memory per block: 102 KB at kD = 128 with 2 stages, 72 KB at kD = 64 with 3: two blocks
  // per SM either way.
  static constexpr int kStages = kD == 64 ? 3 : 2;
  static_assert(kStages >= 2, "the ring needs a stage to compute on and one in flight");
  using QTile = SmemTile<kBlockM, kD>;
  using KvTile = SmemTile<kBlockN, kD>;
  static constexpr int kSmemBytes = (QTile::kElems + 2 * kStages * KvTile::kElems) * int(sizeof(bf16));
};

template <int kD, bool kV3>
__global__ void __launch_bounds__(FwdV2Config<kD>::kThreads, 2)
    AttentionForwardV2Kernel(Problem pr, const bf16* __restrict__ q, const bf16* __restrict__ k,
                             const bf16* __restrict__ v, bf16* __restrict__ out,
                             float* __restrict__ lse) {
  using C = FwdV2Config<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages;
  // v3 folds the scale into the exponent at head_dim 64 only: at 128 the raw scores' longer life
  // cost 36 bytes of spills (ptxas, 255 registers).
  constexpr bool kFold = kV3 && kD == 64;
  constexpr int kMTiles = C::kMTiles;
  using KvTile = typename C::KvTile;
  extern __shared__ __align__(16) unsigned char smem[];
  const typename C::QTile sq{reinterpret_cast<bf16*>(smem)};
  bf16* const k_stages = sq.p + C::QTile::kElems;  // stage s at k_stages + s * KvTile::kElems
  bf16* const v_stages = k_stages + kStages * KvTile::kElems;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // v2: grid (query tile, head, batch); v3: (head, query tile, batch), so blocks are issued per
  // batch, query tiles heaviest first, heads fastest.
  int m_block, h;
  if constexpr (kV3) {
    m_block = pr.causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);
    h = blockIdx.x;
  } else {
    m_block = pr.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
    h = blockIdx.y;
  }
  const int b = blockIdx.z, kh = h / (pr.heads / pr.kv_heads);
  const int m0 = m_block * kBlockM;
  const int64_t q_row = int64_t(pr.heads) * kD, k_row = int64_t(pr.kv_heads) * kD;
  const bf16* q_base = q + (int64_t(b) * pr.seq_q + m0) * q_row + h * kD;
  const bf16* k_base = k + int64_t(b) * pr.seq_k * k_row + kh * kD;
  const bf16* v_base = v + int64_t(b) * pr.seq_k * k_row + kh * kD;

  const int n_end = VisibleKeyEnd(min(m0 + kBlockM, pr.seq_q), pr.seq_k, pr.causal, pr.q_minus_k);
  const int n_tiles = (n_end + kBlockN - 1) / kBlockN;

  // Commit groups: Q, then one per key tile (empty past the end), so "tile t landed" is always
  // "at most kStages - 2 newer groups pending" at the top of iteration t.
  sq.template Load<C::kThreads>(q_base, q_row, pr.seq_q - m0);
  CpAsyncCommit();
  auto load_kv = [&](int t) {
    if (t < n_tiles) {
      const int n = t * kBlockN, stage = t % kStages;
      KvTile{k_stages + stage * KvTile::kElems}.template Load<C::kThreads>(k_base + n * k_row, k_row, pr.seq_k - n);
      KvTile{v_stages + stage * KvTile::kElems}.template Load<C::kThreads>(v_base + n * k_row, k_row, pr.seq_k - n);
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) load_kv(t);

  const int row0 = warp * 16 * kMTiles;  // this warp's first row within the tile
  uint32_t qf[kMTiles][C::kQInRegs ? kD / 16 : 1][4];
  if constexpr (C::kQInRegs) {
    CpAsyncWait<kStages - 1>();  // the Q group
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
  // Query rows of this thread: first_row + 16 mt + 8 r.
  const int first_row = m0 + row0 + lane / 4;

  for (int t = 0; t < n_tiles; ++t) {
    CpAsyncWait<kStages - 2>();
    // Tile t is visible to all threads, and every thread is done with tile t - 1, whose stage the
    // copy below refills.
    __syncthreads();
    load_kv(t + kStages - 1);
    const int stage = t % kStages, n0 = t * kBlockN;
    const KvTile sk{k_stages + stage * KvTile::kElems}, sv{v_stages + stage * KvTile::kElems};

    // S = Q K^T: each K fragment feeds both m-tiles.
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

    // Into the log2 domain (scale may be negative, so scale before the max); mask keys past the
    // end and (causal) after the query.
    const bool need_mask = TileNeedsMask(m0, n0, kBlockN, pr.seq_k, pr.causal, pr.q_minus_k);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (!kFold) s[mt][nt][e] *= pr.scale_log2;  // else folded into the exponent
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

    // Online softmax: rescale the running output by 2^(old max - new max).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = kFold ? -INFINITY : row_max[mt][r];
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt) {
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        }
        mx = QuadMax(mx);
        // row_max is in the log2 domain; with kFold s are the raw scores (-inf where masked), and
        // c = scale_log2 > 0 maps their max to the log2 domain's.
        const float c = pr.scale_log2;
        if constexpr (kFold) mx = fmaxf(row_max[mt][r], mx * c);
        const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: keep 2^x finite
        const float alpha = FastExp2(row_max[mt][r] - m_use);
        row_max[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt) {
          if constexpr (kFold) {
            s[mt][nt][2 * r] = FastExp2(fmaf(s[mt][nt][2 * r], c, -m_use));
            s[mt][nt][2 * r + 1] = FastExp2(fmaf(s[mt][nt][2 * r + 1], c, -m_use));
          } else {
            s[mt][nt][2 * r] = FastExp2(s[mt][nt][2 * r] - m_use);
            s[mt][nt][2 * r + 1] = FastExp2(s[mt][nt][2 * r + 1] - m_use);
          }
          sum += s[mt][nt][2 * r] + s[mt][nt][2 * r + 1];
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;  // per-thread partial; quad-reduced at the end
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          o[mt][dt][2 * r] *= alpha;
          o[mt][dt][2 * r + 1] *= alpha;
        }
      }
    }

    // O += P V: each V fragment feeds both m-tiles.
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
  // then write them out with coalesced 16-byte stores.
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
  for (int c = lane; c < kWarpRows * kChunksPerRow; c += 32) {
    const int r = row0 + c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    if (m0 + r < pr.seq_q) {
      *reinterpret_cast<uint4*>(out_base + r * q_row + col) = *reinterpret_cast<const uint4*>(sq.at(r, col));
    }
  }
}

template <int kD, bool kV3>
absl::Status Launch(const Problem& pr, int batch, const void* q, const void* k, const void* v,
                    void* out, float* lse, cudaStream_t stream) {
  using C = FwdV2Config<kD>;
  SG_RETURN_IF_ERROR(AllowSmem(AttentionForwardV2Kernel<kD, kV3>, C::kSmemBytes));
  const int m_blocks = (pr.seq_q + C::kBlockM - 1) / C::kBlockM;
  const dim3 grid = kV3 ? dim3(pr.heads, m_blocks, batch) : dim3(m_blocks, pr.heads, batch);
  AttentionForwardV2Kernel<kD, kV3><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      pr, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<bf16*>(out), lse);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(AttentionForwardV2Kernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchForwardV2(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                             const void* v, void* out, float* lse, cudaStream_t stream) {
  if (head_dim == 64) return Launch<64, false>(pr, batch, q, k, v, out, lse, stream);
  return Launch<128, false>(pr, batch, q, k, v, out, lse, stream);
}

absl::Status LaunchForwardV3(const Problem& pr, int head_dim, int batch, const void* q, const void* k,
                             const void* v, void* out, float* lse, cudaStream_t stream) {
  // v3's grid has the query tiles in y (at most 65535, seq_q <= 8M); its softmax needs scale > 0.
  if (!(pr.scale_log2 > 0.f) || pr.seq_q > 65535 * kFwdBlockM) {
    return LaunchForwardV2(pr, head_dim, batch, q, k, v, out, lse, stream);
  }
  if (head_dim == 64) return Launch<64, true>(pr, batch, q, k, v, out, lse, stream);
  return Launch<128, true>(pr, batch, q, k, v, out, lse, stream);
}

}  // namespace sg::kernels::internal::attention_device
