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
  const bool vp = options.vocab_parallel;
  const int64_t vocab = vp ? VocabOf(g) : 0;
  bool table_sharded = false;  // an embedding ran on its vocabulary shard: its backward does too
  SG_CHECK_ARG(T >= 1 && tp_rank >= 0 && tp_rank < T, "tensor parallel: rank ", tp_rank, " of ", T);
  SG_RETURN_IF_ERROR(CheckHeads(g, T));
  SG_ASSIGN_OR_RETURN(sharding::DeviceMesh mesh, sharding::DeviceMesh::Create({"tp"}, {T}));
  sharding::PropagationOptions popt;
  popt.policy = {sharding::ConflictPolicy::kMoveActivations};

  const std::vector<Node>& nodes = g.nodes();
  std::vector<Placement> pl(size_t(g.num_value_ids()));
  std::vector<int> last_partial_reader(size_t(g.num_value_ids()), -1);
  std::vector<int> new_node(nodes.size(), -1);  // old node index -> new
  std::vector<graph::Value> map(size_t(g.num_value_ids()));
  struct Pending {
    int value, issue_after, needed_by;
    std::string where;
  };
  std::vector<Pending> reduces;  // old ids and node indices
  std::map<std::string, Placement> param_pl;

  // Reshapes alias their input's buffer, so a partial sum and its reshapes are summed together.
  std::vector<int> alias_root(size_t(g.num_value_ids()));
  for (int v = 0; v < g.num_value_ids(); ++v) alias_root[size_t(v)] = v;
  std::map<int, std::vector<int>> aliases;  // root -> every value sharing its buffer
  // A partial sum is all-reduced in place before node `needed_by`, for every later reader too:
  // issued once its producer and every reader of it (or of an alias) as a partial sum are done.
  auto reduce = [&](int v, int needed_by, std::string where) {
    const std::vector<int>& group = aliases[alias_root[size_t(v)]];
    int issue_after = g.value(v).producer;
    for (int a : group) issue_after = std::max({issue_after, g.value(a).producer, last_partial_reader[size_t(a)]});
    reduces.push_back({v, issue_after, needed_by, std::move(where)});
    for (int a : group) {
      if (pl[size_t(a)].is_partial()) pl[size_t(a)] = Placement::Replicate();
    }
    pl[size_t(v)] = Placement::Replicate();
  };

  Graph start;
  for (const graph::SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(start.AddSymbol(s));
  graph::Builder b(std::move(start));
  TensorParallelGraph out;
  for (int i = 0; i < int(nodes.size()); ++i) {
    const Node& n = nodes[i];
    auto scope = b.EnterScope(n.scope);
    b.set_phase(n.phase);
    if (n.op == OpKind::kParameter) {
      const std::string& name = graph::AttrString(n, "name");
      if (absl::EndsWith(name, kBackwardSuffix)) {
        const int base = g.FindSource(name.substr(0, name.size() - std::string(kBackwardSuffix).size()));
        if (base < 0 || !map[size_t(base)].valid()) {
          return absl::InvalidArgumentError(absl::StrCat("tensor parallel: '", name, "' has no parameter before it"));
        }
        pl[size_t(n.outputs[0])] = pl[size_t(base)];
        if (options.keep_backward_copies) {
          map[size_t(n.outputs[0])] = b.Parameter(name, graph::AttrDType(n, "dtype"), b.type(map[size_t(base)]).shape,
                                                  /*trainable=*/false);
        } else {
          map[size_t(n.outputs[0])] = map[size_t(base)];
        }
        continue;
      }
      Placement p;
      if (graph::AttrBool(n, "trainable")) {
        SG_ASSIGN_OR_RETURN(p, ParamPlacement(g, n, mesh, vp));
      }
      SG_ASSIGN_OR_RETURN(graph::SymShape local, LocalShape(graph::AttrShape(n, "shape"), p, T, tp_rank, vocab,
                                                            absl::StrCat("parameter '", name, "'")));
      pl[size_t(n.outputs[0])] = p;
      param_pl[name] = p;
      map[size_t(n.outputs[0])] = b.Parameter(name, graph::AttrDType(n, "dtype"), local, graph::AttrBool(n, "trainable"));
      continue;
    }
    if (n.op == OpKind::kInput) {
      map[size_t(n.outputs[0])] = b.Input(graph::AttrString(n, "name"), graph::AttrDType(n, "dtype"),
                                          graph::AttrShape(n, "shape"));
      continue;
    }
    auto reduce_before = [&](int v) {
      reduce(v, i, absl::StrCat(NodeName(nodes[size_t(g.value(v).producer)]), " output (P(sum) -> R before ",
                                NodeName(n), ")"));
    };
    // The norms' backward is linear in dy, so propagation would carry a partial dy through it and
    // sum dx and dw after; summing dy first is one all-reduce instead of two (Megatron's choice).
    if (n.op == OpKind::kRmsNormBackward || n.op == OpKind::kAddRmsNormBackward) {
      for (int v : n.inputs) {
        if (pl[size_t(v)].is_partial()) reduce_before(v);
      }
    }
    std::vector<graph::Type> types;
    for (int v : n.inputs) types.push_back(g.type(v));
    auto propagate = [&]() -> absl::StatusOr<sharding::OpSharding> {
      std::vector<sharding::Placements> in;
      for (int v : n.inputs) in.push_back({pl[size_t(v)]});
      absl::StatusOr<sharding::OpSharding> r = sharding::Propagate(n, types, in, mesh, popt);
      if (!r.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor parallel: node ", i, " (", NodeName(n), "): ",
                                                       r.status().message()));
      }
      return r;
    };
    sharding::OpSharding s;
    bool drop_residual = false;
    SG_ASSIGN_OR_RETURN(const bool on_shard, VocabNode(g, n, pl, vp, vocab, table_sharded));
    if (on_shard) {
      // A vocabulary-parallel node: its sharded operand stays on the shard; every other operand
      // (ids, targets, the loss cotangent, the embedding's output gradient) must be whole.
      s.inputs.assign(n.inputs.size(), {Placement::Replicate()});
      for (int k = 0; k < int(n.inputs.size()); ++k) {
        const int v = n.inputs[k];
        if (pl[size_t(v)].is_shard()) {
          s.inputs[size_t(k)] = {pl[size_t(v)]};
        } else if (pl[size_t(v)].is_partial()) {
          reduce_before(v);
        }
      }
      Placement out_pl = Placement::Replicate();  // the loss
      if (n.op == OpKind::kEmbedding) out_pl = Placement::Partial();  // zeros outside the shard
      if (n.op == OpKind::kEmbeddingBackward) out_pl = Placement::Shard(0);
      if (n.op == OpKind::kSoftmaxCrossEntropyBackward) out_pl = Placement::Shard(g.type(n.inputs[1]).rank() - 1);
      s.outputs = {{out_pl}};
      table_sharded = table_sharded || n.op == OpKind::kEmbedding;
    } else {
      SG_ASSIGN_OR_RETURN(s, propagate());
      // Mixing a partial sum with a replicated operand (e.g. the residual gradient): sum the partial
      // operand rather than zero a copy of the replicated one off rank 0.
      bool to_partial = false, has_partial = false;
      for (int k = 0; k < int(n.inputs.size()); ++k) {
        const Placement have = pl[size_t(n.inputs[k])];
        has_partial = has_partial || have.is_partial();
        to_partial = to_partial || (have.is_replicate() && s.inputs[size_t(k)][0].is_partial() && k != ResidualInput(n));
      }
      if (to_partial && has_partial) {
        for (int v : n.inputs) {
          if (pl[size_t(v)].is_partial()) reduce_before(v);
        }
        SG_ASSIGN_OR_RETURN(s, propagate());
      }
      if (!s.internal.empty()) {
        return absl::UnimplementedError(absl::StrCat("tensor parallel: node ", i, " (", NodeName(n),
                                                     ") needs a sharded kernel with an internal collective (",
                                                     s.internal[0].what, "), which is not lowered"));
      }
      for (int k = 0; k < int(n.inputs.size()); ++k) {
        const int v = n.inputs[k];
        const Placement have = pl[size_t(v)], want = s.inputs[size_t(k)][0];
        if (have == want) {
          if (have.is_partial()) last_partial_reader[size_t(v)] = i;
          continue;
        }
        if (have.is_partial() && want.is_replicate()) {
          reduce_before(v);
          continue;
        }
        if (have.is_replicate() && want.is_partial() && k == ResidualInput(n)) {
          drop_residual = tp_rank != 0;  // R -> P(sum): rank 0 keeps the residual, the others add zero
          continue;
        }
        return absl::UnimplementedError(absl::StrCat(
            "tensor parallel: node ", i, " (", NodeName(n), ") needs input ", k, " as ", want.ToString(),
            ", it is ", have.ToString(), "; the tensor-parallel runtime only all-reduces partial sums"));
      }
    }
    std::vector<graph::Value> ins;
    for (int v : n.inputs) ins.push_back(map[size_t(v)]);
    graph::Attrs attrs = n.attrs;
    if (drop_residual) {
      ins.pop_back();
      attrs["epilogue"] = std::string(graph::AttrString(n, "epilogue") == "bias_residual" ? "bias" : "none");
      ++out.dropped_residuals;
    }
    if (n.outputs.size() == 1 && attrs.count("shape") && n.op != OpKind::kParameter) {
      SG_ASSIGN_OR_RETURN(attrs["shape"], LocalShape(graph::AttrShape(n, "shape"), s.outputs[0][0], T, tp_rank, vocab,
                                                     absl::StrCat("the shape of node ", i, " (", NodeName(n), ")")));
    }
    if (on_shard) {
      const sharding::ChunkRange c = sharding::Chunk(vocab, T, tp_rank);
      if (n.op == OpKind::kEmbeddingBackward) attrs["num_embeddings"] = c.length;
      out.vocab_ops.push_back({int(b.graph().nodes().size()), n.op, c.offset, c.length, vocab});
    }
    new_node[size_t(i)] = int(b.graph().nodes().size());
    std::vector<graph::Value> outs = b.Emit(n.op, ins, attrs);
    SG_RETURN_IF_ERROR(b.status());
    if (n.op == OpKind::kReshape) alias_root[size_t(n.outputs[0])] = alias_root[size_t(n.inputs[0])];
    for (size_t j = 0; j < outs.size(); ++j) {
      const int v = n.outputs[j];
      aliases[alias_root[size_t(v)]].push_back(v);
      pl[size_t(v)] = s.outputs[j][0];
      map[size_t(v)] = outs[j];
      SG_ASSIGN_OR_RETURN(graph::SymShape want, LocalShape(g.type(v).shape, pl[size_t(v)], T, tp_rank, vocab,
                                                           absl::StrCat("output ", j, " of node ", i, " (", NodeName(n), ")")));
      if (b.type(outs[j]).shape != want) {
        return absl::InternalError(absl::StrCat("tensor parallel: node ", i, " (", NodeName(n), ") has local shape ",
                                                graph::SymShapeToString(b.type(outs[j]).shape), ", its placement ",
                                                pl[size_t(v)].ToString(), " expects ", graph::SymShapeToString(want)));
      }
    }
  }
  // Graph outputs: the loss replicated, each gradient in its parameter's placement.
  for (const graph::GraphOutput& o : g.outputs()) {
    Placement want = Placement::Replicate();
    if (absl::StartsWith(o.name, "grad:")) want = param_pl[o.name.substr(5)];
    const Placement have = pl[size_t(o.value)];
    if (have.is_partial() && want.is_replicate()) {
      reduce(o.value, INT_MAX, absl::StrCat("output ", o.name, " (P(sum) -> R)"));
    } else if (have != want) {
      return absl::UnimplementedError(absl::StrCat("tensor parallel: output '", o.name, "' comes out ", have.ToString(),
                                                   ", expected ", want.ToString()));
    }
    b.Output(o.name, map[size_t(o.value)]);
  }
  SG_ASSIGN_OR_RETURN(out.graph, b.Finish());
  for (const Pending& r : reduces) {
    out.all_reduces.push_back({map[size_t(r.value)].id, new_node[size_t(r.issue_after)],
                               r.needed_by == INT_MAX ? INT_MAX : new_node[size_t(r.needed_by)], r.where});
  }
  std::stable_sort(out.all_reduces.begin(), out.all_reduces.end(),
                   [](const TpAllReduce& a, const TpAllReduce& c) { return a.issue_after < c.issue_after; });
  for (const DataParallelParam& p : dp.params) {
    TpParam t;
    t.name = p.name;
    t.weight_decay = p.weight_decay;
    const Placement pp = param_pl[p.name];
    t.dim = pp.is_shard() ? pp.dim() : -1;
    const int v = g.FindSource(p.name);
    for (const graph::Dim& d : g.type(v).shape) t.global.push_back(d.value());
    t.local = t.global;
    if (t.dim >= 0) {
      SG_ASSIGN_OR_RETURN(sharding::ChunkRange c, SplitRange(g.type(v).shape[size_t(t.dim)], T, tp_rank, vocab,
                                                             p.name, t.dim));
      t.local[size_t(t.dim)] = c.length;
    }
    out.params.push_back(std::move(t));
  }
  return out;
}

}  // namespace sg::compiler
