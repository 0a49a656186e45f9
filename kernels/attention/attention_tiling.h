// Internal to kernels/attention: the tile-range and masking arithmetic of the CUDA kernels, shared
// with the host so attention_test can check it exhaustively without a GPU.
#ifndef SGTRAIN_KERNELS_ATTENTION_ATTENTION_TILING_H_
#define SGTRAIN_KERNELS_ATTENTION_ATTENTION_TILING_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SG_ATTENTION_HD __host__ __device__ __forceinline__
#else
#define SG_ATTENTION_HD inline
#endif

namespace sg::kernels::internal {

// Tile sizes: the forward walks 64-key tiles for a 128-query tile (8 warps x 16 rows); the
// backward walks 64-query tiles for a 128-key tile (8 warps x 16 keys).
constexpr int kFwdBlockM = 128, kFwdBlockN = 64;
constexpr int kBwdBlockM = 64, kBwdBlockN = 128;
// Backward v3: 128-key blocks; 128-query tiles at head_dim 64, 64 at head_dim 128 (registers).
constexpr int kBwdV3BlockN = 128;
constexpr int BwdV3BlockM(int head_dim) { return head_dim == 64 ? 128 : 64; }

// The v3 dq workspace is f32 [batch, heads, DqAccumRows(seq_q), head_dim]: rows padded to whole
// query tiles of either head dim, so each tile is one contiguous bulk reduction.
constexpr int kDqAccumRowAlign = 128;
SG_ATTENTION_HD int64_t DqAccumRows(int64_t seq_q) {
  return (seq_q + kDqAccumRowAlign - 1) / kDqAccumRowAlign * kDqAccumRowAlign;
}

// Causal masking: key j is masked for query i when j > i + q_minus_k (q_minus_k = q_offset -
// k_offset). Keys [0, result) are the only ones that queries [0, m_end) can see.
SG_ATTENTION_HD int VisibleKeyEnd(int m_end, int seq_k, bool causal, int64_t q_minus_k) {
  if (!causal) return seq_k;
  const int64_t visible = int64_t(m_end) + q_minus_k;
  return visible <= 0 ? 0 : visible >= seq_k ? seq_k : int(visible);
}

// The first query tile (of `block_m` rows, `m_tiles` in all) with a row that sees key n0; m_tiles
// when none does.
SG_ATTENTION_HD int FirstQueryTile(int n0, int block_m, int m_tiles, bool causal, int64_t q_minus_k) {
  if (!causal) return 0;
  const int64_t first_row = int64_t(n0) - q_minus_k;
  return first_row <= 0 ? 0 : first_row >= int64_t(m_tiles) * block_m ? m_tiles : int(first_row / block_m);
}

// False when every (query in [m0, ...), key in [n0, n0 + block_n)) pair is a real, visible key, so
// the per-element mask can be skipped. Query rows past seq_q are handled by the caller.
SG_ATTENTION_HD bool TileNeedsMask(int m0, int n0, int block_n, int seq_k, bool causal,
                                   int64_t q_minus_k) {
  return n0 + block_n > seq_k || (causal && int64_t(n0) + block_n - 1 > int64_t(m0) + q_minus_k);
}

}  // namespace sg::kernels::internal

#endif  // SGTRAIN_KERNELS_ATTENTION_ATTENTION_TILING_H_
