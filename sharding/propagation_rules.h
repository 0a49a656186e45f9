// Internal to propagation: the per-mesh-dim rule signature shared by propagation.cc (engine,
// elementwise, layout, optimizer rules) and propagation_model_ops.cc (the model ops' rules).
#ifndef SGTRAIN_SHARDING_PROPAGATION_RULES_H_
#define SGTRAIN_SHARDING_PROPAGATION_RULES_H_

#include <vector>

#include "graph/ir.h"
#include "sharding/placement.h"
#include "sharding/propagation.h"

namespace sg::sharding::internal {

// What one rule sees: the node, its input types, and the mesh dim being decided.
struct RuleContext {
  const graph::Node* node;
  const std::vector<graph::Type>* types;
  int mesh_dim_size;
  ConflictPolicy policy;

  int rank(int input) const { return (*types)[input].rank(); }
  const graph::Type& type(int input) const { return (*types)[input]; }
};

// The decision on one mesh dim. `internal` entries get their mesh_dim filled by the engine.
struct DimSharding {
  std::vector<Placement> inputs;
  std::vector<Placement> outputs;
  std::vector<InternalCollective> internal;
};

inline Placement R() { return Placement::Replicate(); }
inline Placement S(int d) { return Placement::Shard(d); }
inline bool IsLinearPartial(const Placement& p) {
  return p.is_partial() && p.reduce_op() != ReduceOp::kMax;
}
// A shard of a leading (not the last) dim of a tensor of rank `rank`.
inline bool IsLeadShard(const Placement& p, int rank) { return p.is_shard() && p.dim() < rank - 1; }
// `d` divides evenly by the mesh dim (symbolic dims are assumed to; see propagation.h).
bool Divisible(const graph::Dim& d, int parts);

DimSharding MatmulRule(const RuleContext& c, const std::vector<Placement>& in);
DimSharding EmbeddingRule(const RuleContext& c, const std::vector<Placement>& in);
DimSharding EmbeddingBackwardRule(const RuleContext& c, const std::vector<Placement>& in);
DimSharding NormRule(const RuleContext& c, const std::vector<Placement>& in);
DimSharding AttentionRule(const RuleContext& c, const std::vector<Placement>& in);
DimSharding RopeRule(const RuleContext& c, const std::vector<Placement>& in);
DimSharding LossRule(const RuleContext& c, const std::vector<Placement>& in);

}  // namespace sg::sharding::internal

#endif  // SGTRAIN_SHARDING_PROPAGATION_RULES_H_
