#include "graph/ops.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/core/status.h"

namespace sg::graph {
namespace {

using K = AttrKind;

const std::vector<OpSchema>& Table() {
  static const std::vector<OpSchema>* table = new std::vector<OpSchema>{
      {OpKind::kParameter, "parameter", 0, 0,
       {{"name", K::kString}, {"shape", K::kShape}, {"dtype", K::kDType}, {"trainable", K::kBool}},
       true},
      {OpKind::kInput, "input", 0, 0,
       {{"name", K::kString}, {"shape", K::kShape}, {"dtype", K::kDType}}, true},
      {OpKind::kFill, "fill", 0, 0,
       {{"value", K::kFloat}, {"shape", K::kShape}, {"dtype", K::kDType}}, true},
      {OpKind::kEmbedding, "embedding", 2, 2, {}},
      {OpKind::kEmbeddingBackward, "embedding_backward", 2, 2, {{"num_embeddings", K::kInt}}},
      {OpKind::kMatmul, "matmul", 2, 4,
       {{"trans_a", K::kBool}, {"trans_b", K::kBool}, {"epilogue", K::kString},
        {"prologue", K::kString}}},
      {OpKind::kRmsNorm, "rmsnorm", 2, 2, {{"eps", K::kFloat}}},
      {OpKind::kRmsNormBackward, "rmsnorm_backward", 3, 3, {{"eps", K::kFloat}}},
      {OpKind::kAddRmsNorm, "add_rmsnorm", 3, 3, {{"eps", K::kFloat}}},
      {OpKind::kAddRmsNormBackward, "add_rmsnorm_backward", 4, 4, {{"eps", K::kFloat}}},
      {OpKind::kRope, "rope", 1, 1, {{"theta", K::kFloat}}},
      {OpKind::kRopeBackward, "rope_backward", 1, 1, {{"theta", K::kFloat}}},
      {OpKind::kAttention, "attention", 3, 3, {{"causal", K::kBool}, {"scale", K::kFloat}}},
      {OpKind::kAttentionBackward, "attention_backward", 5, 5,
       {{"causal", K::kBool}, {"scale", K::kFloat}}},
      {OpKind::kSwiGLU, "swiglu", 2, 2, {}, false, true},
      {OpKind::kSwiGLUBackward, "swiglu_backward", 3, 3, {}, false, true},
      {OpKind::kSoftmaxCrossEntropy, "softmax_cross_entropy", 2, 2, {{"ignore_index", K::kInt}}},
      {OpKind::kSoftmaxCrossEntropyBackward, "softmax_cross_entropy_backward", 3, 3,
       {{"ignore_index", K::kInt}}},
      {OpKind::kLogSoftmax, "log_softmax", 1, 1, {}},
      {OpKind::kLogSoftmaxBackward, "log_softmax_backward", 2, 2, {}},
      {OpKind::kNllLoss, "nll_loss", 2, 2, {{"ignore_index", K::kInt}}},
      {OpKind::kNllLossBackward, "nll_loss_backward", 3, 3, {{"ignore_index", K::kInt}}},
      {OpKind::kAdd, "add", 2, 2, {}, false, true},
      {OpKind::kSub, "sub", 2, 2, {}, false, true},
      {OpKind::kMul, "mul", 2, 2, {}, false, true},
      {OpKind::kDiv, "div", 2, 2, {}, false, true},
      {OpKind::kNeg, "neg", 1, 1, {}, false, true},
      {OpKind::kScale, "scale", 1, 1, {{"factor", K::kFloat}}, false, true},
      {OpKind::kSilu, "silu", 1, 1, {}, false, true},
      {OpKind::kSiluBackward, "silu_backward", 2, 2, {}, false, true},
      {OpKind::kExp, "exp", 1, 1, {}, false, true},
      {OpKind::kLog, "log", 1, 1, {}, false, true},
      {OpKind::kRsqrt, "rsqrt", 1, 1, {}, false, true},
      {OpKind::kReshape, "reshape", 1, 1, {{"shape", K::kShape}}},
      {OpKind::kTranspose, "transpose", 1, 1, {{"perm", K::kIntList}}},
      {OpKind::kCast, "cast", 1, 1, {{"dtype", K::kDType}}, false, true},
      {OpKind::kReduceSum, "reduce_sum", 1, 1, {{"dims", K::kIntList}}},
      {OpKind::kBroadcast, "broadcast", 1, 1, {{"shape", K::kShape}, {"dims", K::kIntList}}},
      {OpKind::kGradNorm, "grad_norm", 1, -1, {{"max_norm", K::kFloat}}},
      {OpKind::kAdamW, "adamw", 7, 7,
       {{"beta1", K::kFloat}, {"beta2", K::kFloat}, {"eps", K::kFloat},
        {"weight_decay", K::kFloat}}},
  };
  return *table;
}

const char* AttrKindName(AttrKind k) {
  switch (k) {
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kFloat: return "float";
    case K::kString: return "string";
    case K::kIntList: return "int list";
    case K::kShape: return "shape";
    case K::kDType: return "dtype";
  }
  return "?";
}

absl::Status Err(const std::string& msg) { return absl::InvalidArgumentError(msg); }

std::string InName(int i) { return absl::StrCat("input ", i); }

absl::Status ExpectFloat(const std::vector<Type>& in, int i) {
  if (!IsFloating(in[i].dtype)) {
    return Err(absl::StrCat(InName(i), ": expected a floating dtype, found ", in[i].ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectInt(const std::vector<Type>& in, int i) {
  if (IsFloating(in[i].dtype)) {
    return Err(absl::StrCat(InName(i), ": expected i32 or i64 indices, found ", in[i].ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectSame(const std::vector<Type>& in, int i, const Type& want, const char* what) {
  if (in[i] != want) {
    return Err(absl::StrCat(InName(i), " (", what, "): expected ", want.ToString(), ", found ",
                            in[i].ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectRank(const std::vector<Type>& in, int i, int rank, const char* what) {
  if (in[i].rank() != rank) {
    return Err(absl::StrCat(InName(i), " (", what, "): expected rank ", rank, ", found ",
                            in[i].ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectMinRank(const std::vector<Type>& in, int i, int rank, const char* what) {
  if (in[i].rank() < rank) {
    return Err(absl::StrCat(InName(i), " (", what, "): expected rank >= ", rank, ", found ",
                            in[i].ToString()));
  }
  return absl::OkStatus();
}

Type Scalar() { return Type{DType::kF32, {}}; }

SymShape Leading(const SymShape& s) { return SymShape(s.begin(), s.end() - 1); }

bool IsSuffix(const SymShape& small, const SymShape& big) {
  return small.size() <= big.size() && std::equal(small.begin(), small.end(),
                                                  big.end() - small.size());
}

absl::StatusOr<std::vector<Type>> InferMatmul(const std::vector<Type>& in, const Attrs& attrs) {
  const bool ta = std::get<bool>(attrs.at("trans_a"));
  const bool tb = std::get<bool>(attrs.at("trans_b"));
  const std::string& epi = std::get<std::string>(attrs.at("epilogue"));
  const std::string& pro = std::get<std::string>(attrs.at("prologue"));
  const bool bias = epi == "bias" || epi == "bias_residual";
  const bool residual = epi == "residual" || epi == "bias_residual";
  if (!bias && !residual && epi != "none") {
    return Err(absl::StrCat("epilogue: expected none, bias, residual or bias_residual, found '",
                            epi, "'"));
  }
  if (pro != "" && pro != "rmsnorm") {
    return Err(absl::StrCat("prologue: expected \"\" or \"rmsnorm\", found '", pro, "'"));
  }
  const size_t want = 2 + bias + residual;
  if (in.size() != want) {
    return Err(absl::StrCat("epilogue '", epi, "' expects ", want, " inputs, found ", in.size()));
  }
  SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
  const Type& a = in[0];
  const Type& b = in[1];
  if (b.dtype != a.dtype) {
    return Err(absl::StrCat("input 1 (b): expected dtype ", DTypeName(a.dtype), ", found ",
                            b.ToString()));
  }
  Type out{a.dtype, {}};
  if (!ta) {
    SG_RETURN_IF_ERROR(ExpectMinRank(in, 0, 2, "a"));
    SG_RETURN_IF_ERROR(ExpectRank(in, 1, 2, "b"));
    const Dim k = a.shape.back();
    const Dim bk = tb ? b.shape[1] : b.shape[0];
    if (k != bk) {
      return Err(absl::StrCat("contraction dims differ: a ", a.ToString(), " vs b ", b.ToString(),
                              tb ? " (trans_b)" : "", ": expected ", k.ToString(), ", found ",
                              bk.ToString()));
    }
    out.shape = Leading(a.shape);
    out.shape.push_back(tb ? b.shape[0] : b.shape[1]);
  } else {
    if (tb) return Err("trans_a and trans_b together are not supported");
    SG_RETURN_IF_ERROR(ExpectMinRank(in, 0, 2, "a"));
    if (b.rank() != a.rank() || Leading(a.shape) != Leading(b.shape)) {
      return Err(absl::StrCat("trans_a contracts the leading dims: b must be ",
                              SymShapeToString(Leading(a.shape)), "+[N], found ", b.ToString()));
    }
    out.shape = {a.shape.back(), b.shape.back()};
  }
  size_t next = 2;
  if (bias) {
    SG_RETURN_IF_ERROR(ExpectSame(in, int(next++), Type{a.dtype, {out.shape.back()}}, "bias"));
  }
  if (residual) SG_RETURN_IF_ERROR(ExpectSame(in, int(next), out, "residual"));
  return std::vector<Type>{out};
}

absl::StatusOr<std::vector<Type>> InferBinary(const std::vector<Type>& in) {
  SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
  if (in[0].dtype != in[1].dtype) {
    return Err(absl::StrCat("dtypes differ: ", in[0].ToString(), " vs ", in[1].ToString()));
  }
  if (IsSuffix(in[1].shape, in[0].shape)) return std::vector<Type>{in[0]};
  if (IsSuffix(in[0].shape, in[1].shape)) return std::vector<Type>{in[1]};
  return Err(absl::StrCat("shapes do not broadcast (one must be a suffix of the other): ",
                          in[0].ToString(), " vs ", in[1].ToString()));
}

absl::StatusOr<std::vector<Type>> InferAttention(const std::vector<Type>& in, bool backward) {
  const int q = backward ? 1 : 0;
  for (int i = 0; i < int(in.size()); ++i) SG_RETURN_IF_ERROR(ExpectFloat(in, i));
  SG_RETURN_IF_ERROR(ExpectRank(in, q, 4, "q [batch,seq,heads,head_dim]"));
  SG_RETURN_IF_ERROR(ExpectRank(in, q + 1, 4, "k [batch,seq,kv_heads,head_dim]"));
  const Type& qt = in[q];
  const Type& kt = in[q + 1];
  if (kt.dtype != qt.dtype || kt.shape[0] != qt.shape[0] || kt.shape[1] != qt.shape[1] ||
      kt.shape[3] != qt.shape[3]) {
    return Err(absl::StrCat("k must match q in dtype, batch, seq and head_dim: q ", qt.ToString(),
                            ", k ", kt.ToString()));
  }
  if (!qt.shape[2].is_constant() || !kt.shape[2].is_constant() ||
      qt.shape[2].value() % kt.shape[2].value() != 0) {
    return Err(absl::StrCat("GQA: q heads must be a constant multiple of kv heads: q ",
                            qt.ToString(), ", k ", kt.ToString()));
  }
  SG_RETURN_IF_ERROR(ExpectSame(in, q + 2, kt, "v"));
  if (!backward) return std::vector<Type>{qt};
  SG_RETURN_IF_ERROR(ExpectSame(in, 0, qt, "dout"));
  SG_RETURN_IF_ERROR(ExpectSame(in, 4, qt, "out"));
  return std::vector<Type>{qt, kt, kt};
}

absl::StatusOr<std::vector<Type>> InferNorm(const std::vector<Type>& in, int x, int w) {
  SG_RETURN_IF_ERROR(ExpectFloat(in, x));
  SG_RETURN_IF_ERROR(ExpectMinRank(in, x, 1, "x"));
  SG_RETURN_IF_ERROR(ExpectSame(in, w, Type{in[x].dtype, {in[x].shape.back()}}, "weight"));
  return std::vector<Type>{in[x], in[w]};
}

absl::Status ExpectTargets(const std::vector<Type>& in, int logits, int targets) {
  SG_RETURN_IF_ERROR(ExpectFloat(in, logits));
  SG_RETURN_IF_ERROR(ExpectMinRank(in, logits, 1, "logits"));
  SG_RETURN_IF_ERROR(ExpectInt(in, targets));
  if (in[targets].shape != Leading(in[logits].shape)) {
    return Err(absl::StrCat(InName(targets), " (targets): expected shape ",
                            SymShapeToString(Leading(in[logits].shape)), ", found ",
                            in[targets].ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Type>> InferRest(OpKind op, const std::vector<Type>& in,
                                            const Attrs& attrs) {
  switch (op) {
    case OpKind::kParameter:
    case OpKind::kInput:
    case OpKind::kFill:
      return std::vector<Type>{Type{std::get<DType>(attrs.at("dtype")),
                                    std::get<SymShape>(attrs.at("shape"))}};
    case OpKind::kEmbedding:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectRank(in, 0, 2, "table [vocab,dim]"));
      SG_RETURN_IF_ERROR(ExpectInt(in, 1));
      {
        Type out{in[0].dtype, in[1].shape};
        out.shape.push_back(in[0].shape[1]);
        return std::vector<Type>{out};
      }
    case OpKind::kEmbeddingBackward: {
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectInt(in, 1));
      const int64_t v = std::get<int64_t>(attrs.at("num_embeddings"));
      if (v < 1) return Err("num_embeddings must be >= 1");
      SymShape want = in[1].shape;
      if (in[0].rank() != in[1].rank() + 1 || Leading(in[0].shape) != want) {
        return Err(absl::StrCat("input 0 (dy): expected ids' shape ", SymShapeToString(want),
                                " + [dim], found ", in[0].ToString()));
      }
      return std::vector<Type>{Type{in[0].dtype, {Dim(v), in[0].shape.back()}}};
    }
    case OpKind::kMatmul: return InferMatmul(in, attrs);
    case OpKind::kRmsNorm: {
      SG_ASSIGN_OR_RETURN(auto t, InferNorm(in, 0, 1));
      return std::vector<Type>{t[0]};
    }
    case OpKind::kRmsNormBackward:
      SG_RETURN_IF_ERROR(InferNorm(in, 1, 2).status());
      SG_RETURN_IF_ERROR(ExpectSame(in, 0, in[1], "dy"));
      return InferNorm(in, 1, 2);
    case OpKind::kAddRmsNorm:
      SG_RETURN_IF_ERROR(InferNorm(in, 0, 2).status());
      SG_RETURN_IF_ERROR(ExpectSame(in, 1, in[0], "residual"));
      return std::vector<Type>{in[0], in[0]};
    case OpKind::kAddRmsNormBackward:
      SG_RETURN_IF_ERROR(InferNorm(in, 2, 3).status());
      SG_RETURN_IF_ERROR(ExpectSame(in, 0, in[2], "dy"));
      SG_RETURN_IF_ERROR(ExpectSame(in, 1, in[2], "dh"));
      return InferNorm(in, 2, 3);
    case OpKind::kRope:
    case OpKind::kRopeBackward:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectRank(in, 0, 4, "x [batch,seq,heads,head_dim]"));
      if (!in[0].shape[3].is_constant() || in[0].shape[3].value() % 2 != 0) {
        return Err(absl::StrCat("rope needs an even constant head_dim, found ", in[0].ToString()));
      }
      return std::vector<Type>{in[0]};
    case OpKind::kAttention: return InferAttention(in, false);
    case OpKind::kAttentionBackward: return InferAttention(in, true);
    case OpKind::kSwiGLU:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectSame(in, 1, in[0], "up"));
      return std::vector<Type>{in[0]};
    case OpKind::kSwiGLUBackward:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectSame(in, 1, in[0], "gate"));
      SG_RETURN_IF_ERROR(ExpectSame(in, 2, in[0], "up"));
      return std::vector<Type>{in[0], in[0]};
    case OpKind::kSoftmaxCrossEntropy:
    case OpKind::kNllLoss:
      SG_RETURN_IF_ERROR(ExpectTargets(in, 0, 1));
      return std::vector<Type>{Scalar()};
    case OpKind::kSoftmaxCrossEntropyBackward:
    case OpKind::kNllLossBackward:
      SG_RETURN_IF_ERROR(ExpectSame(in, 0, Scalar(), "dloss"));
      SG_RETURN_IF_ERROR(ExpectTargets(in, 1, 2));
      return std::vector<Type>{in[1]};
    case OpKind::kLogSoftmax:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectMinRank(in, 0, 1, "x"));
      return std::vector<Type>{in[0]};
    case OpKind::kLogSoftmaxBackward:
    case OpKind::kSiluBackward:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      SG_RETURN_IF_ERROR(ExpectSame(in, 1, in[0], "forward value"));
      return std::vector<Type>{in[0]};
    case OpKind::kAdd:
    case OpKind::kSub:
    case OpKind::kMul:
    case OpKind::kDiv: return InferBinary(in);
    case OpKind::kNeg:
    case OpKind::kScale:
    case OpKind::kSilu:
    case OpKind::kExp:
    case OpKind::kLog:
    case OpKind::kRsqrt:
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      return std::vector<Type>{in[0]};
    case OpKind::kReshape: {
      const SymShape& s = std::get<SymShape>(attrs.at("shape"));
      if (NumElements(s) != NumElements(in[0].shape)) {
        return Err(absl::StrCat("reshape of ", in[0].ToString(), " to ", SymShapeToString(s),
                                ": element counts differ (", NumElements(in[0].shape).ToString(),
                                " vs ", NumElements(s).ToString(), ")"));
      }
      return std::vector<Type>{Type{in[0].dtype, s}};
    }
    case OpKind::kTranspose: {
      const IntList& p = std::get<IntList>(attrs.at("perm"));
      IntList sorted = p;
      std::sort(sorted.begin(), sorted.end());
      bool ok = int(p.size()) == in[0].rank();
      for (size_t i = 0; ok && i < sorted.size(); ++i) ok = sorted[i] == int64_t(i);
      if (!ok) {
        return Err(absl::StrCat("perm [", absl::StrJoin(p, ","), "] is not a permutation of the ",
                                in[0].rank(), " dims of ", in[0].ToString()));
      }
      Type out{in[0].dtype, {}};
      for (int64_t d : p) out.shape.push_back(in[0].shape[d]);
      return std::vector<Type>{out};
    }
    case OpKind::kCast:
      return std::vector<Type>{Type{std::get<DType>(attrs.at("dtype")), in[0].shape}};
    case OpKind::kReduceSum: {
      SG_RETURN_IF_ERROR(ExpectFloat(in, 0));
      const IntList& dims = std::get<IntList>(attrs.at("dims"));
      std::vector<bool> drop(in[0].rank(), false);
      for (int64_t d : dims) {
        if (d < 0 || d >= in[0].rank() || drop[d]) {
          return Err(absl::StrCat("dims [", absl::StrJoin(dims, ","),
                                  "]: expected distinct dims in [0,", in[0].rank(), ") of ",
                                  in[0].ToString()));
        }
        drop[d] = true;
      }
      Type out{in[0].dtype, {}};
      for (int i = 0; i < in[0].rank(); ++i) {
        if (!drop[i]) out.shape.push_back(in[0].shape[i]);
      }
      return std::vector<Type>{out};
    }
    case OpKind::kBroadcast: {
      const SymShape& s = std::get<SymShape>(attrs.at("shape"));
      const IntList& dims = std::get<IntList>(attrs.at("dims"));
      std::vector<bool> added(s.size(), false);
      SymShape rest;
      for (int64_t d : dims) {
        if (d < 0 || d >= int64_t(s.size()) || added[d]) {
          return Err(absl::StrCat("dims [", absl::StrJoin(dims, ","), "]: expected distinct dims in [0,",
                                  s.size(), ")"));
        }
        added[d] = true;
      }
      for (size_t i = 0; i < s.size(); ++i) {
        if (!added[i]) rest.push_back(s[i]);
      }
      if (rest != in[0].shape) {
        return Err(absl::StrCat("broadcast to ", SymShapeToString(s), " along [",
                                absl::StrJoin(dims, ","), "] needs input shape ",
                                SymShapeToString(rest), ", found ", in[0].ToString()));
      }
      return std::vector<Type>{Type{in[0].dtype, s}};
    }
    case OpKind::kGradNorm:
      for (int i = 0; i < int(in.size()); ++i) SG_RETURN_IF_ERROR(ExpectFloat(in, i));
      return std::vector<Type>{Scalar(), Scalar()};
    case OpKind::kAdamW:
      for (int i = 0; i < 4; ++i) SG_RETURN_IF_ERROR(ExpectFloat(in, i));
      for (int i = 1; i < 4; ++i) {
        if (in[i].shape != in[0].shape) {
          return Err(absl::StrCat(InName(i), ": expected the parameter's shape ",
                                  SymShapeToString(in[0].shape), ", found ", in[i].ToString()));
        }
      }
      SG_RETURN_IF_ERROR(ExpectSame(in, 4, Scalar(), "step"));
      SG_RETURN_IF_ERROR(ExpectSame(in, 5, Scalar(), "lr"));
      SG_RETURN_IF_ERROR(ExpectSame(in, 6, Scalar(), "grad_scale"));
      return std::vector<Type>{in[0], in[2], in[3]};
    default: break;
  }
  return absl::InternalError("op without a typing rule");
}

}  // namespace

const OpSchema& Schema(OpKind op) { return Table()[int(op)]; }

absl::StatusOr<OpKind> OpKindFromName(absl::string_view name) {
  for (const OpSchema& s : Table()) {
    if (s.name == name) return s.op;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown op '", name, "'"));
}

absl::StatusOr<std::vector<Type>> InferTypes(OpKind op, const std::vector<Type>& inputs,
                                             const Attrs& attrs) {
  if (int(op) >= kNumOpKinds) return Err("op kind out of range");
  const OpSchema& s = Schema(op);
  const int n = int(inputs.size());
  if (n < s.min_inputs || (s.max_inputs >= 0 && n > s.max_inputs)) {
    std::string want = s.min_inputs == s.max_inputs ? absl::StrCat(s.min_inputs)
                       : s.max_inputs < 0           ? absl::StrCat(">= ", s.min_inputs)
                                          : absl::StrCat(s.min_inputs, "..", s.max_inputs);
    return Err(absl::StrCat("expected ", want, " inputs, found ", n));
  }
  for (const AttrSpec& a : s.attrs) {
    auto it = attrs.find(a.name);
    if (it == attrs.end()) return Err(absl::StrCat("missing attribute '", a.name, "'"));
    if (int(it->second.index()) != int(a.kind)) {
      return Err(absl::StrCat("attribute '", a.name, "': expected ", AttrKindName(a.kind),
                              ", found ", AttrToString(it->second)));
    }
  }
  for (const auto& [name, v] : attrs) {
    bool known = false;
    for (const AttrSpec& a : s.attrs) known |= name == a.name;
    if (!known) return Err(absl::StrCat("unknown attribute '", name, "'"));
  }
  return InferRest(op, inputs, attrs);
}

bool AttrBool(const Node& n, const char* name) { return std::get<bool>(n.attrs.at(name)); }
int64_t AttrInt(const Node& n, const char* name) { return std::get<int64_t>(n.attrs.at(name)); }
double AttrFloat(const Node& n, const char* name) { return std::get<double>(n.attrs.at(name)); }
const std::string& AttrString(const Node& n, const char* name) {
  return std::get<std::string>(n.attrs.at(name));
}
const IntList& AttrInts(const Node& n, const char* name) {
  return std::get<IntList>(n.attrs.at(name));
}
const SymShape& AttrShape(const Node& n, const char* name) {
  return std::get<SymShape>(n.attrs.at(name));
}
DType AttrDType(const Node& n, const char* name) { return std::get<DType>(n.attrs.at(name)); }

}  // namespace sg::graph
