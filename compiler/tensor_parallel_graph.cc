#include "compiler/tensor_parallel_graph.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "kernels/core/status.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/propagation.h"
#include "sharding/strategy.h"

namespace sg::compiler {
namespace {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using sharding::Placement;

std::string NodeName(const Node& n) { return absl::StrCat(n.scope.empty() ? "" : n.scope + " ", graph::OpName(n.op)); }

// The tp placement of a trainable parameter: the tp strategy's (the embedding and the LM head
// S(0) over the vocabulary), or with `vocab_parallel` false those two demoted to R.
absl::StatusOr<Placement> ParamPlacement(const Graph& g, const Node& n, const sharding::DeviceMesh& mesh,
                                         bool vocab_parallel) {
  const std::string& name = graph::AttrString(n, "name");
  const sharding::TpRole role = sharding::TpRoleOf(name);
  if (role == sharding::TpRole::kReplicated) return Placement::Replicate();
  const std::string unit = UnitOf(name);
  if (!vocab_parallel && (role == sharding::TpRole::kVocab || unit == "output" || unit == "lm_head")) {
    return Placement::Replicate();
  }
  sharding::Strategy s;
  s.kind = sharding::StrategyKind::kTensorParallel;
  s.sequence_parallel = false;
  SG_ASSIGN_OR_RETURN(sharding::Placements p, sharding::SourcePlacements(g, n, mesh, s));
  return p[0];
}

// How a dim of extent n splits over T ranks: n / T each, or (only the vocabulary, `vocab` > 0)
// torch.chunk's uneven pieces. InvalidArgument otherwise, or for an empty piece.
absl::StatusOr<sharding::ChunkRange> SplitRange(const graph::Dim& d, int T, int rank, int64_t vocab,
                                                const std::string& what, int dim) {
  if (d.is_constant() && d.value() % T == 0) return sharding::ChunkRange{rank * (d.value() / T), d.value() / T};
  if (d.is_constant() && vocab > 0 && d.value() == vocab) {
    const sharding::ChunkRange c = sharding::Chunk(vocab, T, rank);
    if (c.length > 0) return c;
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel over ", T, " ranks: the vocabulary of ", vocab,
                                                   " leaves rank ", rank, " no rows (chunks of ",
                                                   sharding::MaxChunk(vocab, T), "): expected vocab > ",
                                                   (T - 1) * sharding::MaxChunk(vocab, T)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor parallel over ", T, " ranks: ", what, " is split on dim ", dim, ", expected its extent ",
      d.ToString(), " to be a constant divisible by ", T));
}

// The local shape of a value of global type `t` placed as `p` on tp rank `rank` of T.
absl::StatusOr<graph::SymShape> LocalShape(const graph::SymShape& global, const Placement& p, int T, int rank,
                                           int64_t vocab, const std::string& what) {
  graph::SymShape local = global;
  if (!p.is_shard()) return local;
  SG_ASSIGN_OR_RETURN(sharding::ChunkRange c, SplitRange(global[size_t(p.dim())], T, rank, vocab, what, p.dim()));
  local[size_t(p.dim())] = graph::Dim(c.length);
  return local;
}

// The vocabulary's extent: the last dim of the first cross-entropy's logits, else the first
// embedding table's rows; 0 when neither is a constant.
int64_t VocabOf(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kSoftmaxCrossEntropy) {
      const graph::Dim& d = g.type(n.inputs[0]).shape.back();
      return d.is_constant() ? d.value() : 0;
    }
  }
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kEmbedding) {
      const graph::Dim& d = g.type(n.inputs[0]).shape[0];
      return d.is_constant() ? d.value() : 0;
    }
  }
  return 0;
}

// Attention heads must split evenly, and GQA's grouping must stay local to a rank.
absl::Status CheckHeads(const Graph& g, int T) {
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::kAttention) continue;
    const graph::Dim hq = g.type(n.inputs[0]).shape[2], hkv = g.type(n.inputs[1]).shape[2];
    if (!hq.is_constant() || !hkv.is_constant() || hq.value() % T != 0 || hkv.value() % T != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallel over ", T, " ranks splits attention heads (", n.scope,
          "): expected the query heads and the key/value heads divisible by ", T, ", found ", hq.ToString(),
          " query heads and ", hkv.ToString(), " key/value heads"));
    }
  }
  return absl::OkStatus();
}

