// The pre-flight report: without running anything, prints per-rank memory by category and
// per-step communication by collective for each candidate strategy, and the chosen one.
//
//   bazel run //sharding:plan -- --model=7b --mesh=2x4 --strategy=auto --batch=16 --seq=4096
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "graph/models/llama.h"
#include "sharding/models.h"
#include "kernels/core/status.h"
#include "sharding/planner.h"

ABSL_FLAG(std::string, model, "7b", "tiny, 124m, 1b or 7b");
ABSL_FLAG(std::string, mesh, "2x4", "device mesh: 2x4 (dp x tp) or dp=2,tp=4");
ABSL_FLAG(std::string, strategy, "auto",
          "auto, or one of replicate (ddp), fsdp, hybrid_shard, tp, fsdp_tp, cp (context parallel "
          "over the mesh's last dim), pp (pipeline stages over the mesh's last dim)");
ABSL_FLAG(int64_t, batch, 16, "global batch, sequences per step");
ABSL_FLAG(int64_t, seq, 2048, "sequence length");
ABSL_FLAG(double, memory_gb, 140, "per-device memory budget, GB");
ABSL_FLAG(double, alpha_us, 10, "collective latency per hop, microseconds");
ABSL_FLAG(double, allreduce_gbps, 316, "all-reduce bus bandwidth, GB/s (comm collectives_benchmark)");
ABSL_FLAG(double, allgather_gbps, 316, "all-gather / reduce-scatter bus bandwidth, GB/s");
ABSL_FLAG(double, p2p_gbps, 357, "point-to-point bandwidth, GB/s");
ABSL_FLAG(double, tflops, 600, "measured matmul rate, TFLOP/s");

namespace sg::sharding {
namespace {

absl::Status Run() {
  SG_ASSIGN_OR_RETURN(graph::LlamaConfig config, LlamaConfigByName(absl::GetFlag(FLAGS_model)));
  SG_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Parse(absl::GetFlag(FLAGS_mesh)));
  PlannerOptions options;
  const std::string strategy = absl::GetFlag(FLAGS_strategy);
  if (strategy == "auto") {
    options.context_parallel = options.pipeline = true;
  } else if (strategy == "cp" || strategy == "pp") {
    options.placement = false;
    (strategy == "cp" ? options.context_parallel : options.pipeline) = true;
  } else {
    SG_ASSIGN_OR_RETURN(StrategyKind k, ParseStrategy(strategy));
    options.candidates = {k};
  }
  options.memory_budget_bytes = absl::GetFlag(FLAGS_memory_gb) * 1e9;
  options.cost.alpha_s = absl::GetFlag(FLAGS_alpha_us) * 1e-6;
  options.cost.allreduce_busbw = absl::GetFlag(FLAGS_allreduce_gbps) * 1e9;
  options.cost.allgather_busbw = absl::GetFlag(FLAGS_allgather_gbps) * 1e9;
  options.cost.p2p_bw = absl::GetFlag(FLAGS_p2p_gbps) * 1e9;
  options.cost.flops_per_s = absl::GetFlag(FLAGS_tflops) * 1e12;
  const graph::Binding binding = {{"batch", absl::GetFlag(FLAGS_batch)},
                                  {"seq", absl::GetFlag(FLAGS_seq)}};
  SG_ASSIGN_OR_RETURN(graph::Graph step, graph::BuildLlamaTrainStep(config, {}));
  std::cout << "model " << absl::GetFlag(FLAGS_model) << " (dim " << config.dim << ", "
            << config.n_layers << " layers, " << config.n_heads << "/" << config.n_kv_heads
            << " heads, ffn " << config.ffn_dim << ", vocab " << config.vocab << "), mesh "
            << mesh.ToString() << ", batch " << binding.at("batch") << " x seq "
            << binding.at("seq") << ", " << step.nodes().size() << " graph nodes\n\n";
  SG_ASSIGN_OR_RETURN(PlannerResult r, ChooseStrategy(step, mesh, binding, options));
  for (const Candidate& c : r.candidates) {
    std::cout << c.Name();
    if (!c.skipped.empty()) {
      std::cout << ": not applicable (" << c.skipped << ")\n\n";
      continue;
    }
    std::cout << (c.fits ? "" : "  [does not fit]") << "\n" << c.cost.ToString() << "\n";
  }
  std::cout << r.explanation << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace sg::sharding

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Pre-flight sharding report: plan --model=7b --mesh=2x4 --strategy=auto [--batch --seq]");
  absl::ParseCommandLine(argc, argv);
  absl::Status s = sg::sharding::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
