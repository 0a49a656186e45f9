// The Llama training step as the benchmarks and GPU tests run it: the peer's configurations
// (shared/BASELINES.md), f32 master weights initialized like the peer (normal, std 0.02; norm
// weights 1), random token batches, and the FLOP count the MFU figure uses.
//
//   SG_ASSIGN_OR_RETURN(LlamaBenchConfig c, LlamaBenchConfigNamed("1b"));
//   SG_ASSIGN_OR_RETURN(graph::Graph fwd, graph::BuildLlamaForward(c.model));
//   SG_ASSIGN_OR_RETURN(auto step, Compile(fwd, LlamaStepOptions(c, Device::Cuda(0))));
//   SG_RETURN_IF_ERROR(InitLlamaParameters(*step, fwd, /*seed=*/1));
#ifndef SGTRAIN_COMPILER_LLAMA_STEP_H_
#define SGTRAIN_COMPILER_LLAMA_STEP_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "graph/models/llama.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

struct LlamaBenchConfig {
  std::string name;
  graph::LlamaConfig model;  // f32 parameters (master weights); bf16 compute via the precision option
  int64_t seq = 0, batch = 0;
  // Parameters N (embeddings included, as the peer counts them).
  int64_t Parameters() const;
  // 6 N + 12 L d S: FLOPs per token of one training step (the baselines' MFU convention).
  double FlopsPerToken() const;
};

// "124m", "1b", "7b" (the peer's shapes and seq x micro-batch), "tiny" (a CPU-sized model with
// head_dim 64 so the flash attention kernels apply). InvalidArgument for another name.
absl::StatusOr<LlamaBenchConfig> LlamaBenchConfigNamed(const std::string& name);

// bf16 mixed precision, AdamW (lr set separately, betas 0.9/0.95, wd 0.1), clipping at 1.0,
// binding {batch, seq}; recompute as given.
CompileOptions LlamaStepOptions(const LlamaBenchConfig& c, Device device,
                                RecomputePolicy recompute = RecomputePolicy::kSelective);

// Writes every trainable parameter: matrices normal(0, 0.02), vectors (norm weights) 1.
// Shapes come from `forward` (the graph compiled): full tensors, so a sharded step keeps its shard.
absl::Status InitLlamaParameters(CompiledStep& step, const graph::Graph& forward, uint64_t seed);

// tokens and targets i32[batch, seq] uniform in [0, vocab) (host tensors).
absl::StatusOr<std::map<std::string, Tensor>> RandomTokenBatch(const LlamaBenchConfig& c, uint64_t seed);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_LLAMA_STEP_H_
