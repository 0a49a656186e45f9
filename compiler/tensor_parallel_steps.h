// Internal to the tensor-parallel runtimes (compiler/tensor_parallel.h's TensorParallelStep, and
// compiler/tensor_parallel_fsdp.h's FSDP x TP step on compiler/fsdp.h's runtime): what both put
// into a per-rank tp program (compiler/tensor_parallel_graph.h) once it is lowered, and how both
// cut a full tensor into this rank's slice and back.
//
//   SG_RETURN_IF_ERROR(ReplaceVocabSteps(*program, tp_graph, group, comm_step, &owned));
//   SG_RETURN_IF_ERROR(InsertTpAllReduces(*program, tp_graph, group, comm_step, &owned));
#ifndef SGTRAIN_COMPILER_TENSOR_PARALLEL_STEPS_H_
#define SGTRAIN_COMPILER_TENSOR_PARALLEL_STEPS_H_

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/process_group.h"
#include "compiler/lowering.h"
#include "compiler/tensor_parallel_graph.h"
#include "kernels/core/stream.h"
#include "sharding/placement.h"

namespace sg::compiler {

// A step on the comm stream ordered after the compute enqueued so far (CompiledStep::CommStep
// bound to the runtime's ready event) that records `done`.
using TpCommStep =
    std::function<Step(std::string name, graph::Phase phase, std::function<absl::Status(const Stream&)> body, Event* done)>;

// Buffers and events the inserted steps use: they must outlive the program's schedule.
struct TpStepResources {
  std::vector<std::unique_ptr<Event>> events;
  DeviceMemory vocab_scratch;  // the cross-entropy's per-token statistics
};

// Replaces the lowered steps of tp.vocab_ops with kernels/vocab_parallel (and, per cross-entropy,
// an all-gather of its statistics over `group`; null: one rank). Keeps each step's node index.
// Unimplemented when such a node has no step of its own (a fused cross-entropy pair).
absl::Status ReplaceVocabSteps(Program& program, const TensorParallelGraph& tp, comm::ProcessGroup* group,
                               const TpCommStep& comm_step, TpStepResources* owned);

// Inserts tp.all_reduces: an in-place all-reduce (sum) over `group` after the steps of the node
// completing each partial sum, a wait before the first step of the node needing it (graph
// outputs: at the end). The inserted steps have node -1. Nothing when `group` is null.
absl::Status InsertTpAllReduces(Program& program, const TensorParallelGraph& tp, comm::ProcessGroup* group,
                                const TpCommStep& comm_step, TpStepResources* owned);

// Row-major split of `global` along dim d into T torch.chunk pieces (equal unless the dim is an
// uneven vocabulary): outer blocks of `mid` rows of `inner` elements, of which piece r holds rows
// sharding::Chunk(mid, T, r).
struct TpSplit {
  int64_t outer = 1, mid = 1, inner = 1;
  int T = 1;
  TpSplit(const Shape& global, int d, int parts) : T(parts) {
    for (int k = 0; k < d; ++k) outer *= global[size_t(k)];
    mid = global[size_t(d)];
    for (size_t k = size_t(d) + 1; k < global.size(); ++k) inner *= global[k];
  }
  // Elements of the largest piece: what an all-gather pads every piece to.
  int64_t MaxNumel() const { return outer * sharding::MaxChunk(mid, T) * inner; }
  // Piece r of `full` into the contiguous `local`, or back (to_full).
  void Copy(float* full, float* local, int r, bool to_full) const {
    const sharding::ChunkRange c = sharding::Chunk(mid, T, r);
    for (int64_t o = 0; o < outer; ++o) {
      float* f = full + (o * mid + c.offset) * inner;
      float* l = local + o * c.length * inner;
      if (to_full) {
        std::memcpy(f, l, size_t(c.length * inner) * 4);
      } else {
        std::memcpy(l, f, size_t(c.length * inner) * 4);
      }
    }
  }
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_TENSOR_PARALLEL_STEPS_H_
