#include "graph/builder.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::graph {

Dim Builder::Symbol(const std::string& name, int64_t min, int64_t max, int64_t multiple_of) {
  absl::Status st = g_.AddSymbol({name, min, max, multiple_of});
  if (!st.ok() && status_.ok()) status_ = st;
  return Dim::Sym(name);
}

Value Builder::Input(const std::string& name, DType dtype, SymShape shape) {
  return Op1(OpKind::kInput, {}, {{"name", name}, {"dtype", dtype}, {"shape", std::move(shape)}});
}

Value Builder::Parameter(const std::string& name, DType dtype, SymShape shape, bool trainable) {
  const int existing = g_.FindSource(name);
  if (existing >= 0) {
    const Type want{dtype, shape};
    if (g_.type(existing) != want && status_.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' requested as ",
                                                        want.ToString(), ", already captured as ",
                                                        g_.type(existing).ToString()));
    }
    return Value{existing};
  }
  ScopeGuard top(this, "");  // sources are not part of any module's computation
  return Op1(OpKind::kParameter, {},
             {{"name", name}, {"dtype", dtype}, {"shape", std::move(shape)},
              {"trainable", trainable}});
}

Value Builder::Fill(double value, DType dtype, SymShape shape) {
  return Op1(OpKind::kFill, {}, {{"value", value}, {"dtype", dtype}, {"shape", std::move(shape)}});
}

Value Builder::Embedding(Value table, Value ids) { return Op1(OpKind::kEmbedding, {table, ids}); }

Value Builder::Matmul(Value a, Value b, const MatmulOptions& o) {
  std::vector<Value> in = {a, b};
  if (o.bias.valid()) in.push_back(o.bias);
  if (o.residual.valid()) in.push_back(o.residual);
  const char* epi = o.bias.valid() ? (o.residual.valid() ? "bias_residual" : "bias")
                                   : (o.residual.valid() ? "residual" : "none");
  return Op1(OpKind::kMatmul, in,
             {{"trans_a", o.trans_a}, {"trans_b", o.trans_b}, {"epilogue", std::string(epi)},
              {"prologue", std::string()}});
}

Value Builder::RmsNorm(Value x, Value weight, double eps) {
  return Op1(OpKind::kRmsNorm, {x, weight}, {{"eps", eps}});
}

std::pair<Value, Value> Builder::AddRmsNorm(Value x, Value residual, Value weight, double eps) {
  std::vector<Value> out = Emit(OpKind::kAddRmsNorm, {x, residual, weight}, {{"eps", eps}});
  if (out.size() != 2) return {};
  return {out[0], out[1]};
}

Value Builder::Rope(Value x, double theta) { return Op1(OpKind::kRope, {x}, {{"theta", theta}}); }

Value Builder::Attention(Value q, Value k, Value v, bool causal, double scale) {
  if (scale <= 0 && q.valid() && type(q).rank() == 4 && type(q).shape[3].is_constant()) {
    scale = 1.0 / std::sqrt(double(type(q).shape[3].value()));
  }
  return Op1(OpKind::kAttention, {q, k, v}, {{"causal", causal}, {"scale", scale}});
}

Value Builder::SwiGLU(Value gate, Value up) { return Op1(OpKind::kSwiGLU, {gate, up}); }

Value Builder::SoftmaxCrossEntropy(Value logits, Value targets, int64_t ignore_index) {
  return Op1(OpKind::kSoftmaxCrossEntropy, {logits, targets}, {{"ignore_index", ignore_index}});
}

Value Builder::LogSoftmax(Value x) { return Op1(OpKind::kLogSoftmax, {x}); }

Value Builder::NllLoss(Value logp, Value targets, int64_t ignore_index) {
  return Op1(OpKind::kNllLoss, {logp, targets}, {{"ignore_index", ignore_index}});
}

std::pair<Value, Value> Builder::GradNorm(const std::vector<Value>& grads, double max_norm) {
  std::vector<Value> out = Emit(OpKind::kGradNorm, grads, {{"max_norm", max_norm}});
  if (out.size() != 2) return {};
  return {out[0], out[1]};
}

std::vector<Value> Builder::Emit(OpKind op, const std::vector<Value>& inputs, Attrs attrs) {
  if (!status_.ok()) return {};
  std::vector<int> ids;
  std::vector<Type> types;
  for (const Value& v : inputs) {
    if (!g_.has_value(v.id)) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          OpName(op), scope_.empty() ? "" : " in '" + scope_ + "'", ": input ", ids.size(),
          " is not a captured value (id ", v.id, ")"));
      return {};
    }
    ids.push_back(v.id);
    types.push_back(g_.type(v.id));
  }
  auto out_types = InferTypes(op, types, attrs);
  if (!out_types.ok()) {
    std::string ins;
    for (size_t i = 0; i < types.size(); ++i) {
      absl::StrAppend(&ins, i ? ", " : "", "%", ids[i], ":", types[i].ToString());
    }
    status_ = absl::InvalidArgumentError(absl::StrCat(
        OpName(op), "(", ins, ")", scope_.empty() ? "" : " in '" + scope_ + "'", ": ",
        out_types.status().message()));
    return {};
  }
  std::vector<int> outs = g_.AddNode(op, std::move(ids), std::move(attrs), *out_types, scope_, phase_);
  std::vector<Value> result;
  for (int id : outs) result.push_back(Value{id});
  return result;
}

void Builder::Output(const std::string& name, Value v) {
  if (!status_.ok()) return;
  if (!g_.has_value(v.id)) {
    status_ = absl::InvalidArgumentError(absl::StrCat("output '", name, "' is not a captured value"));
    return;
  }
  g_.AddOutput(name, v.id);
}

absl::StatusOr<Graph> Builder::Finish() {
  SG_RETURN_IF_ERROR(status_);
  SG_RETURN_IF_ERROR(Verify(g_));
  return std::move(g_);
}

// ---- Module -----------------------------------------------------------------------------------------

std::string Module::FullName(const ParameterSpec* p) const { return Join(path_, p->local_name); }

std::vector<std::pair<std::string, const ParameterSpec*>> Module::NamedParameters() const {
  std::vector<std::pair<std::string, const ParameterSpec*>> out;
  for (const auto& p : params_) out.push_back({FullName(p.get()), p.get()});
  for (const auto& [name, child] : children_) {
    auto sub = child->NamedParameters();
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

const ParameterSpec* Module::DeclareParameter(std::string name, SymShape shape, DType dtype,
                                              ParameterSpec::Init init, double init_std) {
  params_.push_back(std::make_unique<ParameterSpec>(
      ParameterSpec{std::move(name), std::move(shape), dtype, init, init_std}));
  return params_.back().get();
}

Value Module::Param(Builder& b, const ParameterSpec* p) const {
  return b.Parameter(FullName(p), p->dtype, p->shape);
}

void Module::SetPath(std::string path) {
  path_ = std::move(path);
  for (auto& [name, child] : children_) child->SetPath(Join(path_, name));
}

}  // namespace sg::graph
