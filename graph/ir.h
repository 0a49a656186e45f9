// The graph IR: a Llama training step as an SSA graph of ops from a closed set.
//
//   sg::graph::Graph g;
//   g.AddSymbol({"batch", /*min=*/1, /*max=*/64, /*multiple_of=*/1});
//   int x = g.AddNode(OpKind::kInput, {}, {{"name", std::string("x")}, ...}, {type})[0];
//   SG_RETURN_IF_ERROR(sg::graph::Verify(g));   // precise message on the first malformed node
//
// Model code should not build graphs by hand: use graph/builder.h. This file holds the data types
// (symbolic dims and shapes, value types, attributes, nodes, the graph) and the verifier; the op
// set and each op's typing rule live in graph/ops.h.
//
// Concepts:
//  - A Dim is a monomial `coeff * sym1 * sym2 ...` over named symbols ("batch", "seq"); a plain
//    constant has no symbols. Products are enough for everything a Llama step reshapes
//    ([batch, seq, d] <-> [batch*seq, d]); there is no division, so no dim is ever fractional.
//  - Symbols carry constraints (min, max, multiple_of) checked when a graph is bound to concrete
//    sizes (Bind) and by the compile cache's guards.
//  - Values are numbered ids; each is defined by exactly one node output. Nodes are stored in
//    execution order (a topological order), which is also the schedule memory planning uses.
//  - Node::scope is the module path that created it ("layers.3.attention"); Node::phase tells
//    forward, backward (made by autodiff) and optimizer nodes apart (used by recompute).
#ifndef SGTRAIN_GRAPH_IR_H_
#define SGTRAIN_GRAPH_IR_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/core/dtype.h"
#include "kernels/core/shape.h"

namespace sg::graph {

// ---- symbolic dims ------------------------------------------------------------------------------

// coeff * product(symbols); symbols kept sorted so equal dims compare equal.
class Dim {
 public:
  Dim() = default;
  Dim(int64_t value) : coeff_(value) {}  // NOLINT: constants convert implicitly
  static Dim Sym(std::string name, int64_t coeff = 1);

  bool is_constant() const { return symbols_.empty(); }
  int64_t coeff() const { return coeff_; }
  const std::vector<std::string>& symbols() const { return symbols_; }
  // The constant value; only meaningful when is_constant().
  int64_t value() const { return coeff_; }

  friend Dim operator*(const Dim& a, const Dim& b);
  friend bool operator==(const Dim& a, const Dim& b) {
    return a.coeff_ == b.coeff_ && a.symbols_ == b.symbols_;
  }
  friend bool operator!=(const Dim& a, const Dim& b) { return !(a == b); }
  friend bool operator<(const Dim& a, const Dim& b) {
    return a.symbols_ != b.symbols_ ? a.symbols_ < b.symbols_ : a.coeff_ < b.coeff_;
  }
  // "64", "batch", "batch*seq", "2*seq".
  std::string ToString() const;