// Whether node n runs on this rank's vocabulary shard: an embedding whose table is S(0) (its
// backward once one did), a cross-entropy (or its backward) whose logits are S(vocab). A
// cross-entropy over logits split another way is an error rather than a silent wrong loss.
absl::StatusOr<bool> VocabNode(const Graph& g, const Node& n, const std::vector<Placement>& pl, bool vp,
                               int64_t vocab, bool table_sharded) {
  if (!vp) return false;
  if (n.op == OpKind::kEmbedding) return pl[size_t(n.inputs[0])].is_shard();
  if (n.op == OpKind::kEmbeddingBackward) return table_sharded && graph::AttrInt(n, "num_embeddings") == vocab;
  if (n.op != OpKind::kSoftmaxCrossEntropy && n.op != OpKind::kSoftmaxCrossEntropyBackward) return false;
  const int logits = n.inputs[n.op == OpKind::kSoftmaxCrossEntropy ? 0 : 1];
  const Placement p = pl[size_t(logits)];
  if (!p.is_shard()) return false;
  if (p.dim() != g.type(logits).rank() - 1) {
    return absl::UnimplementedError(absl::StrCat("tensor parallel: ", NodeName(n), " gets logits ", p.ToString(),
                                                 ", expected them split on the vocabulary (last) dim or whole"));
  }
  return true;
}

// Input index of a matmul's residual epilogue, or -1.
int ResidualInput(const Node& n) {
  if (n.op != OpKind::kMatmul) return -1;
  const std::string& epi = graph::AttrString(n, "epilogue");
  if (epi == "residual" || epi == "bias_residual") return int(n.inputs.size()) - 1;
  return -1;
}

// Lowers a data-parallel graph to tp rank `tp_rank` of T, node by node in graph order: each value's
// placement on the "tp" mesh and its value in the rank's graph, and the partial sums to all-reduce.
class TpLowering {
 public:
  // `start`: the rank's graph before any node (dp.graph's symbols). Keeps references to `dp` and
  // `options`: it lives inside BuildTensorParallelGraph.
  TpLowering(const DataParallelGraph& dp, int T, int tp_rank, const TensorParallelGraphOptions& options,
             sharding::DeviceMesh mesh, Graph start);

  // Node i in the rank's graph, after the all-reduces of the partial sums it needs summed.
  absl::Status LowerNode(int i);
  // Graph outputs: the loss replicated, each gradient in its parameter's placement.
  absl::Status LowerOutputs();
  // The rank's graph, its all-reduces in issue order and its parameters in dp.params' order. Once:
  // it moves the result out.
  absl::StatusOr<TensorParallelGraph> Finish();

 private:
  struct Pending {
    int value, issue_after, needed_by;
    std::string where;
  };

  // A partial sum is all-reduced in place before node `needed_by`, for every later reader too:
  // issued once its producer and every reader of it (or of an alias) as a partial sum are done.
  void Reduce(int v, int needed_by, std::string where);
  // Reduce(v) before node i, both named in the all-reduce's `where`.
  void ReduceBefore(int v, int i);
  // A parameter node: its tp placement and local shape; a "<p>@bwd" copy takes <p>'s.
  absl::Status LowerParameter(int i);
  // A vocabulary-parallel node: its sharded operand stays on the shard; every other operand
  // (ids, targets, the loss cotangent, the embedding's output gradient) must be whole.
  sharding::OpSharding PlaceOnVocabShard(int i);
  // Any other node: as the sharding rules place it, its partial operands all-reduced where it needs
  // them whole. *drop_residual: its residual epilogue is dropped on this rank.
  absl::StatusOr<sharding::OpSharding> PlaceByPropagation(int i, bool* drop_residual);
  // The sharding rule of node i over its operands' current placements.
  absl::StatusOr<sharding::OpSharding> Propagate(int i) const;
  // Emits node i placed as `s` (attributes in local shapes), checking its outputs' local shapes.
  absl::Status EmitNode(int i, const sharding::OpSharding& s, bool on_shard, bool drop_residual);
  void CollectAllReduces();
  absl::Status CollectParams();

