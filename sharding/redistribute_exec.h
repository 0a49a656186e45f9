// Executes a redistribution plan (redistribute.h) on this rank's local piece, through Collectives.
//
//   SG_ASSIGN_OR_RETURN(const RedistributePlan* plan, planner.Plan(src, dst));
//   SG_ASSIGN_OR_RETURN(Tensor mine, ExecuteRedistribute(*plan, src, local, collectives));
//   // mine has dst.LocalShape(collectives.rank())
//
// Host (CPU) tensors only for now: the padding/trimming copies around each collective are host
// memcpys. Every rank of the mesh must call it with the same plan (the collectives are matched by
// order). Uneven chunks are zero-padded to ceil(n/p) for the collective and trimmed after.
#ifndef SGTRAIN_SHARDING_REDISTRIBUTE_EXEC_H_
#define SGTRAIN_SHARDING_REDISTRIBUTE_EXEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/tensor.h"
#include "sharding/collectives.h"
#include "sharding/placement.h"
#include "sharding/redistribute.h"

namespace sg::sharding {

// `local` must be contiguous, on the CPU, with shape src.LocalShape(rank); `plan` must have been
// planned for src's placements. Returns a new tensor with the destination's local shape.
absl::StatusOr<Tensor> ExecuteRedistribute(const RedistributePlan& plan, const TensorSpec& src,
                                           const TensorView& local, Collectives& collectives);

// Copies the box `box` of `src` (starting at src_offset) into `dst` at dst_offset; both row-major
// contiguous with `elem_bytes` per element. Exposed for tests and for building local shards.
void CopyBox(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_offset,
             char* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_offset,
             const Shape& box, int64_t elem_bytes);

// `rank`'s local piece of the global tensor `global` under `spec` (a replicated or partial mesh
// dim keeps the whole extent). The single-process reference tests compare against.
absl::StatusOr<Tensor> LocalShard(const TensorView& global, const TensorSpec& spec, int rank);

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_REDISTRIBUTE_EXEC_H_
