// Context parallelism through the one declarative call: Compile(graph, {.strategy =
// kContextParallel}) (registered by this target; link //compiler/context_parallel:cp_step).
//
//   // on every rank, started by //comm:launch --nproc=4:
//   CompileOptions o;  o.strategy = Strategy::kContextParallel;  o.mesh = {4};   // or {dp, cp}
//   o.binding = {{"batch", 2}, {"seq", 32768}};   // the GLOBAL sequence; batch per dp rank
//   SG_ASSIGN_OR_RETURN(auto step, Compile(forward, o));
//   SG_RETURN_IF_ERROR(step->Run(batch));          // [batch, seq] tokens/targets: the full sequence
//
// What changes against one device (the model graph does not):
//  - the last mesh dim is the "cp" dim; each of its ranks keeps the rows of the load-balanced
//    causal layout (cp_layout.h: chunks r and 2cp-1-r) of every [batch, seq] input, so the step is
//    lowered at seq = CpLayout::LocalSeq(rank) (it may differ by one between ranks);
//  - every attention node's launch becomes RingAttentionForward over the cp group (its
//    log-sum-exp kept for the backward), every attention_backward's RingAttentionBackward;
//  - every rope / rope_backward launch reads the local tokens' global positions;
//  - everything else runs on the local tokens: the data-parallel runtime (compiler/fsdp.h) treats
//    the cp ranks (and a leading "dp" dim) as ranks with a share of the tokens: each rank's loss
//    is its local mean, seeded by local/global token count, and parameter gradients are summed
//    over every rank: an all-reduce (parameters replicated) or, with
//    CompileOptions::context_parallel_fsdp, a reduce-scatter of ZeRO-3 shards over every rank
//    (FSDP x CP: parameters all-gathered per layer as under kFsdp).
// Errors: InvalidArgument when the mesh does not cover the job, or the last mesh dim does not
// divide into a layout for the bound seq; the data-parallel runtime's errors otherwise.
#ifndef SGTRAIN_COMPILER_CONTEXT_PARALLEL_CP_STEP_H_
#define SGTRAIN_COMPILER_CONTEXT_PARALLEL_CP_STEP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "graph/ir.h"

namespace sg::compiler {

// What Compile runs for Strategy::kContextParallel (also callable directly).
absl::StatusOr<std::unique_ptr<CompiledStep>> CompileContextParallel(const graph::Graph& forward,
                                                                     const CompileOptions& options);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_CONTEXT_PARALLEL_CP_STEP_H_
