#include "graph/ir.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::graph {

Dim Dim::Sym(std::string name, int64_t coeff) {
  Dim d(coeff);
  d.symbols_.push_back(std::move(name));
  return d;
}

Dim operator*(const Dim& a, const Dim& b) {
  Dim r(a.coeff_ * b.coeff_);
  r.symbols_ = a.symbols_;
  r.symbols_.insert(r.symbols_.end(), b.symbols_.begin(), b.symbols_.end());
  std::sort(r.symbols_.begin(), r.symbols_.end());
  return r;
}

std::string Dim::ToString() const {
  if (symbols_.empty()) return absl::StrCat(coeff_);
  std::string s = coeff_ == 1 ? "" : absl::StrCat(coeff_, "*");
  return s + absl::StrJoin(symbols_, "*");
}

std::string SymShapeToString(const SymShape& s) {
  return absl::StrCat("[", absl::StrJoin(s, ",", [](std::string* out, const Dim& d) {
                        out->append(d.ToString());
                      }), "]");
}

Dim NumElements(const SymShape& s) {
  Dim n(1);
  for (const Dim& d : s) n = n * d;
  return n;
}

SymShape ToSymShape(const Shape& s) { return SymShape(s.begin(), s.end()); }

std::string SymbolInfo::ToString() const {
  std::string s = absl::StrCat("sym ", name, " min=", min);
  if (max != std::numeric_limits<int64_t>::max()) absl::StrAppend(&s, " max=", max);
  if (multiple_of != 1) absl::StrAppend(&s, " multiple_of=", multiple_of);
  return s;
}

absl::Status SymbolInfo::Check(int64_t value) const {
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("symbol '", name, "' = ", value, " violates min=", min));
  }
  if (value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("symbol '", name, "' = ", value, " violates max=", max));
  }
  if (value % multiple_of != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("symbol '", name, "' = ", value, " violates multiple_of=", multiple_of));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Evaluate(const Dim& d, const Binding& b) {
  int64_t v = d.coeff();
  for (const std::string& s : d.symbols()) {
    auto it = b.find(s);
    if (it == b.end()) {
      return absl::InvalidArgumentError(absl::StrCat("symbol '", s, "' is not bound"));
    }
    v *= it->second;
  }
  return v;
}

absl::StatusOr<Shape> Evaluate(const SymShape& s, const Binding& b) {
  Shape out;
  for (const Dim& d : s) {
    SG_ASSIGN_OR_RETURN(int64_t v, Evaluate(d, b));
    out.push_back(v);
  }
  return out;
}

std::string Type::ToString() const {
  return absl::StrCat(DTypeName(dtype), SymShapeToString(shape));
}

namespace {

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest text that round-trips
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string AttrToString(const AttrValue& v) {
  switch (v.index()) {
    case 0: return std::get<bool>(v) ? "true" : "false";
    case 1: return absl::StrCat(std::get<int64_t>(v));
    case 2: return FormatDouble(std::get<double>(v));
    case 3: return Quote(std::get<std::string>(v));
    case 4: return absl::StrCat("[", absl::StrJoin(std::get<IntList>(v), ","), "]");
    case 5: return "shape" + SymShapeToString(std::get<SymShape>(v));
    case 6: return std::string(DTypeName(std::get<DType>(v)));
  }
  return "?";
}

absl::string_view PhaseName(Phase p) {
  switch (p) {
    case Phase::kForward: return "fwd";
    case Phase::kBackward: return "bwd";
    case Phase::kOptimizer: return "opt";
  }
  return "?";
}

// ---- Graph ----------------------------------------------------------------------------------------

absl::Status Graph::AddSymbol(SymbolInfo s) {
  if (s.name.empty()) return absl::InvalidArgumentError("symbol with an empty name");
  if (s.min < 1 || s.max < s.min || s.multiple_of < 1) {
    return absl::InvalidArgumentError(absl::StrCat("symbol '", s.name, "': inconsistent constraints (",
                                                   s.ToString(), ")"));
  }
  if (const SymbolInfo* old = FindSymbol(s.name)) {
    if (*old == s) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("symbol redeclared with other constraints: '",
                                                   old->ToString(), "' vs '", s.ToString(), "'"));
  }
  symbols_.push_back(std::move(s));
  return absl::OkStatus();
}

const SymbolInfo* Graph::FindSymbol(absl::string_view name) const {
  for (const SymbolInfo& s : symbols_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<int> Graph::AddNode(OpKind op, std::vector<int> inputs, Attrs attrs,
                                const std::vector<Type>& output_types, std::string scope,
                                Phase phase) {
  Node n{op, std::move(inputs), {}, std::move(attrs), std::move(scope), phase};
  const int index = int(nodes_.size());
  for (size_t i = 0; i < output_types.size(); ++i) {
    n.outputs.push_back(int(values_.size()));
    values_.push_back({output_types[i], index, int(i)});
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

absl::Status Graph::AddNodeWithIds(Node node, const std::vector<Type>& output_types) {
  if (node.outputs.size() != output_types.size()) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(node.op), ": ", node.outputs.size(),
                                                   " output ids but ", output_types.size(),
                                                   " types"));
  }
  const int index = int(nodes_.size());
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const int id = node.outputs[i];
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("negative value id %", id));
    if (id >= int(values_.size())) values_.resize(id + 1);
    if (values_[id].producer >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("value %", id, " is defined twice (nodes ",
                                                     values_[id].producer, " and ", index, ")"));
    }
    values_[id] = {output_types[i], index, int(i)};
  }
  nodes_.push_back(std::move(node));
  return absl::OkStatus();
}

