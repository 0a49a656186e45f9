// Distributed compilation: Compile(graph, {.strategy = kFsdp | kHybridShard | kTensorParallel | kAuto, .mesh})
// lands here. The job's processes are found from the launcher's environment (compiler/
// dist_context.h), the sharding layer plans the strategy on the prepared training step
// (sharding::BuildShardingPlan, or sharding::ChooseStrategy for kAuto, whose explanation is kept
// in CompiledStep::explanation() and printed by rank 0), and the plan's parameter placements pick
// the runtime's groups: the mesh dims a parameter is S(0) on shard it (one flat torch.chunk split
// over those ranks), the dims it is R on replicate it. compiler/fsdp.h runs the step;
// kTensorParallel goes to compiler/tensor_parallel.h (its own per-rank graph and runtime).
//
//   // on every rank, started by //comm:launch --nproc=4 (or torchrun, mpirun, srun):
//   CompileOptions o; o.strategy = Strategy::kHybridShard; o.mesh = {2, 2};
//   o.binding = {{"batch", 2}, {"seq", 512}};          // per rank: this rank's share of the batch
//   SG_ASSIGN_OR_RETURN(auto step, Compile(forward, o));
//   for (auto& [name, full] : init) SG_RETURN_IF_ERROR(step->Write(name, full));  // keeps the shard
//   SG_RETURN_IF_ERROR(step->Run(my_batch));
//
// The loss is the global mean over every rank's non-ignored tokens, so N ranks with batch B/N
// each train exactly like one rank with batch B.
#ifndef SGTRAIN_COMPILER_DISTRIBUTED_H_
#define SGTRAIN_COMPILER_DISTRIBUTED_H_

#include <memory>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "compiler/data_parallel_graph.h"
#include "graph/ir.h"

namespace sg::compiler {

// Compile for options.strategy != kNone, or for kNone with options.micro_batches > 1 (the
// data-parallel runtime on a group of one: no launcher needed). Errors: NotFound without launcher
// variables, InvalidArgument when the mesh does not cover the job's ranks or a tensor-parallel split
// does not divide (heads, ffn), Unimplemented for a strategy or placement the runtime cannot run
// yet (e.g. FSDP x TP, micro-batches with tensor parallelism), naming it.
absl::StatusOr<std::unique_ptr<CompiledStep>> CompileDistributed(const graph::Graph& g, const CompileOptions& o);

// What one rank of a kFsdp step over `ranks` ranks allocates (ShardedStepMemory, compiler/fsdp.h):
// rank 0, which holds the largest torch.chunk rows. `forward` as Compile takes it; options.binding
// is per rank. Plans only: e.g. the 1b step on 2 GPUs, on a machine without a GPU. Beyond the
// single-device plan's arena + state / ranks it counts the f32 gradient shards, the gathered
// parameters and unit gradients in the arena, and the collective staging; the CPU's host-ring
// reduce-scatter work buffer (comm) is not in it.
struct ShardedStepMemory;
absl::StatusOr<ShardedStepMemory> PlanFsdpMemory(const graph::Graph& forward, const CompileOptions& o, int ranks);

// The training step Compile prepares from a forward graph (mixed precision, the graph pipeline),
// or `g` itself when it is one already. Shared by the single-device and distributed paths.
absl::StatusOr<graph::Graph> PrepareTrainingGraph(const graph::Graph& g, const CompileOptions& o);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_DISTRIBUTED_H_
