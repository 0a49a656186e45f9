// Pattern fusion onto the fused kernels. Each pattern is found on the current graph, then the
// graph is rebuilt: the consumer's position gets the fused node (reusing the old value ids, so no
// use needs rewriting) and the folded producer is dropped.
#include <map>

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "graph/passes/passes.h"
#include "kernels/core/status.h"

namespace sg::graph {
namespace {

struct Rewrite {
  std::vector<bool> remove;
  std::map<int, Node> replace;  // node index -> node emitted there instead
  std::vector<bool> claimed;    // nodes already part of a fusion in this round
};

absl::StatusOr<Graph> Apply(const Graph& g, const Rewrite& rw) {
  Graph out;
  for (const SymbolInfo& s : g.symbols()) SG_RETURN_IF_ERROR(out.AddSymbol(s));
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (rw.remove[i]) continue;
    auto it = rw.replace.find(int(i));
    const Node& n = it != rw.replace.end() ? it->second : g.nodes()[i];
    std::vector<Type> types;
    for (int o : n.outputs) types.push_back(g.type(o));
    SG_RETURN_IF_ERROR(out.AddNodeWithIds(n, types));
  }
  out.mutable_outputs() = g.outputs();
  auto st = Verify(out);
  if (!st.ok()) return absl::InternalError(absl::StrCat("fusion produced an invalid graph: ", st.message()));
  return out;
}

class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g), users_(g.Users()), is_output_(g.num_value_ids(), false) {
    for (const GraphOutput& o : g.outputs()) is_output_[o.value] = true;
    rw_.remove.assign(g.nodes().size(), false);
    rw_.claimed.assign(g.nodes().size(), false);
  }

  // The node producing `v` if it has kind `op`, is unclaimed, and (when single_use) has no
  // other consumer than `user`; else -1.
  int Producer(int v, OpKind op, int user, bool single_use) const {
    const int p = g_.value(v).producer;
    if (g_.nodes()[p].op != op || rw_.claimed[p]) return -1;
    if (single_use && (is_output_[v] || users_[v].size() != 1 || users_[v][0] != user)) return -1;
    return p;
  }

  void Fuse(int at, int folded, Node fused) {
    rw_.claimed[at] = rw_.claimed[folded] = true;
    rw_.remove[folded] = true;
    rw_.replace[at] = std::move(fused);
  }

  const Graph& g_;
  std::vector<std::vector<int>> users_;
  std::vector<bool> is_output_;
  Rewrite rw_;
};

Node Make(const Node& at, OpKind op, std::vector<int> inputs, Attrs attrs, std::vector<int> outputs) {
  return Node{op, std::move(inputs), std::move(outputs), std::move(attrs), at.scope, at.phase};
}

int FuseAddRmsNorm(Matcher& m) {
  int count = 0;
  for (size_t i = 0; i < m.g_.nodes().size(); ++i) {
    const Node& r = m.g_.nodes()[i];
    if (r.op != OpKind::kRmsNorm || m.rw_.claimed[i]) continue;
    const int h = r.inputs[0];
    const int a = m.Producer(h, OpKind::kAdd, int(i), false);
    if (a < 0) continue;
    const Node& add = m.g_.nodes()[a];
    if (m.g_.type(add.inputs[0]) != m.g_.type(add.inputs[1])) continue;  // broadcasting add
    bool later = true;  // the sum is now defined at the norm: every other use must come after
    for (int u : m.users_[h]) later &= u >= int(i);
    if (!later) continue;
    m.Fuse(int(i), a, Make(r, OpKind::kAddRmsNorm, {add.inputs[0], add.inputs[1], r.inputs[1]},
                           r.attrs, {r.outputs[0], h}));
    ++count;
  }
  return count;
}

int FuseSwiGLU(Matcher& m) {
  int count = 0;
  for (size_t i = 0; i < m.g_.nodes().size(); ++i) {
    const Node& mul = m.g_.nodes()[i];
    if (mul.op != OpKind::kMul || m.rw_.claimed[i]) continue;
    for (int k = 0; k < 2; ++k) {
      const int s = m.Producer(mul.inputs[k], OpKind::kSilu, int(i), true);
      const int up = mul.inputs[1 - k];
      if (s < 0 || m.g_.type(up) != m.g_.type(mul.inputs[k])) continue;
      m.Fuse(int(i), s, Make(mul, OpKind::kSwiGLU, {m.g_.nodes()[s].inputs[0], up}, {}, mul.outputs));
      ++count;
      break;
    }
  }
  return count;
}