  const DataParallelGraph& dp_;
  const Graph& g_;
  const std::vector<Node>& nodes_;
  const int T_, tp_rank_;
  const TensorParallelGraphOptions& options_;
  const bool vp_;
  const int64_t vocab_;
  bool table_sharded_ = false;  // an embedding ran on its vocabulary shard: its backward does too
  const sharding::DeviceMesh mesh_;
  sharding::PropagationOptions popt_;
  std::vector<Placement> pl_;
  std::vector<int> last_partial_reader_;
  std::vector<int> new_node_;  // old node index -> new
  std::vector<graph::Value> map_;
  std::vector<Pending> reduces_;  // old ids and node indices
  std::map<std::string, Placement> param_pl_;
  // Reshapes alias their input's buffer, so a partial sum and its reshapes are summed together.
  std::vector<int> alias_root_;
  std::map<int, std::vector<int>> aliases_;  // root -> every value sharing its buffer
  graph::Builder b_;
  TensorParallelGraph out_;
};

TpLowering::TpLowering(const DataParallelGraph& dp, int T, int tp_rank,
                       const TensorParallelGraphOptions& options, sharding::DeviceMesh mesh, Graph start)
    : dp_(dp),
      g_(dp.graph),
      nodes_(g_.nodes()),
      T_(T),
      tp_rank_(tp_rank),
      options_(options),
      vp_(options.vocab_parallel),
      vocab_(vp_ ? VocabOf(g_) : 0),
      mesh_(std::move(mesh)),
      pl_(size_t(g_.num_value_ids())),
      last_partial_reader_(size_t(g_.num_value_ids()), -1),
      new_node_(nodes_.size(), -1),
      map_(size_t(g_.num_value_ids())),
      alias_root_(size_t(g_.num_value_ids())),
      b_(std::move(start)) {
  popt_.policy = {sharding::ConflictPolicy::kMoveActivations};
  for (int v = 0; v < g_.num_value_ids(); ++v) alias_root_[size_t(v)] = v;
}

void TpLowering::Reduce(int v, int needed_by, std::string where) {
  const std::vector<int>& group = aliases_[alias_root_[size_t(v)]];
  int issue_after = g_.value(v).producer;
  for (int a : group) {
    issue_after = std::max({issue_after, g_.value(a).producer, last_partial_reader_[size_t(a)]});
  }
  reduces_.push_back({v, issue_after, needed_by, std::move(where)});
  for (int a : group) {
    if (pl_[size_t(a)].is_partial()) pl_[size_t(a)] = Placement::Replicate();
  }
  pl_[size_t(v)] = Placement::Replicate();
}

void TpLowering::ReduceBefore(int v, int i) {
  Reduce(v, i, absl::StrCat(NodeName(nodes_[size_t(g_.value(v).producer)]), " output (P(sum) -> R before ",
                            NodeName(nodes_[size_t(i)]), ")"));
}

absl::Status TpLowering::LowerNode(int i) {
  const Node& n = nodes_[size_t(i)];
  auto scope = b_.EnterScope(n.scope);
  b_.set_phase(n.phase);
  if (n.op == OpKind::kParameter) return LowerParameter(i);
  if (n.op == OpKind::kInput) {
    map_[size_t(n.outputs[0])] = b_.Input(graph::AttrString(n, "name"), graph::AttrDType(n, "dtype"),
                                          graph::AttrShape(n, "shape"));
    return absl::OkStatus();
  }
  // The norms' backward is linear in dy, so propagation would carry a partial dy through it and
  // sum dx and dw after; summing dy first is one all-reduce instead of two (Megatron's choice).
  if (n.op == OpKind::kRmsNormBackward || n.op == OpKind::kAddRmsNormBackward) {
    for (int v : n.inputs) {
      if (pl_[size_t(v)].is_partial()) ReduceBefore(v, i);
    }
  }
  sharding::OpSharding s;
  bool drop_residual = false;
  SG_ASSIGN_OR_RETURN(const bool on_shard, VocabNode(g_, n, pl_, vp_, vocab_, table_sharded_));
  if (on_shard) {
    s = PlaceOnVocabShard(i);
  } else {
    SG_ASSIGN_OR_RETURN(s, PlaceByPropagation(i, &drop_residual));
  }
  return EmitNode(i, s, on_shard, drop_residual);
}

