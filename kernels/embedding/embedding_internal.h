// Per-device implementations behind embedding.h; arguments are already checked by embedding.cc.
// The CUDA backward is also exposed by stage (index preparation, row sums) with an explicit
// configuration, for the benchmarks' breakdown and sweeps and for the tests' A/B of the paths.
//
//   BackwardConfig cfg = BackwardConfigFromEnv();  // SG_EMBEDDING_BWD: rows (default), packs, fused
//   SG_RETURN_IF_ERROR(BackwardPrepareCuda(p, cfg, tokens, order, offsets, device, stream));
//   SG_RETURN_IF_ERROR(BackwardRowSumCuda(p, cfg, dout, order, offsets, dtable, stream));
#ifndef SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
#define SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "kernels/core/dtype.h"

namespace sg::kernels::embedding_internal {

struct Problem {
  int64_t tokens = 0;  // number of token ids
  int64_t vocab = 0;
  int64_t dim = 0;
  DType dtype = DType::kF32;      // table / out / dout
  bool tokens_i64 = false;
};

void ForwardCpu(const Problem& p, const void* tokens, const void* table, void* out);
void BackwardCpu(const Problem& p, const void* dout, const void* tokens, float* dtable);

// Which CUDA backward runs (embedding.cu's file comment describes each). Every path gives the same
// bits: each vocabulary row's dout rows summed in f32 in ascending token order, starting 0 + x.
enum class BackwardPath {
  kRows,   // CUB radix sort + row starts, then RowSumRowsKernel (a CTA per group of rows)
  kPacks,  // CUB radix sort + row starts, then RowSumKernel (a thread per 8-column pack)
  kFused,  // one-CTA preparation (CUB beyond kFusedMaxTokens) + FusedRowSumKernel, launched with
           // programmatic dependent launch so its launch overlaps the preparation
};
inline constexpr int64_t kFusedMaxTokens = 16384;  // the one-CTA preparation's capacity

struct BackwardConfig {
  BackwardPath path = BackwardPath::kRows;
  // kFused only. Vocabulary rows a CTA sums per step: 4, 8 or 16 (others: the next of these up,
  // at most 16).
  int rows_per_step = 8;
  // kFused only. Grid: 0 = one CTA per step of rows; n > 0 = n CTAs per SM looping over the steps.
  int ctas_per_sm = 0;
  // kFused only. dtable written with streaming (evict-first, st.global.cs) stores.
  bool streaming_stores = false;
  // kFused only. The row sums launched with programmatic dependent launch after the preparation.
  bool pdl = true;
  // kFused only. The one-CTA preparation groups a warp's equal digits with __match_any_sync
  // instead of 8 ballots.
  bool prep_match_any = false;
  // kFused only (with pdl, ctas_per_sm 0, the one-CTA preparation and vocab < 131040). Early
  // zeros: the preparation first publishes a bitmap of the rows that have tokens, and the row sums
  // (already resident) store the empty rows while the sort still runs. The bitmap is a hint: a row
  // sum thread stores every row it owns after griddepcontrol.wait unless its own earlier zero
  // store already matches the final offsets, so a stale bitmap costs speed, never bits.
  bool early_zeros = false;

  std::string ToString() const {
    const char* names[] = {"rows", "packs", "fused"};
    std::string s = names[int(path)];
    if (path != BackwardPath::kFused) return s;
    return s + " rows/step=" + std::to_string(rows_per_step) + " ctas/sm=" + std::to_string(ctas_per_sm) +
           (streaming_stores ? " st.cs" : "") + (pdl ? " pdl" : "") + (prep_match_any ? " match_any" : "") +
           (early_zeros ? " early_zeros" : "");
  }
};

// The configuration SG_EMBEDDING_BWD names ("rows", "packs", "fused", "fused-early": fused with
// early_zeros; unset or anything else: rows), the other fields at their defaults. Read on every
// call, so tests and benchmarks can switch paths between calls.
inline BackwardConfig BackwardConfigFromEnv() {
  BackwardConfig cfg;
  const char* v = std::getenv("SG_EMBEDDING_BWD");
  if (v == nullptr) return cfg;
  if (std::strcmp(v, "packs") == 0) cfg.path = BackwardPath::kPacks;
  if (std::strcmp(v, "fused") == 0 || std::strcmp(v, "fused-early") == 0) cfg.path = BackwardPath::kFused;
  cfg.early_zeros = std::strcmp(v, "fused-early") == 0;
  return cfg;
}

// Early zeros' used-row bitmap: words of 32 rows, then a ready flag, after offsets[vocab].
inline constexpr int kHintMaxWords = 4096;
constexpr int HintWords(int64_t vocab) { return int(vocab / 32 + 1); }
inline bool UsesEarlyZeros(const Problem& p, const BackwardConfig& cfg) {
  return cfg.path == BackwardPath::kFused && cfg.early_zeros && cfg.pdl && cfg.ctas_per_sm == 0 &&
         p.tokens <= kFusedMaxTokens && HintWords(p.vocab) <= kHintMaxWords;
}
// int32 entries of the offsets buffer the stages take: offsets[0, vocab], the bitmap, its flag.
inline int64_t BackwardOffsetsInts(const Problem& p) { return p.vocab + 1 + HintWords(p.vocab) + 1; }

absl::Status ForwardCuda(const Problem& p, const void* tokens, const void* table, void* out, void* stream);
// The whole backward with BackwardConfigFromEnv(), scratch from the device's caching allocator.
absl::Status BackwardCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                          void* stream);
absl::Status BackwardCudaWith(const Problem& p, const BackwardConfig& cfg, const void* dout, const void* tokens,
                              float* dtable, int device, void* stream);

// Stage 1 alone: order[0, tokens) = token positions stably sorted by id (out-of-range ids last),
// offsets[v] = the first sorted position with id >= v, for v in [0, vocab] (offsets[vocab] ends the
// last real row). order and offsets are device buffers of tokens and BackwardOffsetsInts(p) int32
// (the row sums read the same buffer; past offsets[vocab]: early zeros' bitmap). CUB's
// scratch (kRows, kPacks, or kFused beyond kFusedMaxTokens) comes from the caching allocator.
absl::Status BackwardPrepareCuda(const Problem& p, const BackwardConfig& cfg, const void* tokens, int32_t* order,
                                 int32_t* offsets, int device, void* stream);
// Stage 2 alone: every dtable row from prepared order / offsets (BackwardOffsetsInts(p) entries;
// with early zeros, a bitmap flag no preparation sets delays the row sums ~4 ms, never the bits).
absl::Status BackwardRowSumCuda(const Problem& p, const BackwardConfig& cfg, const void* dout, const int32_t* order,
                                const int32_t* offsets, float* dtable, void* stream);

}  // namespace sg::kernels::embedding_internal

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
