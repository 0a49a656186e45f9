// Capture: model code written like a PyTorch module records a Graph.
//
//   class Mlp : public sg::graph::Module {
//    public:
//     Mlp() { w_ = DeclareParameter("weight", {64, 32}); }     // full name "<path>.weight"
//     Value Forward(Builder& b, Value x) {
//       auto scope = b.EnterScope(path());
//       return b.Matmul(x, Param(b, w_), MatmulOptions::TransB());
//     }
//    private: const ParameterSpec* w_;
//   };
//   Builder b; Value x = b.Input("x", DType::kF32, {b.Symbol("batch"), 32});
//   b.Output("y", mlp.Forward(b, x));
//   SG_ASSIGN_OR_RETURN(Graph g, b.Finish());
//
// Errors: an op with ill-typed inputs records the first error (op, scope, expected vs found) and
// returns an invalid Value; later ops on invalid values are skipped. Finish() returns that error,
// so model code reads straight through without a status check per line.
// Model code carries no distribution annotations: sharding decides placements on the graph.
#ifndef SGTRAIN_GRAPH_BUILDER_H_
#define SGTRAIN_GRAPH_BUILDER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"
#include "graph/ops.h"

namespace sg::graph {

// A handle to a value being captured; just its id in the builder's graph.
struct Value {
  int id = -1;
  bool valid() const { return id >= 0; }
};

struct MatmulOptions {
  bool trans_a = false;
  bool trans_b = false;
  Value bias;      // optional [N] epilogue
  Value residual;  // optional epilogue with the output's shape
  static MatmulOptions TransA() { MatmulOptions o; o.trans_a = true; return o; }
  static MatmulOptions TransB() { MatmulOptions o; o.trans_b = true; return o; }
};

class Builder {
 public:
  // Declares (or returns) a symbolic dim with constraints.
  Dim Symbol(const std::string& name, int64_t min = 1,
             int64_t max = std::numeric_limits<int64_t>::max(), int64_t multiple_of = 1);

  Value Input(const std::string& name, DType dtype, SymShape shape);
  // A named parameter; asking again for the same name returns the same value (types must agree).
  Value Parameter(const std::string& name, DType dtype, SymShape shape, bool trainable = true);
  Value Fill(double value, DType dtype, SymShape shape);

  Value Embedding(Value table, Value ids);
  Value Matmul(Value a, Value b, const MatmulOptions& o = {});
  Value RmsNorm(Value x, Value weight, double eps);
  // (normed, x + residual): the fused residual-add + RMSNorm.
  std::pair<Value, Value> AddRmsNorm(Value x, Value residual, Value weight, double eps);
  Value Rope(Value x, double theta);
  // scale <= 0 means 1/sqrt(head_dim).
  Value Attention(Value q, Value k, Value v, bool causal, double scale = 0);
  Value SwiGLU(Value gate, Value up);
  Value SoftmaxCrossEntropy(Value logits, Value targets, int64_t ignore_index = -100);
  Value LogSoftmax(Value x);
  Value NllLoss(Value logp, Value targets, int64_t ignore_index = -100);

  Value Add(Value a, Value b) { return Op1(OpKind::kAdd, {a, b}); }
  Value Sub(Value a, Value b) { return Op1(OpKind::kSub, {a, b}); }
  Value Mul(Value a, Value b) { return Op1(OpKind::kMul, {a, b}); }
  Value Div(Value a, Value b) { return Op1(OpKind::kDiv, {a, b}); }
  Value Neg(Value x) { return Op1(OpKind::kNeg, {x}); }
  Value Scale(Value x, double factor) { return Op1(OpKind::kScale, {x}, {{"factor", factor}}); }
  Value Silu(Value x) { return Op1(OpKind::kSilu, {x}); }
  Value Exp(Value x) { return Op1(OpKind::kExp, {x}); }
  Value Log(Value x) { return Op1(OpKind::kLog, {x}); }
  Value Rsqrt(Value x) { return Op1(OpKind::kRsqrt, {x}); }

