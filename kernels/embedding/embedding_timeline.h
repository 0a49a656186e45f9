// A diagnostic for the embedding backward's "atomic2s" path (embedding_atomic.cu): with the
// library built with SG_EMB_TIMELINE (--copt=-DSG_EMB_TIMELINE --//tools:nvcc_flags=-DSG_EMB_TIMELINE),
// each of its kernels records, per call, when its first CTA started, when the first passed its
// programmatic-dependent wait, and when its last CTA's thread 0 finished (%globaltimer, ns). The
// default build records nothing and defines neither function.
//
//   EmbeddingTimelineReset();  10 calls of EmbeddingBackward;  EmbeddingTimelineRead()->start[kScan][3]
#ifndef SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_TIMELINE_H_
#define SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_TIMELINE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sg::kernels {

struct EmbeddingTimeline {
  enum Kernel { kZero, kCount, kScan, kScatter, kSums, kEarlyFill, kFill, kKernels };
  static constexpr int kCalls = 16;  // calls since the reset; later ones are not recorded
  // ~0 (start, waited) or 0 (end) where nothing was recorded; waited stays ~0 for a kernel that
  // does not wait (the fills).
  uint64_t start[kKernels][kCalls], waited[kKernels][kCalls], end[kKernels][kCalls];
};
inline constexpr const char* kEmbeddingTimelineNames[EmbeddingTimeline::kKernels] = {
    "zero", "count", "scan", "scatter", "sums", "early", "fill"};

#ifdef SG_EMB_TIMELINE
// Synchronizes the device, then clears the records (the current device's).
absl::Status EmbeddingTimelineReset();
// Synchronizes the device, then reads the records.
absl::StatusOr<EmbeddingTimeline> EmbeddingTimelineRead();
#endif

}  // namespace sg::kernels

#endif  // SGTRAIN_KERNELS_EMBEDDING_EMBEDDING_TIMELINE_H_
