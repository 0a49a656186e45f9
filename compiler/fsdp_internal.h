// Internal to compiler/fsdp.cc, fsdp_collectives.cc and fsdp_memory.cc: the sharded data-parallel
// step's per-parameter and per-unit bookkeeping.
#ifndef SGTRAIN_COMPILER_FSDP_INTERNAL_H_
#define SGTRAIN_COMPILER_FSDP_INTERNAL_H_

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "compiler/fsdp.h"
#include "sharding/placement.h"

namespace sg::compiler {

// n elements of `base` from element `offset`, as a flat view.
inline TensorView Flat(const TensorView& base, int64_t offset, int64_t n) {
  return TensorView(static_cast<char*>(base.raw()) + offset * SizeOf(base.dtype()), base.dtype(), {n},
                    base.device());
}

struct ShardedDataParallelStep::Param {
  std::string name;
  int unit = 0;
  int64_t rows = 0, row = 0, chunk = 0;  // dim-0 extent, elements per row, ceil(rows / P)
  sharding::ChunkRange mine;             // this rank's rows
  int64_t pack_offset = 0;               // in the unit's per-rank bucket block (elements)
  double weight_decay = 0;
  TensorView full_fwd, full_bwd, grad_full;  // lowered program buffers (full_bwd may be empty)
  int fwd_last = -1, bwd_last = -1, grad_from = -1;  // node indices: last readers, gradient producer
  // A Direct unit's parameter is reduce-scattered on its own: issued before node rs_at (once its
  // gradient exists), waited for by compute before node rs_wait_at, from where the full gradient's
  // arena buffer is reused.
  int rs_at = INT_MAX, rs_wait_at = INT_MAX;
  std::unique_ptr<Event> rs_done;
  TensorView shard, grad, m, v;              // this rank's rows, flat f32
};

struct ShardedDataParallelStep::Unit {
  std::string name;
  std::vector<int> params;
  int64_t block = 0;  // elements per rank in a bucket: sum of chunk * row
  // The dtype its forward and backward buffers are gathered in: f32, or the compute dtype under
  // mixed precision (compiler/data_parallel_graph.h's GatherInComputeDType).
  DType fwd_dtype = DType::kF32, bwd_dtype = DType::kF32;
  int fwd_at = INT_MAX, fwd_first = INT_MAX, bwd_at = INT_MAX, bwd_first = INT_MAX;
  int grad_done = -1, rs_at = INT_MAX, rs_wait_at = INT_MAX;
  // Where compute waits for the unit's full gradients to be packed into the bucket (units that are
  // not Direct), from where their buffers are free: rs_wait_at when that comes first or for a
  // Direct unit, whose reduce-scatter reads the full gradient itself.
  int packed_at = INT_MAX;
  std::unique_ptr<Event> fwd_done, bwd_done, rs_done, packed;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_FSDP_INTERNAL_H_