int FuseEpilogue(Matcher& m) {
  int count = 0;
  for (size_t i = 0; i < m.g_.nodes().size(); ++i) {
    const Node& add = m.g_.nodes()[i];
    if (add.op != OpKind::kAdd || m.rw_.claimed[i]) continue;
    for (int k = 0; k < 2; ++k) {
      const int p = m.Producer(add.inputs[k], OpKind::kMatmul, int(i), true);
      if (p < 0) continue;
      const Node& mm = m.g_.nodes()[p];
      const int other = add.inputs[1 - k];
      const Type& out = m.g_.type(mm.outputs[0]);
      const std::string& epi = AttrString(mm, "epilogue");
      std::string fused;
      if (m.g_.type(other) == out && (epi == "none" || epi == "bias")) {
        fused = epi == "none" ? "residual" : "bias_residual";
      } else if (m.g_.type(other).rank() == 1 && out.rank() >= 1 &&
                 m.g_.type(other).shape[0] == out.shape.back() && epi == "none") {
        fused = "bias";
      } else {
        continue;
      }
      if (m.g_.type(add.outputs[0]) != out) continue;
      Attrs attrs = mm.attrs;
      attrs["epilogue"] = fused;
      std::vector<int> inputs = mm.inputs;
      inputs.push_back(other);
      m.Fuse(int(i), p, Make(add, OpKind::kMatmul, inputs, attrs, add.outputs));
      ++count;
      break;
    }
  }
  return count;
}

int FuseCrossEntropy(Matcher& m) {
  int count = 0;
  for (size_t i = 0; i < m.g_.nodes().size(); ++i) {
    const Node& nll = m.g_.nodes()[i];
    if (nll.op != OpKind::kNllLoss || m.rw_.claimed[i]) continue;
    const int ls = m.Producer(nll.inputs[0], OpKind::kLogSoftmax, int(i), true);
    if (ls < 0) continue;
    m.Fuse(int(i), ls, Make(nll, OpKind::kSoftmaxCrossEntropy,
                            {m.g_.nodes()[ls].inputs[0], nll.inputs[1]}, nll.attrs, nll.outputs));
    ++count;
  }
  return count;
}

int MarkRmsNormPrologue(Matcher& m) {
  int count = 0;
  for (size_t i = 0; i < m.g_.nodes().size(); ++i) {
    const Node& mm = m.g_.nodes()[i];
    if (mm.op != OpKind::kMatmul || AttrBool(mm, "trans_a") || AttrString(mm, "prologue") != "") {
      continue;
    }
    const ValueInfo& a = m.g_.value(mm.inputs[0]);
    const OpKind pop = m.g_.nodes()[a.producer].op;
    if (a.output_index != 0 || (pop != OpKind::kRmsNorm && pop != OpKind::kAddRmsNorm)) continue;
    Node marked = mm;
    marked.attrs["prologue"] = std::string("rmsnorm");
    m.rw_.replace[int(i)] = marked;
    ++count;
  }
  return count;
}

}  // namespace

std::string FusionStats::ToString() const {
  return absl::StrCat("add_rmsnorm=", add_rmsnorm, " rmsnorm_prologue=", rmsnorm_prologue,
                      " swiglu=", swiglu, " matmul_epilogue=", matmul_epilogue,
                      " cross_entropy=", cross_entropy);
}

absl::StatusOr<Graph> FuseForKernels(const Graph& g, FusionStats* stats) {
  SG_RETURN_IF_ERROR(Verify(g));
  FusionStats local;
  FusionStats& s = stats ? *stats : local;
  // Order matters: a residual add feeding a norm is worth more as add_rmsnorm than as a GEMM
  // epilogue, and the prologue marker must see the final norms.
  using Pattern = int (*)(Matcher&);
  const std::pair<Pattern, int*> patterns[] = {
      {FuseAddRmsNorm, &s.add_rmsnorm},   {FuseSwiGLU, &s.swiglu},
      {FuseEpilogue, &s.matmul_epilogue}, {FuseCrossEntropy, &s.cross_entropy},
      {MarkRmsNormPrologue, &s.rmsnorm_prologue},
  };
  Graph cur = g;
  for (const auto& [pattern, counter] : patterns) {
    Matcher m(cur);
    const int n = pattern(m);
    *counter += n;
    if (n > 0) {
      SG_ASSIGN_OR_RETURN(cur, Apply(cur, m.rw_));
    }
  }
  return cur;
}

}  // namespace sg::graph
