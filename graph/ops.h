// The op set's signatures: names, arity, attributes and the typing rule of every OpKind.
//
//   const OpSchema& s = Schema(OpKind::kMatmul);          // s.name == "matmul"
//   SG_ASSIGN_OR_RETURN(std::vector<Type> out, InferTypes(OpKind::kMatmul, in_types, attrs));
//   SG_ASSIGN_OR_RETURN(OpKind k, OpKindFromName("add_rmsnorm"));
//
// Semantics (what the interpreter computes; kernels implement the same contract):
//   parameter/input {name, shape, dtype}: graph sources. parameter also has `trainable`.
//   fill {value, shape, dtype}: a constant tensor with every element = value.
//   embedding(table[V,D], ids[...] int) -> [...,D]; embedding_backward(dy[...,D], ids)
//       {num_embeddings} -> dtable[V,D] (scatter-add).
//   matmul(a, b [, bias] [, residual]) {trans_a, trans_b, epilogue, prologue}:
//       trans_a=false: a[...,K] x b[K,N] (b[N,K] if trans_b) -> [...,N];
//       trans_a=true:  a[...,M]^T x b[...,N] contracting ALL leading dims -> [M,N] (weight grads);
//       epilogue "none"|"bias"|"residual"|"bias_residual": + bias[N], + residual (output's shape).
//       prologue "" or "rmsnorm": a marker set by fusion (kernel layer's fused RMSNorm+GEMM may
//       take `a`'s producer); it does not change the result.
//   rmsnorm(x[...,D], w[D]) {eps}: x * rsqrt(mean(x^2) + eps) * w.
//   add_rmsnorm(x, residual, w) {eps} -> (y = rmsnorm(x + residual) * w, h = x + residual).
//   rope(x[b,s,h,d]) {theta}: HF rotate-half, position = index along s, freq_i = theta^(-2i/d).
//   attention(q[b,s,hq,d], k[b,s,hkv,d], v[b,s,hkv,d]) {causal, scale}; hq % hkv == 0 (GQA:
//       q head i reads kv head i / (hq/hkv)).
//   swiglu(gate, up) = silu(gate) * up.
//   softmax_cross_entropy(logits[...,V], targets[...] int) {ignore_index} -> f32[] mean over
//       rows whose target != ignore_index (0 when every row is ignored).
//   log_softmax(x) over the last dim; nll_loss(logp, targets) {ignore_index}: mean of -logp[t].
//   add/sub/mul/div: equal shapes, or one operand's shape a suffix of the other's (broadcast over
//       the leading dims). neg, scale{factor}, silu, exp, log, rsqrt: elementwise.
//   reshape {shape}: same element count (symbolically). transpose {perm}. cast {dtype}.
//   reduce_sum {dims}: sums the listed dims away. broadcast {shape, dims}: input's shape is
//       `shape` without `dims`; copies along the new dims.
//   grad_norm(g...) {max_norm} -> (norm = sqrt(sum g^2), clip = min(1, max_norm/(norm+1e-6)), or
//       1 when max_norm <= 0), both f32[].
//   adamw(p, g, m, v, step[], lr[], grad_scale[]) {beta1, beta2, eps, weight_decay}
//       -> (p', m', v'): g' = g*grad_scale; m' = b1 m + (1-b1) g'; v' = b2 v + (1-b2) g'^2;
//       p' = p - lr (m'/(1-b1^step) / (sqrt(v'/(1-b2^step)) + eps) + wd p).
//   <op>_backward: the VJP of <op>; inputs are the output cotangents then the forward values named
//       in ops.cc; outputs are the cotangents of the forward's differentiable inputs.
#ifndef SGTRAIN_GRAPH_OPS_H_
#define SGTRAIN_GRAPH_OPS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

enum class AttrKind : uint8_t { kBool, kInt, kFloat, kString, kIntList, kShape, kDType };

struct AttrSpec {
  const char* name;
  AttrKind kind;
};

struct OpSchema {
  OpKind op;
  const char* name;          // text-form name, "add_rmsnorm"
  int min_inputs, max_inputs;  // max_inputs = -1: variadic
  std::vector<AttrSpec> attrs;  // exactly these attributes, all required
  bool is_source = false;       // parameter/input/fill
  bool is_elementwise = false;  // cheap pointwise op (recompute policy, fusion)
};

const OpSchema& Schema(OpKind op);
inline const char* OpName(OpKind op) { return Schema(op).name; }
absl::StatusOr<OpKind> OpKindFromName(absl::string_view name);

// Checks attrs against the schema, then the input types against the op's rule, and returns the
// output types. InvalidArgument says which input/attribute and what was expected vs found.
absl::StatusOr<std::vector<Type>> InferTypes(OpKind op, const std::vector<Type>& inputs,
                                             const Attrs& attrs);

// Typed attribute access. Precondition: the attribute exists with that type (Verify checked).
bool AttrBool(const Node& n, const char* name);
int64_t AttrInt(const Node& n, const char* name);
double AttrFloat(const Node& n, const char* name);
const std::string& AttrString(const Node& n, const char* name);
const IntList& AttrInts(const Node& n, const char* name);
const SymShape& AttrShape(const Node& n, const char* name);
DType AttrDType(const Node& n, const char* name);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_OPS_H_
