// Strategies and the ShardingPlan: what the compiler asks this layer for.
//
//   SG_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Parse("dp=2,tp=4"));
//   SG_ASSIGN_OR_RETURN(ShardingPlan plan,
//                       BuildShardingPlan(train_step_graph, mesh, Strategy{StrategyKind::kFsdpTp}));
//   plan.placements[v];          // every value's placements (one per mesh dim)
//   plan.redistributions;        // the collectives to run, each before node `node` (or at the end)
//   SG_ASSIGN_OR_RETURN(TensorSpec s, plan.Spec(graph, v, {{"batch", 8}, {"seq", 2048}}));
//
// A strategy assigns placements to the graph's sources; propagation (propagation.h) does the rest,
// node by node, and every place where an op needs other placements than its input has becomes a
// redistribution (redistribute.h). Mesh dims have roles: data-parallel dims split the batch
// ("tokens"/"targets" dim 0); the tensor-parallel dim (the mesh's last dim, for tp and fsdp_tp)
// splits weights Megatron-style with sequence parallelism.
//   replicate      (DDP) parameters R on every dim; gradients come out P(sum) and are all-reduced
//                  into the replicated optimizer update.
//   fsdp           (ZeRO-3) parameters, gradients and AdamW state S(0) over every mesh dim
//                  (nested); each use of a parameter all-gathers it (per layer, forward and again
//                  in backward), and the P(sum) gradients are reduce-scattered into S(0).
//   hybrid_shard   FSDP within the last mesh dim, replicated across the first (2-D mesh).
//   tp             Megatron on the last dim: wq/wk/wv/w1(gate)/w3(up)/output column-parallel (the
//                  weight's output-features dim), wo/w2(down) row-parallel (input features),
//                  tok_embeddings vocab-parallel, norms replicated; the residual stream is
//                  sequence-parallel (S(1)) between blocks; other mesh dims are data-parallel (DDP).
//   fsdp_tp        tp on the last dim, FSDP (S(0) of the TP shard) on the others.
// Column/row is read from how the graph uses the weight (trans_b), not assumed from the layout.
// Optimizer state "opt.m.<p>"/"opt.v.<p>" follows <p>; "update:<name>" outputs must come back in
// <name>'s placements (they are written in place), which may add redistributions at the end.
#ifndef SGTRAIN_SHARDING_STRATEGY_H_
#define SGTRAIN_SHARDING_STRATEGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/propagation.h"
#include "sharding/redistribute.h"

namespace sg::sharding {

enum class StrategyKind : uint8_t { kReplicate, kFsdp, kHybridShard, kTensorParallel, kFsdpTp };
inline constexpr StrategyKind kAllStrategies[] = {StrategyKind::kReplicate, StrategyKind::kFsdp,
                                                  StrategyKind::kHybridShard,
                                                  StrategyKind::kTensorParallel,
                                                  StrategyKind::kFsdpTp};
absl::string_view StrategyName(StrategyKind k);  // "replicate", "fsdp", "hybrid_shard", "tp", "fsdp_tp"
absl::StatusOr<StrategyKind> ParseStrategy(absl::string_view name);

struct Strategy {
  StrategyKind kind = StrategyKind::kFsdp;
  bool sequence_parallel = true;  // tp / fsdp_tp: keep the residual stream S(seq) on the tp dim
};

// How a parameter is split by tensor parallelism.
enum class TpRole : uint8_t { kReplicated, kColumn, kRow, kVocab };
// From the hierarchical name ("layers.3.attention.wq.weight"; "opt.m." prefixes are ignored).
TpRole TpRoleOf(absl::string_view param_name);

// One redistribution the runtime performs: `value` is converted from `src` to `dst` placements
// before node `node` reads it as input `input` (node == -1: for graph output `input`).
struct ValueRedistribution {
  int value = -1;
  int node = -1;
  int input = 0;
  std::string where;  // "layers.0.attention matmul input 1 (layers.0.attention.wq.weight)"
  RedistributePlan plan;
};

// A collective inside a sharded kernel (vocab-parallel cross-entropy, grad-norm).
struct NodeCollective {
  int node = -1;
  InternalCollective collective;
};

struct ShardingPlan {
  DeviceMesh mesh;
  Strategy strategy;
  PropagationOptions options;
  std::vector<Placements> placements;  // per value id (empty for ids not defined)
  std::vector<ValueRedistribution> redistributions;
  std::vector<NodeCollective> internal;

  // The spec of value `v` under concrete symbol sizes.
  absl::StatusOr<TensorSpec> Spec(const graph::Graph& g, int v, const graph::Binding& b) const;
  // Counts by step kind and mesh dim, e.g. "all-gather(dp) x 96, reduce-scatter(dp) x 48".
  std::string Summary() const;
};

// The placements `strategy` gives a source (parameter, input, optimizer state, fill) called
// `name` of type `type` in `g`. InvalidArgument when the mesh does not fit the strategy (e.g.
// hybrid_shard on a 1-D mesh).
absl::StatusOr<Placements> SourcePlacements(const graph::Graph& g, const graph::Node& source,
                                            const DeviceMesh& mesh, const Strategy& strategy);

// Propagates `strategy` through every node of `g` (a forward graph or a whole training step).
absl::StatusOr<ShardingPlan> BuildShardingPlan(const graph::Graph& g, const DeviceMesh& mesh,
                                               const Strategy& strategy);

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_STRATEGY_H_
