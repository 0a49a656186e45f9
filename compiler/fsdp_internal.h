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
  TensorView full_fwd, full_bwd, grad_full;  // lowered program buffers (full_bwd may be empty; grad_full bf16
                                              // for the matmul weights under bf16_gradients_, else f32)
  int fwd_last = -1, bwd_last = -1, grad_from = -1;  // node indices: last readers, gradient producer
  // A Direct unit's parameter is reduce-scattered on its own: issued before node rs_at (once its
  // gradient exists), waited for by compute before node rs_wait_at, from where the full gradient's
  // arena buffer is reused.
  int rs_at = INT_MAX, rs_wait_at = INT_MAX;
  std::unique_ptr<Event> rs_done;
  TensorView shard, grad, m, v;              // this rank's rows, flat f32
  // CompileOptions::fsdp_host_gradient_units, a unit on the host: `grad` is its rows in the unit's
  // backward slot (what the reduce-scatter writes), `host_grad` in pinned host memory (where the
  // gradient waits), `update_grad` in its forward slot (what the deferred AdamW reads). Otherwise
  // update_grad is `grad` and host_grad is empty.
  TensorView host_grad, update_grad;
  // Where the last step's gradient shard lies once the step is done: host memory or `grad`.
  const TensorView& step_grad() const { return host_grad.raw() != nullptr ? host_grad : grad; }
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
  // The deferred optimizer (CompileOptions::fsdp_host_gradient_units > 0). Every unit: its index
  // in units_ (its slot of the per-unit norms and step counters), where its update is issued (just
  // before its first gather of the step), the node after which its gradients are complete (its
  // last reduce-scatter's issue) and the event recorded after its norm is taken.
  int index = 0, update_at = INT_MAX, reduced_at = INT_MAX;
  std::unique_ptr<Event> normed, updated;
  std::shared_ptr<void> update_list, norm_list;  // kernels::AdamWTensorList; null: no rows here
  // A unit on the host: its slots (of kHostGradientSlots) in backward and forward order, the host
  // unit that used the same slot before it (its copy to the host, or its update, must be done
  // first), its region of the host buffer, and the copies' events.
  bool host = false;
  // Its gradients are still in its backward slot when the next forward updates it (one of the
  // last units in backward order, the first in forward order): no copy back (fwd_slot == bwd_slot).
  bool resident = false;
  int bwd_slot = -1, fwd_slot = -1;
  const Unit* bwd_slot_prev = nullptr;
  const Unit* fwd_slot_prev = nullptr;
  int64_t host_offset = 0;  // bytes
  std::unique_ptr<Event> staged, loaded;
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_FSDP_INTERNAL_H_