absl::Status TpLowering::LowerParameter(int i) {
  const Node& n = nodes_[size_t(i)];
  const std::string& name = graph::AttrString(n, "name");
  if (absl::EndsWith(name, kBackwardSuffix)) {
    const int base = g_.FindSource(name.substr(0, name.size() - std::string(kBackwardSuffix).size()));
    if (base < 0 || !map_[size_t(base)].valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor parallel: '", name, "' has no parameter before it"));
    }
    pl_[size_t(n.outputs[0])] = pl_[size_t(base)];
    if (options_.keep_backward_copies) {
      map_[size_t(n.outputs[0])] = b_.Parameter(name, graph::AttrDType(n, "dtype"),
                                                b_.type(map_[size_t(base)]).shape, /*trainable=*/false);
    } else {
      map_[size_t(n.outputs[0])] = map_[size_t(base)];
    }
    return absl::OkStatus();
  }
  Placement p;
  if (graph::AttrBool(n, "trainable")) {
    SG_ASSIGN_OR_RETURN(p, ParamPlacement(g_, n, mesh_, vp_));
  }
  SG_ASSIGN_OR_RETURN(graph::SymShape local, LocalShape(graph::AttrShape(n, "shape"), p, T_, tp_rank_, vocab_,
                                                        absl::StrCat("parameter '", name, "'")));
  pl_[size_t(n.outputs[0])] = p;
  param_pl_[name] = p;
  map_[size_t(n.outputs[0])] =
      b_.Parameter(name, graph::AttrDType(n, "dtype"), local, graph::AttrBool(n, "trainable"));
  return absl::OkStatus();
}

sharding::OpSharding TpLowering::PlaceOnVocabShard(int i) {
  const Node& n = nodes_[size_t(i)];
  sharding::OpSharding s;
  s.inputs.assign(n.inputs.size(), {Placement::Replicate()});
  for (int k = 0; k < int(n.inputs.size()); ++k) {
    const int v = n.inputs[k];
    if (pl_[size_t(v)].is_shard()) {
      s.inputs[size_t(k)] = {pl_[size_t(v)]};
    } else if (pl_[size_t(v)].is_partial()) {
      ReduceBefore(v, i);
    }
  }
  Placement out_pl = Placement::Replicate();  // the loss
  if (n.op == OpKind::kEmbedding) out_pl = Placement::Partial();  // zeros outside the shard
  if (n.op == OpKind::kEmbeddingBackward) out_pl = Placement::Shard(0);
  if (n.op == OpKind::kSoftmaxCrossEntropyBackward) {
    out_pl = Placement::Shard(g_.type(n.inputs[1]).rank() - 1);
  }
  s.outputs = {{out_pl}};
  table_sharded_ = table_sharded_ || n.op == OpKind::kEmbedding;
  return s;
}

absl::StatusOr<sharding::OpSharding> TpLowering::PlaceByPropagation(int i, bool* drop_residual) {
  const Node& n = nodes_[size_t(i)];
  SG_ASSIGN_OR_RETURN(sharding::OpSharding s, Propagate(i));
  // Mixing a partial sum with a replicated operand (e.g. the residual gradient): sum the partial
  // operand rather than zero a copy of the replicated one off rank 0.
  bool to_partial = false, has_partial = false;
  for (int k = 0; k < int(n.inputs.size()); ++k) {
    const Placement have = pl_[size_t(n.inputs[k])];
    has_partial = has_partial || have.is_partial();
    to_partial = to_partial ||
                 (have.is_replicate() && s.inputs[size_t(k)][0].is_partial() && k != ResidualInput(n));
  }
  if (to_partial && has_partial) {
    for (int v : n.inputs) {
      if (pl_[size_t(v)].is_partial()) ReduceBefore(v, i);
    }
    SG_ASSIGN_OR_RETURN(s, Propagate(i));
  }
  if (!s.internal.empty()) {
    return absl::UnimplementedError(absl::StrCat("tensor parallel: node ", i, " (", NodeName(n),
                                                 ") needs a sharded kernel with an internal collective (",
                                                 s.internal[0].what, "), which is not lowered"));
  }
  for (int k = 0; k < int(n.inputs.size()); ++k) {
    const int v = n.inputs[k];
    const Placement have = pl_[size_t(v)], want = s.inputs[size_t(k)][0];
    if (have == want) {
      if (have.is_partial()) last_partial_reader_[size_t(v)] = i;
      continue;
    }
    if (have.is_partial() && want.is_replicate()) {
      ReduceBefore(v, i);
      continue;
    }
    if (have.is_replicate() && want.is_partial() && k == ResidualInput(n)) {
      *drop_residual = tp_rank_ != 0;  // R -> P(sum): rank 0 keeps the residual, the others add zero
      continue;
    }
    return absl::UnimplementedError(absl::StrCat(
        "tensor parallel: node ", i, " (", NodeName(n), ") needs input ", k, " as ", want.ToString(),
        ", it is ", have.ToString(), "; the tensor-parallel runtime only all-reduces partial sums"));
  }
  return s;
}