  Value Reshape(Value x, SymShape shape) { return Op1(OpKind::kReshape, {x}, {{"shape", shape}}); }
  Value Transpose(Value x, IntList perm) { return Op1(OpKind::kTranspose, {x}, {{"perm", perm}}); }
  Value Cast(Value x, DType dtype) { return Op1(OpKind::kCast, {x}, {{"dtype", dtype}}); }
  Value ReduceSum(Value x, IntList dims) { return Op1(OpKind::kReduceSum, {x}, {{"dims", dims}}); }
  Value Broadcast(Value x, SymShape shape, IntList dims) {
    return Op1(OpKind::kBroadcast, {x}, {{"shape", shape}, {"dims", dims}});
  }
  // (global L2 norm, clip coefficient) over `grads`.
  std::pair<Value, Value> GradNorm(const std::vector<Value>& grads, double max_norm);

  // Any op, for generated code (autodiff, passes). Returns the outputs (empty on error).
  std::vector<Value> Emit(OpKind op, const std::vector<Value>& inputs, Attrs attrs = {});

  void Output(const std::string& name, Value v);

  // The type of a captured value. Precondition: v.valid().
  const Type& type(Value v) const { return g_.type(v.id); }
  const Graph& graph() const { return g_; }
  const absl::Status& status() const { return status_; }

  // RAII: nodes created while alive get `scope` (a module path). Nested scopes replace, not nest,
  // because module paths are already absolute.
  class ScopeGuard {
   public:
    ScopeGuard(Builder* b, std::string scope) : b_(b), saved_(std::exchange(b->scope_, scope)) {}
    ~ScopeGuard() { b_->scope_ = saved_; }
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;
   private:
    Builder* b_;
    std::string saved_;
  };
  [[nodiscard]] ScopeGuard EnterScope(std::string scope) { return ScopeGuard(this, std::move(scope)); }
  void set_phase(Phase p) { phase_ = p; }

  // Verifies and returns the graph, or the first recorded error. The builder is left empty.
  absl::StatusOr<Graph> Finish();

  // Starts from an existing graph (e.g. to append the backward pass); ids are kept.
  explicit Builder(Graph g) : g_(std::move(g)) {}
  Builder() = default;

 private:
  Value Op1(OpKind op, const std::vector<Value>& inputs, Attrs attrs = {}) {
    std::vector<Value> out = Emit(op, inputs, std::move(attrs));
    return out.empty() ? Value{} : out[0];
  }

  Graph g_;
  absl::Status status_;
  std::string scope_;
  Phase phase_ = Phase::kForward;
};

// How a parameter is initialized by the trainer (the graph itself never reads it).
struct ParameterSpec {
  std::string local_name;  // "weight"
  SymShape shape;
  DType dtype = DType::kF32;
  enum class Init : uint8_t { kNormal, kOnes, kZeros } init = Init::kNormal;
  double init_std = 0.02;
};

// A module: parameters and submodules with hierarchical names ("layers.3.attention.wq.weight").
// Subclasses declare parameters and submodules in their constructor and write a Forward method.
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "" for the root, else the dotted path from the root ("layers.3.attention").
  const std::string& path() const { return path_; }
  // Full name of one of this module's parameters.
  std::string FullName(const ParameterSpec* p) const;
  // Every parameter of this module and its submodules: (full name, spec), in declaration order.
  std::vector<std::pair<std::string, const ParameterSpec*>> NamedParameters() const;

 protected:
  const ParameterSpec* DeclareParameter(std::string name, SymShape shape,
                                        DType dtype = DType::kF32,
                                        ParameterSpec::Init init = ParameterSpec::Init::kNormal,
                                        double init_std = 0.02);
  template <typename M, typename... Args>
  M* AddSubmodule(const std::string& name, Args&&... args) {
    auto m = std::make_unique<M>(std::forward<Args>(args)...);
    M* raw = m.get();
    children_.push_back({name, std::move(m)});
    raw->SetPath(Join(path_, name));
    return raw;
  }
  // The parameter's value in `b`'s graph (captured on first use).
  Value Param(Builder& b, const ParameterSpec* p) const;

 private:
  static std::string Join(const std::string& a, const std::string& b) {
    return a.empty() ? b : a + "." + b;
  }
  void SetPath(std::string path);

  std::string path_;
  std::vector<std::unique_ptr<ParameterSpec>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_BUILDER_H_