int Graph::FindOutput(absl::string_view name) const {
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (outputs_[i].name == name) return int(i);
  }
  return -1;
}

int Graph::FindSource(absl::string_view name) const {
  for (const Node& n : nodes_) {
    if ((n.op == OpKind::kParameter || n.op == OpKind::kInput) &&
        AttrString(n, "name") == name) {
      return n.outputs[0];
    }
  }
  return -1;
}

std::vector<std::vector<int>> Graph::Users() const {
  std::vector<std::vector<int>> users(values_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (int in : nodes_[i].inputs) {
      if (in >= 0 && in < int(users.size()) &&
          (users[in].empty() || users[in].back() != int(i))) {
        users[in].push_back(int(i));
      }
    }
  }
  return users;
}

// ---- verifier --------------------------------------------------------------------------------------

namespace {

std::string NodeLabel(const Graph& g, int index) {
  const Node& n = g.nodes()[index];
  std::string outs = absl::StrJoin(n.outputs, ",", [](std::string* o, int id) {
    absl::StrAppend(o, "%", id);
  });
  std::string s = absl::StrCat("node ", index, " (", outs.empty() ? "" : outs + " = ",
                               OpName(n.op), ")");
  if (!n.scope.empty()) absl::StrAppend(&s, " in '", n.scope, "'");
  return s;
}

absl::Status CheckSymbolsDeclared(const Graph& g, const Type& t) {
  for (const Dim& d : t.shape) {
    for (const std::string& s : d.symbols()) {
      if (g.FindSymbol(s) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("type ", t.ToString(), " uses symbol '", s,
                                                       "' that the graph does not declare"));
      }
    }
    if (d.coeff() < 0 || (d.is_constant() && d.value() < 0)) {
      return absl::InvalidArgumentError(absl::StrCat("type ", t.ToString(), " has a negative dim"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Verify(const Graph& g) {
  std::vector<bool> defined(g.num_value_ids(), false);
  absl::flat_hash_set<std::string> source_names;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    auto fail = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(NodeLabel(g, int(i)), ": ", what));
    };
    std::vector<Type> in_types;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int id = n.inputs[k];
      if (!g.has_value(id)) {
        return fail(absl::StrCat("input ", k, " is %", id, ", which no node defines"));
      }
      if (!defined[id]) {
        return fail(absl::StrCat("input ", k, " is %", id, ", defined later by node ",
                                 g.value(id).producer, " (not in topological order)"));
      }
      in_types.push_back(g.type(id));
    }
    auto inferred = InferTypes(n.op, in_types, n.attrs);
    if (!inferred.ok()) return fail(std::string(inferred.status().message()));
    if (inferred->size() != n.outputs.size()) {
      return fail(absl::StrCat("expected ", inferred->size(), " outputs, found ", n.outputs.size()));
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const int id = n.outputs[k];
      if (!g.has_value(id) || g.value(id).producer != int(i)) {
        return fail(absl::StrCat("output %", id, " is not recorded as produced by this node"));
      }
      if (g.type(id) != (*inferred)[k]) {
        return fail(absl::StrCat("output %", id, ": expected type ", (*inferred)[k].ToString(),
                                 ", found ", g.type(id).ToString()));
      }
      auto st = CheckSymbolsDeclared(g, g.type(id));
      if (!st.ok()) return fail(absl::StrCat("output %", id, ": ", st.message()));
      defined[id] = true;
    }
    if (n.op == OpKind::kParameter || n.op == OpKind::kInput) {
      const std::string& name = AttrString(n, "name");
      if (name.empty()) return fail("source with an empty name");
      if (!source_names.insert(name).second) {
        return fail(absl::StrCat("source name '", name, "' is used by another parameter/input"));
      }
    }
  }
  absl::flat_hash_set<std::string> out_names;
  for (const GraphOutput& o : g.outputs()) {
    if (!g.has_value(o.value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph output '", o.name, "' is %", o.value, ", which no node defines"));
    }
    if (!out_names.insert(o.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("graph output name '", o.name,
                                                     "' is used twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBinding(const Graph& g, const Binding& binding) {
  for (const SymbolInfo& s : g.symbols()) {
    auto it = binding.find(s.name);
    if (it == binding.end()) {
      return absl::InvalidArgumentError(absl::StrCat("symbol '", s.name, "' is not bound"));
    }
    SG_RETURN_IF_ERROR(s.Check(it->second));
  }
  return absl::OkStatus();
}

Graph Canonicalize(const Graph& g) {
  Graph out;
  for (const SymbolInfo& s : g.symbols()) (void)out.AddSymbol(s);
  std::vector<int> remap(g.num_value_ids(), -1);
  for (const Node& n : g.nodes()) {
    std::vector<int> ins;
    for (int id : n.inputs) ins.push_back(id >= 0 && id < int(remap.size()) ? remap[id] : id);
    std::vector<Type> types;
    for (int id : n.outputs) types.push_back(g.type(id));
    std::vector<int> outs = out.AddNode(n.op, std::move(ins), n.attrs, types, n.scope, n.phase);
    for (size_t k = 0; k < outs.size(); ++k) remap[n.outputs[k]] = outs[k];
  }
  for (const GraphOutput& o : g.outputs()) out.AddOutput(o.name, remap[o.value]);
  return out;
}

}  // namespace sg::graph
