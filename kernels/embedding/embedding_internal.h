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

  std::string ToString() const {
    const char* names[] = {"rows", "packs", "fused"};
    std::string s = names[int(path)];
    if (path != BackwardPath::kFused) return s;
    return s + " rows/step=" + std::to_string(rows_per_step) + " ctas/sm=" + std::to_string(ctas_per_sm) +
           (streaming_stores ? " st.cs" : "") + (pdl ? " pdl" : "") + (prep_match_any ? " match_any" : "");
  }
};

// The configuration SG_EMBEDDING_BWD names ("rows", "packs", "fused"; unset or anything else:
// rows), with the other fields at their defaults. Read on every call, so tests and benchmarks can
// switch paths between calls.
inline BackwardConfig BackwardConfigFromEnv() {
  BackwardConfig cfg;
  const char* v = std::getenv("SG_EMBEDDING_BWD");
  if (v != nullptr && std::strcmp(v, "packs") == 0) cfg.path = BackwardPath::kPacks;
  if (v != nullptr && std::strcmp(v, "fused") == 0) cfg.path = BackwardPath::kFused;
  return cfg;
}

absl::Status ForwardCuda(const Problem& p, const void* tokens, const void* table, void* out, void* stream);
// The whole backward with BackwardConfigFromEnv(), scratch from the device's caching allocator.
absl::Status BackwardCuda(const Problem& p, const void* dout, const void* tokens, float* dtable, int device,
                          void* stream);
absl::Status BackwardCudaWith(const Problem& p, const BackwardConfig& cfg, const void* dout, const void* tokens,
                              float* dtable, int device, void* stream);

// Stage 1 alone: order[0, tokens) = token positions stably sorted by id (out-of-range ids last),
// offsets[v] = the first sorted position with id >= v, for v in [0, vocab] (offsets[vocab] ends the
// last real row). order and offsets are device buffers of tokens and vocab + 1 int32. CUB's
// scratch (kRows, kPacks, or kFused beyond kFusedMaxTokens) comes from the caching allocator.
absl::Status BackwardPrepareCuda(const Problem& p, const BackwardConfig& cfg, const void* tokens, int32_t* order,
                                 int32_t* offsets, int device, void* stream);
// Stage 2 alone: every dtable row from prepared order / offsets.
absl::Status BackwardRowSumCuda(const Problem& p, const BackwardConfig& cfg, const void* dout, const int32_t* order,
                                const int32_t* offsets, float* dtable, void* stream);

}  // namespace sg::kernels::embedding_internal

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