 private:
  int64_t coeff_ = 1;
  std::vector<std::string> symbols_;
};

using SymShape = std::vector<Dim>;

// "[batch,seq,2048]"
std::string SymShapeToString(const SymShape& s);
// Product of the dims (a Dim again: products of monomials are monomials).
Dim NumElements(const SymShape& s);
SymShape ToSymShape(const Shape& s);

// A named dim's constraints. Bindings outside them are rejected.
struct SymbolInfo {
  std::string name;
  int64_t min = 1;
  int64_t max = std::numeric_limits<int64_t>::max();
  int64_t multiple_of = 1;
  friend bool operator==(const SymbolInfo& a, const SymbolInfo& b) {
    return a.name == b.name && a.min == b.min && a.max == b.max && a.multiple_of == b.multiple_of;
  }
  // "sym seq min=1 max=4096 multiple_of=8"
  std::string ToString() const;
  // OK, or InvalidArgument "symbol 'seq' = 4100 violates max=4096".
  absl::Status Check(int64_t value) const;
};

// Concrete sizes for symbols: {"batch": 4, "seq": 2048}.
using Binding = std::map<std::string, int64_t>;

// Evaluates a dim/shape under a binding; InvalidArgument naming an unbound symbol.
absl::StatusOr<int64_t> Evaluate(const Dim& d, const Binding& b);
absl::StatusOr<Shape> Evaluate(const SymShape& s, const Binding& b);

// ---- types and attributes -----------------------------------------------------------------------

struct Type {
  DType dtype = DType::kF32;
  SymShape shape;
  int rank() const { return int(shape.size()); }
  friend bool operator==(const Type& a, const Type& b) {
    return a.dtype == b.dtype && a.shape == b.shape;
  }
  friend bool operator!=(const Type& a, const Type& b) { return !(a == b); }
  // "f32[batch,seq,2048]"
  std::string ToString() const;
};

using IntList = std::vector<int64_t>;
using AttrValue = std::variant<bool, int64_t, double, std::string, IntList, SymShape, DType>;
// Ordered, so printing and hashing are canonical.
using Attrs = std::map<std::string, AttrValue>;

std::string AttrToString(const AttrValue& v);

// ---- ops ----------------------------------------------------------------------------------------

// The closed op set. Forward/backward pairs follow the project's `<Op>` / `<Op>Backward` naming.
// Signatures and attributes: see graph/ops.h (OpSchema) and docs in ops.cc's table.
enum class OpKind : uint8_t {
  // sources
  kParameter, kInput, kFill,
  // model ops (each mirrors a kernel)
  kEmbedding, kEmbeddingBackward,
  kMatmul,
  kRmsNorm, kRmsNormBackward,
  kAddRmsNorm, kAddRmsNormBackward,
  kRope, kRopeBackward,
  kAttention, kAttentionBackward,
  kSwiGLU, kSwiGLUBackward,
  kSoftmaxCrossEntropy, kSoftmaxCrossEntropyBackward,
  kLogSoftmax, kLogSoftmaxBackward,
  kNllLoss, kNllLossBackward,
  // elementwise
  kAdd, kSub, kMul, kDiv, kNeg, kScale, kSilu, kSiluBackward, kExp, kLog, kRsqrt,
  // layout, types, reductions
  kReshape, kTranspose, kCast, kReduceSum, kBroadcast,
  // optimizer
  kGradNorm, kAdamW,
};
inline constexpr int kNumOpKinds = int(OpKind::kAdamW) + 1;

// Where a node came from: captured forward, generated backward, or the optimizer update.
enum class Phase : uint8_t { kForward, kBackward, kOptimizer };
absl::string_view PhaseName(Phase p);  // "fwd", "bwd", "opt"

struct Node {
  OpKind op;
  std::vector<int> inputs;   // value ids
  std::vector<int> outputs;  // value ids
  Attrs attrs;
  std::string scope;  // module path, "" at top level
  Phase phase = Phase::kForward;
};

struct ValueInfo {
  Type type;
  int producer = -1;  // node index; -1 for an id not (or no longer) defined
  int output_index = 0;
};

// A named graph output. By convention "loss", "grad:<param>", "update:<param>" (the new value
// of a parameter or optimizer state, to be written back in place by the runtime).
struct GraphOutput {
  std::string name;
  int value;
};

class Graph {
 public:
  // Declares a symbol; AlreadyExists is not an error: an identical redeclaration is a no-op,
  // a conflicting one InvalidArgument.
  absl::Status AddSymbol(SymbolInfo s);
  const std::vector<SymbolInfo>& symbols() const { return symbols_; }
  const SymbolInfo* FindSymbol(absl::string_view name) const;

  // Appends a node whose outputs get fresh ids with `output_types`; returns those ids. Does not
  // type-check: call InferTypes (graph/ops.h) first, or Verify afterwards.
  std::vector<int> AddNode(OpKind op, std::vector<int> inputs, Attrs attrs,
                           const std::vector<Type>& output_types, std::string scope = "",
                           Phase phase = Phase::kForward);
  // Appends a node whose output ids are given (the parser keeps ids as written).
  absl::Status AddNodeWithIds(Node node, const std::vector<Type>& output_types);
  void AddOutput(std::string name, int value) { outputs_.push_back({std::move(name), value}); }

  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  std::vector<GraphOutput>& mutable_outputs() { return outputs_; }
  // Type of a defined value id. Precondition: has_value(id).
  const Type& type(int id) const { return values_[id].type; }
  const ValueInfo& value(int id) const { return values_[id]; }
  bool has_value(int id) const {
    return id >= 0 && id < int(values_.size()) && values_[id].producer >= 0;
  }
  int num_value_ids() const { return int(values_.size()); }

  // Index of the output named `name`, or -1.
  int FindOutput(absl::string_view name) const;
  // The value id of the parameter/input called `name`, or -1.
  int FindSource(absl::string_view name) const;
  // For each value id, the node indices using it (graph outputs not included).
  std::vector<std::vector<int>> Users() const;

 private:
  std::vector<SymbolInfo> symbols_;
  std::vector<Node> nodes_;
  std::vector<ValueInfo> values_;
  std::vector<GraphOutput> outputs_;
};

// Checks that `g` is well formed: every input defined by an earlier node, each id defined once,
// each node's attributes and types valid for its op (re-inferred and compared with the recorded
// output types), symbols declared, source names unique, outputs defined and uniquely named.
// InvalidArgument naming the node (index, op, scope), the value ids, and expected vs found.
absl::Status Verify(const Graph& g);

// Checks `binding` against the symbols' constraints (all symbols used must be bound).
absl::Status CheckBinding(const Graph& g, const Binding& binding);

// The same graph with value ids renumbered 0,1,2... in definition order, so two graphs that differ
// only in id numbering print the same text (used for hashing).
Graph Canonicalize(const Graph& g);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_IR_H_
