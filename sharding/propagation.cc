// The propagation engine (one rule per mesh dim) and the rules of the elementwise, layout,
// reduction and optimizer ops. Model ops' rules: propagation_model_ops.cc. The table: propagation.h.
#include "sharding/propagation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "sharding/propagation_rules.h"

namespace sg::sharding {
namespace internal {

bool Divisible(const graph::Dim& d, int parts) {
  return !d.is_constant() || d.value() % parts == 0;
}

namespace {

using graph::OpKind;

DimSharding Same(const std::vector<Placement>& in, int num_outputs, Placement p) {
  return {std::vector<Placement>(in.size(), p), std::vector<Placement>(num_outputs, p), {}};
}

DimSharding UnaryRule(const RuleContext& c, const std::vector<Placement>& in) {
  const OpKind op = c.node->op;
  Placement p = in[0];
  if (p.is_partial()) {
    const bool max = p.reduce_op() == ReduceOp::kMax;
    const bool linear = op == OpKind::kNeg || op == OpKind::kScale || op == OpKind::kCast;
    const bool keeps_max = op == OpKind::kCast ||
                           (op == OpKind::kScale && graph::AttrFloat(*c.node, "factor") >= 0);
    if (!(max ? keeps_max : linear)) p = R();
  }
  return {{p}, {p}, {}};
}

// add/sub/mul/div with suffix broadcasting: operand i's dim d is output dim d + offset(i).
DimSharding BinaryRule(const RuleContext& c, const std::vector<Placement>& in) {
  const OpKind op = c.node->op;
  const int out_rank = std::max(c.rank(0), c.rank(1));
  const int off[2] = {out_rank - c.rank(0), out_rank - c.rank(1)};
  // The output placement: the first operand's shard, else a partial the op is linear in.
  Placement target = R();
  for (int i = 0; i < 2 && !target.is_shard(); ++i) {
    if (in[i].is_shard()) target = S(in[i].dim() + off[i]);
  }
  int partial_operand = -1;  // mul/div: the one operand that stays partial
  if (!target.is_shard()) {
    const bool additive = op == OpKind::kAdd || op == OpKind::kSub;
    if (additive) {
      const Placement& p = in[0].is_partial() ? in[0] : in[1];
      const bool ok = IsLinearPartial(p) && (!in[0].is_partial() || in[0] == p) &&
                      (!in[1].is_partial() || in[1] == p);
      if (ok) target = p;
    } else {
      for (int i = 0; i < (op == OpKind::kDiv ? 1 : 2) && partial_operand < 0; ++i) {
        if (IsLinearPartial(in[i])) partial_operand = i, target = in[i];
      }
    }
  }
  DimSharding d;
  for (int i = 0; i < 2; ++i) {
    if (target.is_shard()) {
      const int dim = target.dim() - off[i];
      d.inputs.push_back(dim >= 0 ? S(dim) : R());
    } else if (target.is_partial()) {
      d.inputs.push_back(partial_operand < 0 || partial_operand == i ? target : R());
    } else {
      d.inputs.push_back(R());
    }
  }
  d.outputs = {target};
  return d;
}

// Ops pointwise over all inputs (same shapes) and linear in input 0 when `linear_first`; the last
// dim must be whole when `needs_last`.
DimSharding PointwiseRule(const RuleContext& c, const std::vector<Placement>& in, bool linear_first,
                          bool needs_last, int num_outputs) {
  const int rank = c.rank(0);
  for (const Placement& p : in) {
    if (p.is_shard() && (!needs_last || p.dim() < rank - 1)) return Same(in, num_outputs, p);
  }
  if (linear_first && IsLinearPartial(in[0])) {
    DimSharding d = Same(in, num_outputs, in[0]);
    for (size_t i = 1; i < in.size(); ++i) d.inputs[i] = R();
    return d;
  }
  return Same(in, num_outputs, R());
}

// Groups of dims with equal products: in[in_begin,in_end) <-> out[out_begin,out_end).
struct DimGroup {
  int in_begin, in_end, out_begin, out_end;
};

// `a` divides `b` as monomials: coefficient divides and a's symbols are a sub-multiset of b's.
bool Divides(const graph::Dim& a, const graph::Dim& b) {
  if (a.coeff() == 0 || b.coeff() % a.coeff() != 0) return false;
  const std::vector<std::string>& x = a.symbols();
  const std::vector<std::string>& y = b.symbols();
  return std::includes(y.begin(), y.end(), x.begin(), x.end());
}

// False when the shapes cannot be matched group by group (then everything is replicated).
bool ReshapeGroups(const graph::SymShape& in, const graph::SymShape& out,
                   std::vector<DimGroup>* groups) {
  int i = 0, j = 0;
  const int n = int(in.size()), m = int(out.size());
  while (i < n && j < m) {
    DimGroup g{i, i + 1, j, j + 1};
    graph::Dim a = in[i], b = out[j];
    while (a != b) {
      if (Divides(a, b) && g.in_end < n) {
        a = a * in[g.in_end++];
      } else if (Divides(b, a) && g.out_end < m) {
        b = b * out[g.out_end++];
      } else {
        return false;
      }
    }
    groups->push_back(g);
    i = g.in_end, j = g.out_end;
  }
  // Trailing size-1 dims join the last group.
  for (; i < n; ++i) {
    if (in[i] != graph::Dim(1) || groups->empty()) return false;
    groups->back().in_end = i + 1;
  }
  for (; j < m; ++j) {
    if (out[j] != graph::Dim(1) || groups->empty()) return false;
    groups->back().out_end = j + 1;
  }
  return true;
}

DimSharding ReshapeRule(const RuleContext& c, const std::vector<Placement>& in) {
  const Placement& p = in[0];
  if (!p.is_shard()) return {{p}, {p}, {}};
  const graph::SymShape& from = c.type(0).shape;
  const graph::SymShape& to = graph::AttrShape(*c.node, "shape");
  std::vector<DimGroup> groups;
  if (ReshapeGroups(from, to, &groups)) {
    for (const DimGroup& g : groups) {
      // Chunks of the outermost dim are contiguous blocks of the group on both sides when both
      // outermost dims split evenly.
      if (g.in_begin == p.dim() && Divisible(from[g.in_begin], c.mesh_dim_size) &&
          Divisible(to[g.out_begin], c.mesh_dim_size)) {
        return {{p}, {S(g.out_begin)}, {}};
      }
    }
  }
  return {{R()}, {R()}, {}};
}

DimSharding TransposeRule(const RuleContext& c, const std::vector<Placement>& in) {
  const graph::IntList& perm = graph::AttrInts(*c.node, "perm");
  const Placement& p = in[0];
  if (!p.is_shard()) return {{p}, {p}, {}};
  for (size_t j = 0; j < perm.size(); ++j) {
    if (perm[j] == p.dim()) return {{p}, {S(int(j))}, {}};
  }
  return {{R()}, {R()}, {}};
}

DimSharding ReduceSumRule(const RuleContext& c, const std::vector<Placement>& in) {
  const graph::IntList& dims = graph::AttrInts(*c.node, "dims");
  const Placement& p = in[0];
  if (p.is_partial()) {
    const Placement keep = IsLinearPartial(p) ? p : R();
    return {{keep}, {keep}, {}};
  }
  if (!p.is_shard()) return {{p}, {p}, {}};
  if (std::find(dims.begin(), dims.end(), p.dim()) != dims.end()) {
    return {{p}, {Placement::Partial()}, {}};
  }
  const int removed_before = int(std::count_if(dims.begin(), dims.end(),
                                               [&](int64_t d) { return d < p.dim(); }));
  return {{p}, {S(p.dim() - removed_before)}, {}};
}

DimSharding BroadcastRule(const RuleContext& c, const std::vector<Placement>& in) {
  const graph::IntList& dims = graph::AttrInts(*c.node, "dims");
  const int out_rank = int(graph::AttrShape(*c.node, "shape").size());
  const Placement& p = in[0];
  if (!p.is_shard()) return {{p}, {p}, {}};
  int k = 0;  // input dims map, in order, to the output dims not in `dims`
  for (int j = 0; j < out_rank; ++j) {
    if (std::find(dims.begin(), dims.end(), j) != dims.end()) continue;
    if (k++ == p.dim()) return {{p}, {S(j)}, {}};
  }
  return {{R()}, {R()}, {}};
}

DimSharding GradNormRule(const RuleContext& c, const std::vector<Placement>& in) {
  DimSharding d;
  bool any_shard = false;
  for (const Placement& p : in) {
    d.inputs.push_back(p.is_partial() ? R() : p);
    any_shard |= p.is_shard();
  }
  d.outputs = {R(), R()};
  if (any_shard) {
    d.internal.push_back({ReduceOp::kSum, 0, graph::Dim(1), 1, "sum of squared gradient shards"});
  }
  return d;
}

DimSharding AdamWRule(const RuleContext& c, const std::vector<Placement>& in) {
  const Placement p = in[0].is_partial() ? R() : in[0];
  DimSharding d;
  d.inputs = {p, p, p, p, R(), R(), R()};
  d.outputs = {p, p, p};
  return d;
}

DimSharding DimRule(const RuleContext& c, const std::vector<Placement>& in) {
  const int n_out = int(c.node->outputs.size());
  switch (c.node->op) {
    case OpKind::kParameter:
    case OpKind::kInput:
    case OpKind::kFill: return Same(in, n_out, R());
    case OpKind::kEmbedding: return EmbeddingRule(c, in);
    case OpKind::kEmbeddingBackward: return EmbeddingBackwardRule(c, in);
    case OpKind::kMatmul: return MatmulRule(c, in);
    case OpKind::kRmsNorm:
    case OpKind::kRmsNormBackward:
    case OpKind::kAddRmsNorm:
    case OpKind::kAddRmsNormBackward: return NormRule(c, in);
    case OpKind::kRope:
    case OpKind::kRopeBackward: return RopeRule(c, in);
    case OpKind::kAttention:
    case OpKind::kAttentionBackward: return AttentionRule(c, in);
    case OpKind::kSwiGLU: return PointwiseRule(c, in, false, false, 1);
    case OpKind::kSwiGLUBackward: return PointwiseRule(c, in, true, false, 2);
    case OpKind::kSoftmaxCrossEntropy:
    case OpKind::kSoftmaxCrossEntropyBackward:
    case OpKind::kNllLoss:
    case OpKind::kNllLossBackward: return LossRule(c, in);
    case OpKind::kLogSoftmax: return PointwiseRule(c, in, false, true, 1);
    case OpKind::kLogSoftmaxBackward: return PointwiseRule(c, in, true, true, 1);
    case OpKind::kSiluBackward: return PointwiseRule(c, in, true, false, 1);
    case OpKind::kAdd:
    case OpKind::kSub:
    case OpKind::kMul:
    case OpKind::kDiv: return BinaryRule(c, in);
    case OpKind::kNeg:
    case OpKind::kScale:
    case OpKind::kSilu:
    case OpKind::kExp:
    case OpKind::kLog:
    case OpKind::kRsqrt:
    case OpKind::kCast: return UnaryRule(c, in);
    case OpKind::kReshape: return ReshapeRule(c, in);
    case OpKind::kTranspose: return TransposeRule(c, in);
    case OpKind::kReduceSum: return ReduceSumRule(c, in);
    case OpKind::kBroadcast: return BroadcastRule(c, in);
    case OpKind::kGradNorm: return GradNormRule(c, in);
    case OpKind::kAdamW: return AdamWRule(c, in);
  }
  return Same(in, n_out, R());
}

}  // namespace
}  // namespace internal

absl::StatusOr<OpSharding> Propagate(const graph::Node& node,
                                     const std::vector<graph::Type>& input_types,
                                     const std::vector<Placements>& input_placements,
                                     const DeviceMesh& mesh, const PropagationOptions& options) {
  const char* name = graph::OpName(node.op);
  const size_t n_in = node.inputs.size();
  if (input_types.size() != n_in || input_placements.size() != n_in) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected ", n_in, " input types and placements, found ",
                     input_types.size(), " and ", input_placements.size()));
  }
  for (size_t i = 0; i < n_in; ++i) {
    if (int(input_placements[i].size()) != mesh.ndim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " input ", i, ": expected one placement per dim of mesh ", mesh.ToString(),
          ", found ", PlacementsToString(input_placements[i])));
    }
    for (const Placement& p : input_placements[i]) {
      if (p.is_shard() && p.dim() >= input_types[i].rank()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " input ", i, ": ", p.ToString(),
                                                       " is beyond the rank of ",
                                                       input_types[i].ToString()));
      }
    }
  }
  if (!options.policy.empty() && int(options.policy.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("propagation options: expected ", mesh.ndim(),
                                                   " conflict policies, found ",
                                                   options.policy.size()));
  }
  OpSharding out;
  out.inputs.assign(n_in, Placements(mesh.ndim()));
  out.outputs.assign(node.outputs.size(), Placements(mesh.ndim()));
  for (int m = 0; m < mesh.ndim(); ++m) {
    internal::RuleContext c{&node, &input_types, mesh.dim_size(m),
                            options.policy.empty() ? ConflictPolicy::kGatherWeights
                                                   : options.policy[m]};
    std::vector<Placement> in(n_in);
    for (size_t i = 0; i < n_in; ++i) in[i] = input_placements[i][m];
    internal::DimSharding d = internal::DimRule(c, in);
    for (size_t i = 0; i < n_in; ++i) out.inputs[i][m] = d.inputs[i];
    for (size_t j = 0; j < node.outputs.size(); ++j) out.outputs[j][m] = d.outputs[j];
    for (InternalCollective& ic : d.internal) {
      ic.mesh_dim = m;
      out.internal.push_back(std::move(ic));
    }
  }
  // Rows all-reduced inside a kernel are split by the other mesh dims that shard them.
  for (InternalCollective& ic : out.internal) {
    if (ic.elements == graph::Dim(1)) continue;
    const int l = node.op == graph::OpKind::kSoftmaxCrossEntropyBackward ? 1 : 0;
    for (int m = 0; m < mesh.ndim(); ++m) {
      const Placement& p = out.inputs[l][m];
      if (m != ic.mesh_dim && internal::IsLeadShard(p, input_types[l].rank())) {
        ic.divisor *= mesh.dim_size(m);
      }
    }
  }
  return out;
}

}  // namespace sg::sharding