absl::StatusOr<sharding::OpSharding> TpLowering::Propagate(int i) const {
  const Node& n = nodes_[size_t(i)];
  std::vector<graph::Type> types;
  for (int v : n.inputs) types.push_back(g_.type(v));
  std::vector<sharding::Placements> in;
  for (int v : n.inputs) in.push_back({pl_[size_t(v)]});
  absl::StatusOr<sharding::OpSharding> r = sharding::Propagate(n, types, in, mesh_, popt_);
  if (!r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: node ", i, " (", NodeName(n), "): ",
                                                   r.status().message()));
  }
  return r;
}

absl::Status TpLowering::EmitNode(int i, const sharding::OpSharding& s, bool on_shard, bool drop_residual) {
  const Node& n = nodes_[size_t(i)];
  std::vector<graph::Value> ins;
  for (int v : n.inputs) ins.push_back(map_[size_t(v)]);
  graph::Attrs attrs = n.attrs;
  if (drop_residual) {
    ins.pop_back();
    attrs["epilogue"] = std::string(graph::AttrString(n, "epilogue") == "bias_residual" ? "bias" : "none");
    ++out_.dropped_residuals;
  }
  if (n.outputs.size() == 1 && attrs.count("shape") && n.op != OpKind::kParameter) {
    SG_ASSIGN_OR_RETURN(attrs["shape"],
                        LocalShape(graph::AttrShape(n, "shape"), s.outputs[0][0], T_, tp_rank_, vocab_,
                                   absl::StrCat("the shape of node ", i, " (", NodeName(n), ")")));
  }
  if (on_shard) {
    const sharding::ChunkRange c = sharding::Chunk(vocab_, T_, tp_rank_);
    if (n.op == OpKind::kEmbeddingBackward) attrs["num_embeddings"] = c.length;
    out_.vocab_ops.push_back({int(b_.graph().nodes().size()), n.op, c.offset, c.length, vocab_});
  }
  new_node_[size_t(i)] = int(b_.graph().nodes().size());
  std::vector<graph::Value> outs = b_.Emit(n.op, ins, attrs);
  SG_RETURN_IF_ERROR(b_.status());
  if (n.op == OpKind::kReshape) alias_root_[size_t(n.outputs[0])] = alias_root_[size_t(n.inputs[0])];
  for (size_t j = 0; j < outs.size(); ++j) {
    const int v = n.outputs[j];
    aliases_[alias_root_[size_t(v)]].push_back(v);
    pl_[size_t(v)] = s.outputs[j][0];
    map_[size_t(v)] = outs[j];
    SG_ASSIGN_OR_RETURN(graph::SymShape want,
                        LocalShape(g_.type(v).shape, pl_[size_t(v)], T_, tp_rank_, vocab_,
                                   absl::StrCat("output ", j, " of node ", i, " (", NodeName(n), ")")));
    if (b_.type(outs[j]).shape != want) {
      return absl::InternalError(absl::StrCat(
          "tensor parallel: node ", i, " (", NodeName(n), ") has local shape ",
          graph::SymShapeToString(b_.type(outs[j]).shape), ", its placement ", pl_[size_t(v)].ToString(),
          " expects ", graph::SymShapeToString(want)));
    }
  }
  return absl::OkStatus();
}

