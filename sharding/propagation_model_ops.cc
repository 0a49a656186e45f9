// Propagation rules of the model ops: matmul, embedding, norms, attention, rope and the losses.
// The table of what each rule does is in propagation.h.
#include <string>

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "sharding/propagation_rules.h"

namespace sg::sharding::internal {
namespace {

using graph::AttrString;
using graph::OpKind;

// P(max) cannot pass through a linear op; nor can a partial of an operand that meets another.
Placement DropMaxPartial(const Placement& p) { return p.is_partial() && !IsLinearPartial(p) ? R() : p; }

// Output placement and (a, b) requirements of a plain matmul a[...,K] x b[K,N] (b[N,K] if trans_b).
void PlainMatmul(const RuleContext& c, Placement a, Placement b, Placement* out, Placement* ra,
                 Placement* rb) {
  const int last = c.rank(0) - 1;
  const bool tb = graph::AttrBool(*c.node, "trans_b");
  const int bk = tb ? 1 : 0, bn = tb ? 0 : 1;
  const bool move = c.policy == ConflictPolicy::kMoveActivations;
  if (a.is_partial() && !b.is_replicate()) a = R();
  if (b.is_partial() && !a.is_replicate()) b = R();
  if (a.is_partial() || b.is_partial()) {  // linear in each operand: P x R -> P
    *ra = a, *rb = b, *out = a.is_partial() ? a : b;
    return;
  }
  if (IsLeadShard(a, last + 1)) {
    if (b.is_replicate() || !move) {  // data parallel; a sharded weight is gathered (FSDP)
      *ra = a, *rb = R(), *out = a;
    } else if (b.is_shard(bn)) {  // sequence parallel into column parallel: gather the activation
      *ra = R(), *rb = b, *out = S(last);
    } else {  // into row parallel: move the activation's shard to K
      *ra = S(last), *rb = b, *out = Placement::Partial();
    }
    return;
  }
  if (a.is_shard(last)) {
    if (b.is_shard(bn)) {
      *ra = R(), *rb = b, *out = S(last);
    } else {  // row parallel; a replicated weight is sliced locally
      *ra = a, *rb = S(bk), *out = Placement::Partial();
    }
    return;
  }
  // a replicated.
  if (b.is_shard(bn)) {
    *ra = R(), *rb = b, *out = S(last);  // column parallel
  } else if (b.is_shard(bk)) {
    *ra = S(last), *rb = b, *out = Placement::Partial();  // row parallel, a sliced locally
  } else {
    *ra = R(), *rb = R(), *out = R();
  }
}

// Weight-gradient matmul: a[...,M]^T x b[...,N] contracting every leading dim -> [M,N].
void TransAMatmul(const RuleContext& c, Placement a, Placement b, Placement* out, Placement* ra,
                  Placement* rb) {
  const int rank = c.rank(0), last = rank - 1;
  const bool move = c.policy == ConflictPolicy::kMoveActivations;
  if (a.is_partial() && !b.is_replicate()) a = R();
  if (b.is_partial() && !a.is_replicate()) b = R();
  if (a.is_partial() || b.is_partial()) {
    *ra = a, *rb = b, *out = a.is_partial() ? a : b;
    return;
  }
  const bool weight_dim = a.is_shard(last) || b.is_shard(last);
  if ((IsLeadShard(a, rank) || IsLeadShard(b, rank)) && !(move && weight_dim)) {
    const Placement lead = IsLeadShard(a, rank) ? a : b;  // both contract the same leading dims
    *ra = lead, *rb = lead, *out = Placement::Partial();
  } else if (a.is_shard(last)) {
    *ra = a, *rb = R(), *out = S(0);
  } else if (b.is_shard(last)) {
    *ra = R(), *rb = b, *out = S(1);
  } else {
    *ra = R(), *rb = R(), *out = R();
  }
}

}  // namespace

DimSharding MatmulRule(const RuleContext& c, const std::vector<Placement>& in) {
  DimSharding d;
  Placement out, ra, rb;
  const Placement a = DropMaxPartial(in[0]), b = DropMaxPartial(in[1]);
  if (graph::AttrBool(*c.node, "trans_a")) {
    TransAMatmul(c, a, b, &out, &ra, &rb);
  } else {
    PlainMatmul(c, a, b, &out, &ra, &rb);
  }
  d.inputs = {ra, rb};
  const std::string& epi = AttrString(*c.node, "epilogue");
  const int out_last = graph::AttrBool(*c.node, "trans_a") ? 1 : c.rank(0) - 1;
  if (epi == "bias" || epi == "bias_residual") {
    // bias[N] is added once per output element: it follows a shard of N, is zeroed off rank 0 of
    // a partial output, and is replicated otherwise.
    d.inputs.push_back(out.is_shard(out_last) ? S(0) : out.is_partial() ? out : R());
  }
  if (epi == "residual" || epi == "bias_residual") d.inputs.push_back(out);
  d.outputs = {out};
  return d;
}

DimSharding EmbeddingRule(const RuleContext& c, const std::vector<Placement>& in) {
  const int ids_rank = c.rank(1);
  Placement table = DropMaxPartial(in[0]);
  Placement ids = in[1].is_shard() ? in[1] : R();
  if (ids.is_shard()) {
    const bool keep_table = c.policy == ConflictPolicy::kMoveActivations && table.is_shard();
    if (!keep_table) return {{R(), ids}, {ids}, {}};
    ids = R();
  }
  if (table.is_shard(0)) return {{table, R()}, {Placement::Partial()}, {}};  // vocab parallel
  if (table.is_shard(1)) return {{table, R()}, {S(ids_rank)}, {}};
  if (table.is_partial()) return {{table, R()}, {table}, {}};
  return {{R(), R()}, {R()}, {}};
}

DimSharding EmbeddingBackwardRule(const RuleContext& c, const std::vector<Placement>& in) {
  const int dy_rank = c.rank(0);
  const Placement dy = DropMaxPartial(in[0]);
  const Placement& ids = in[1];
  // Rows split: every shard scatter-adds its rows into a full-size table gradient.
  if (IsLeadShard(dy, dy_rank)) return {{dy, dy}, {Placement::Partial()}, {}};
  if (ids.is_shard()) return {{ids, ids}, {Placement::Partial()}, {}};
  if (dy.is_shard()) return {{dy, R()}, {S(1)}, {}};
  if (dy.is_partial()) return {{dy, R()}, {dy}, {}};
  return {{R(), R()}, {R()}, {}};
}

DimSharding NormRule(const RuleContext& c, const std::vector<Placement>& in) {
  const OpKind op = c.node->op;
  // Index of the forward activation (the tensor normalized over its last dim) and of the weight.
  const int x = op == OpKind::kRmsNorm ? 0 : op == OpKind::kRmsNormBackward ? 1
              : op == OpKind::kAddRmsNorm ? 0 : 2;
  const int w = int(in.size()) - 1;
  const int rank = c.rank(x);
  const bool backward = op == OpKind::kRmsNormBackward || op == OpKind::kAddRmsNormBackward;
  // The row shard to keep: add_rmsnorm prefers its residual's (the residual stream's layout).
  Placement lead = R();
  std::vector<int> order;
  if (op == OpKind::kAddRmsNorm) order = {1, 0};
  for (int i = 0; i < w; ++i) order.push_back(i);
  for (int i : order) {
    if (IsLeadShard(in[i], rank)) {
      lead = in[i];
      break;
    }
  }
  DimSharding d;
  if (lead.is_shard()) {
    d.inputs.assign(in.size(), lead);
    d.inputs[w] = R();
    d.outputs = {lead, backward ? Placement::Partial() : lead};
    if (op == OpKind::kRmsNorm) d.outputs.resize(1);
    return d;
  }
  // Rows whole on this mesh dim. Backward ops are linear in their cotangents: a partial dy (and dh)
  // with replicated forward values gives partial dx and dw.
  d.inputs.assign(in.size(), R());
  d.outputs.assign(op == OpKind::kRmsNorm ? 1 : 2, R());
  if (backward) {
    const int num_cotangents = op == OpKind::kRmsNormBackward ? 1 : 2;
    for (int i = 0; i < num_cotangents; ++i) {
      if (!IsLinearPartial(in[i])) continue;
      for (int j = 0; j < num_cotangents; ++j) d.inputs[j] = in[i];
      d.outputs = {in[i], in[i]};
      break;
    }
  }
  return d;
}

DimSharding AttentionRule(const RuleContext& c, const std::vector<Placement>& in) {
  const bool backward = c.node->op == OpKind::kAttentionBackward;
  const int q = backward ? 1 : 0;
  const graph::Dim& hq = c.type(q).shape[2];
  const graph::Dim& hkv = c.type(q + 1).shape[2];
  const bool heads_ok = Divisible(hq, c.mesh_dim_size) && Divisible(hkv, c.mesh_dim_size);
  Placement target = R();
  for (const Placement& p : in) {
    if (p.is_shard(0) || (p.is_shard(2) && heads_ok)) {
      target = p;
      break;
    }
  }
  DimSharding d;
  d.inputs.assign(in.size(), target);
  d.outputs.assign(backward ? 3 : 1, target);
  return d;
}

DimSharding RopeRule(const RuleContext& c, const std::vector<Placement>& in) {
  const Placement& p = in[0];
  const Placement keep = p.is_shard(0) || p.is_shard(2) || IsLinearPartial(p) ? p : R();
  return {{keep}, {keep}, {}};
}

// softmax_cross_entropy(logits, targets), nll_loss(logp, targets) and their backwards
// (dloss, logits|logp, targets).
DimSharding LossRule(const RuleContext& c, const std::vector<Placement>& in) {
  const OpKind op = c.node->op;
  const bool backward =
      op == OpKind::kSoftmaxCrossEntropyBackward || op == OpKind::kNllLossBackward;
  const bool softmax = op == OpKind::kSoftmaxCrossEntropy || op == OpKind::kSoftmaxCrossEntropyBackward;
  const int l = backward ? 1 : 0;  // logits / logp
  const int rank = c.rank(l), last = rank - 1;
  graph::Dim rows = 1;
  for (int i = 0; i < last; ++i) rows = rows * c.type(l).shape[i];
  const Placement logits = in[l], targets = in[l + 1];
  DimSharding d;
  d.inputs.assign(in.size(), R());
  d.outputs = {R()};
  const InternalCollective count{ReduceOp::kSum, 0, graph::Dim(1), 1,
                                 "count of non-ignored rows (the mean's global denominator)"};
  if (IsLeadShard(logits, rank) || targets.is_shard()) {
    const Placement lead = IsLeadShard(logits, rank) ? logits : targets;
    d.inputs[l] = lead, d.inputs[l + 1] = lead;
    d.outputs = {backward ? lead : Placement::Partial()};
    d.internal.push_back(count);
    return d;
  }
  if (logits.is_shard(last)) {  // vocabulary parallel
    d.inputs[l] = logits;
    d.outputs = {backward ? logits : softmax ? R() : Placement::Partial()};
    if (softmax) {
      d.internal.push_back({ReduceOp::kMax, 0, rows, 1, "row max of vocab-parallel logits"});
      d.internal.push_back({ReduceOp::kSum, 0, rows, 1, "row sum of exp(logits - max)"});
      if (!backward) {
        d.internal.push_back({ReduceOp::kSum, 0, rows, 1, "target logit (held by one shard)"});
      }
    }
    return d;
  }
  // nll_loss is linear in logp; its backward does not read logp's values at all.
  if (op == OpKind::kNllLoss && IsLinearPartial(logits)) {
    d.inputs[l] = logits;
    d.outputs = {logits};
  }
  return d;
}

}  // namespace sg::sharding::internal
