#include "compiler/distributed.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/env.h"
#include "compiler/dist_context.h"
#include "compiler/fsdp.h"
#include "compiler/tensor_parallel.h"
#include "graph/ops.h"
#include "kernels/core/status.h"
#include "sharding/planner.h"
#include "sharding/strategy.h"

namespace sg::compiler {
namespace {

// The mesh dims every updated parameter is S(0) on (shard) and R on (replicate), from the plan.
absl::Status ParameterDims(const graph::Graph& train, const sharding::ShardingPlan& plan,
                           std::vector<int>* shard, std::vector<int>* replicate) {
  bool first = true;
  for (const graph::Node& n : train.nodes()) {
    if (n.op != graph::OpKind::kAdamW) continue;
    const int v = n.inputs[0];
    const sharding::Placements& pl = plan.placements[v];
    std::vector<int> s, r;
    for (int m = 0; m < int(pl.size()); ++m) {
      if (pl[m].is_shard(0)) {
        s.push_back(m);
      } else if (pl[m].is_replicate()) {
        r.push_back(m);
      } else {
        const graph::Node& src = train.nodes()[train.value(v).producer];
        return absl::UnimplementedError(absl::StrCat(
            "the distributed runtime shards parameters on dim 0 or replicates them; strategy '",
            sharding::StrategyName(plan.strategy.kind), "' places '", graph::AttrString(src, "name"), "' as ",
            sharding::PlacementsToString(pl), " (tensor parallelism runs through Strategy::kTensorParallel)"));
      }
    }
    if (!first && (s != *shard || r != *replicate)) {
      return absl::UnimplementedError(absl::StrCat("strategy '", sharding::StrategyName(plan.strategy.kind),
                                                   "' shards parameters over different mesh dims; the runtime "
                                                   "needs one layout for all"));
    }
    *shard = s;
    *replicate = r;
    first = false;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardedStepMemory> PlanFsdpMemory(const graph::Graph& forward, const CompileOptions& o, int ranks) {
  SG_RETURN_IF_ERROR(graph::Verify(forward));
  SG_ASSIGN_OR_RETURN(graph::Graph train, PrepareTrainingGraph(forward, o));
  return ShardedDataParallelStep::PlanMemory(train, o, ranks, /*shard_rank=*/0, ranks);
}

absl::StatusOr<std::unique_ptr<CompiledStep>> CompileDistributed(const graph::Graph& g, const CompileOptions& o) {
  SG_RETURN_IF_ERROR(graph::Verify(g));
  SG_ASSIGN_OR_RETURN(graph::Graph train, PrepareTrainingGraph(g, o));
  if (o.strategy == Strategy::kNone) {
    // One device with micro-batches: the data-parallel runtime on a group of one owns the gradient
    // accumulation and the token-count weighting of each micro-batch.
    SG_ASSIGN_OR_RETURN(std::unique_ptr<ShardedDataParallelStep> step,
                        ShardedDataParallelStep::Create(train, o, DataParallelLayout{}, nullptr,
                                                        absl::StrCat("one device, ", o.micro_batches, " micro-batches")));
    return std::unique_ptr<CompiledStep>(std::move(step));
  }
  if (o.strategy == Strategy::kTensorParallel) {
    // A model that does not split is refused before the rendezvous: every rank says why, none
    // waits for (or loses) a peer.
    SG_ASSIGN_OR_RETURN(comm::RankInfo info, comm::RankInfoFromEnv());
    SG_RETURN_IF_ERROR(TensorParallelApplies(train, int(o.mesh.empty() ? info.world_size : o.mesh.back()), o.loss));
  }
  comm::ProcessGroupOptions po;
  po.timeout = absl::Seconds(o.comm_timeout_s);
  SG_ASSIGN_OR_RETURN(std::shared_ptr<DistContext> ctx, DistContext::FromEnv(o.device, po));
  std::vector<int64_t> shape = o.mesh.empty() ? std::vector<int64_t>{ctx->world_size()} : o.mesh;
  SG_ASSIGN_OR_RETURN(sharding::DeviceMesh mesh, sharding::DeviceMesh::Parse(absl::StrJoin(shape, "x")));
  if (mesh.size() != ctx->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("Compile: mesh ", mesh.ToString(), " has ", mesh.size(),
                                                   " ranks, the job has ", ctx->world_size(),
                                                   " (WORLD_SIZE)"));
  }

  std::string why;
  sharding::ShardingPlan plan;
  switch (o.strategy) {
    case Strategy::kFsdp:
    case Strategy::kHybridShard: {
      sharding::Strategy s;
      s.kind = o.strategy == Strategy::kFsdp ? sharding::StrategyKind::kFsdp : sharding::StrategyKind::kHybridShard;
      SG_ASSIGN_OR_RETURN(plan, sharding::BuildShardingPlan(train, mesh, s));
      why = absl::StrCat("strategy ", sharding::StrategyName(s.kind), " on ", mesh.ToString());
      break;
    }
    case Strategy::kAuto: {
      // The planner models the whole job: the global batch is every rank's share.
      graph::Binding global = o.binding;
      if (global.count("batch")) global["batch"] *= mesh.size();
      sharding::PlannerOptions po2;
      po2.candidates = {sharding::StrategyKind::kReplicate, sharding::StrategyKind::kFsdp};
      if (mesh.ndim() == 2) po2.candidates.push_back(sharding::StrategyKind::kHybridShard);
      // Tensor parallelism over the mesh's last dim, when the model splits evenly on it.
      const absl::Status tp = TensorParallelApplies(train, mesh.dim_size(mesh.ndim() - 1), o.loss);
      if (tp.ok()) po2.candidates.push_back(sharding::StrategyKind::kTensorParallel);
      // FSDP x TP on a 2-D mesh: the tp slices also sharded over dim 0, when memory needs it.
      if (tp.ok() && mesh.ndim() == 2) po2.candidates.push_back(sharding::StrategyKind::kFsdpTp);
      SG_ASSIGN_OR_RETURN(sharding::PlannerResult r, sharding::ChooseStrategy(train, mesh, global, po2));
      plan = r.candidates[r.chosen].plan;
      why = absl::StrCat("auto (candidates the runtime lowers: replicate, fsdp", mesh.ndim() == 2 ? ", hybrid_shard" : "",
                         tp.ok() ? ", tp" : "", tp.ok() && mesh.ndim() == 2 ? ", fsdp_tp" : "", "): ", r.explanation,
                         tp.ok() ? "" : absl::StrCat(" (tp not considered: ", tp.message(), ")"));
      if (ctx->rank() == 0) std::cerr << "[sg::compiler] " << why << "\n";
      if (plan.strategy.kind == sharding::StrategyKind::kTensorParallel) {
        return CompileTensorParallel(train, o, ctx, mesh, why);
      }
      if (plan.strategy.kind == sharding::StrategyKind::kFsdpTp) {
        CompileOptions fsdp_tp = o;
        fsdp_tp.tensor_parallel_fsdp = true;
        return CompileTensorParallel(train, fsdp_tp, ctx, mesh, why);
      }
      break;
    }
    case Strategy::kTensorParallel:
      return CompileTensorParallel(train, o, ctx, mesh);  // compiler/tensor_parallel.h
    case Strategy::kNone:
      break;  // handled above
    case Strategy::kContextParallel:
    case Strategy::kPipeline:
      return absl::InvalidArgumentError(absl::StrCat("CompileDistributed: strategy ", StrategyName(o.strategy),
                                                     " has its own runtime (see Compile)"));
  }
  absl::StrAppend(&why, "; plan: ", plan.Summary());
  std::vector<int> shard_dims, replicate_dims;
  SG_RETURN_IF_ERROR(ParameterDims(train, plan, &shard_dims, &replicate_dims));
  DataParallelLayout layout;
  layout.world = &ctx->world();
  SG_ASSIGN_OR_RETURN(layout.shard, ctx->Group(mesh, shard_dims));
  SG_ASSIGN_OR_RETURN(layout.replicate, ctx->Group(mesh, replicate_dims));
  if (ctx->world_size() == 1) layout.world = nullptr;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<ShardedDataParallelStep> step,
                      ShardedDataParallelStep::Create(train, o, layout, ctx, why));
  return std::unique_ptr<CompiledStep>(std::move(step));
}

}  // namespace sg::compiler