absl::Status TpLowering::LowerOutputs() {
  for (const graph::GraphOutput& o : g_.outputs()) {
    Placement want = Placement::Replicate();
    if (absl::StartsWith(o.name, "grad:")) want = param_pl_[o.name.substr(5)];
    const Placement have = pl_[size_t(o.value)];
    if (have.is_partial() && want.is_replicate()) {
      Reduce(o.value, INT_MAX, absl::StrCat("output ", o.name, " (P(sum) -> R)"));
    } else if (have != want) {
      return absl::UnimplementedError(absl::StrCat("tensor parallel: output '", o.name, "' comes out ",
                                                   have.ToString(), ", expected ", want.ToString()));
    }
    b_.Output(o.name, map_[size_t(o.value)]);
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorParallelGraph> TpLowering::Finish() {
  SG_ASSIGN_OR_RETURN(out_.graph, b_.Finish());
  CollectAllReduces();
  SG_RETURN_IF_ERROR(CollectParams());
  return std::move(out_);
}

void TpLowering::CollectAllReduces() {
  for (const Pending& r : reduces_) {
    out_.all_reduces.push_back({map_[size_t(r.value)].id, new_node_[size_t(r.issue_after)],
                                r.needed_by == INT_MAX ? INT_MAX : new_node_[size_t(r.needed_by)], r.where});
  }
  std::stable_sort(out_.all_reduces.begin(), out_.all_reduces.end(),
                   [](const TpAllReduce& a, const TpAllReduce& c) { return a.issue_after < c.issue_after; });
}

absl::Status TpLowering::CollectParams() {
  for (const DataParallelParam& p : dp_.params) {
    TpParam t;
    t.name = p.name;
    t.weight_decay = p.weight_decay;
    const Placement pp = param_pl_[p.name];
    t.dim = pp.is_shard() ? pp.dim() : -1;
    const int v = g_.FindSource(p.name);
    for (const graph::Dim& d : g_.type(v).shape) t.global.push_back(d.value());
    t.local = t.global;
    if (t.dim >= 0) {
      SG_ASSIGN_OR_RETURN(sharding::ChunkRange c,
                          SplitRange(g_.type(v).shape[size_t(t.dim)], T_, tp_rank_, vocab_, p.name, t.dim));
      t.local[size_t(t.dim)] = c.length;
    }
    out_.params.push_back(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace

std::string TensorParallelGraph::Summary() const {
  int column = 0, row = 0, fwd = 0;
  for (const TpParam& p : params) {
    if (p.dim == 0) ++column;
    if (p.dim == 1) ++row;
  }
  for (const TpAllReduce& a : all_reduces) {
    if (graph.nodes()[graph.value(a.value).producer].phase == graph::Phase::kForward) ++fwd;
  }
  std::string vocab;
  if (!vocab_ops.empty()) {
    const TpVocabOp& v = vocab_ops.front();
    vocab = absl::StrCat("; vocabulary parallel: this rank's embedding/LM-head rows and logits [", v.start, ", ",
                         v.start + v.length, ") of ", v.vocab);
  }
  return absl::StrCat(column + row, " of ", params.size(), " parameters split (", column, " on dim 0, ", row,
                      " on dim 1), ", all_reduces.size(), " all-reduces per step (", fwd, " forward, ",
                      int(all_reduces.size()) - fwd, " backward)", vocab);
}

absl::StatusOr<TensorParallelGraph> BuildTensorParallelGraph(const DataParallelGraph& dp, int T, int tp_rank,
                                                             const TensorParallelGraphOptions& options) {
  const Graph& g = dp.graph;
  SG_CHECK_ARG(T >= 1 && tp_rank >= 0 && tp_rank < T, "tensor parallel: rank ", tp_rank, " of ", T);
  SG_RETURN_IF_ERROR(CheckHeads(g, T));
  SG_ASSIGN_OR_RETURN(sharding::DeviceMesh mesh, sharding::DeviceMesh::Create({"tp"}, {T}));
  Graph start;
  for (const graph::SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(start.AddSymbol(s));
  TpLowering tp(dp, T, tp_rank, options, std::move(mesh), std::move(start));
  for (int i = 0; i < int(g.nodes().size()); ++i) SG_RETURN_IF_ERROR(tp.LowerNode(i));
  SG_RETURN_IF_ERROR(tp.LowerOutputs());
  return tp.Finish();
}

}  // namespace sg::compiler
