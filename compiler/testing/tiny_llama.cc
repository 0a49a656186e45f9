#include "compiler/testing/tiny_llama.h"

#include "absl/strings/str_cat.h"
#include "graph/builder.h"
#include "graph/ops.h"

namespace sg::compiler::testing {

using graph::Builder;
using graph::Dim;
using graph::MatmulOptions;
using graph::Value;

absl::StatusOr<graph::Graph> TinyLlama(const TinyLlamaConfig& c) {
  Builder b;
  const Dim batch = b.Symbol("batch"), seq = b.Symbol("seq");
  const int64_t hd = c.dim / c.heads;
  Value tokens = b.Input("tokens", DType::kI32, {batch, seq});
  Value targets = b.Input("targets", DType::kI32, {batch, seq});
  auto param = [&](const std::string& name, graph::SymShape shape) {
    return b.Parameter(name, DType::kF32, std::move(shape));
  };
  Value x, table;
  {
    auto s = b.EnterScope("tok_embeddings");
    table = param("tok_embeddings.weight", {c.vocab, c.dim});
    x = b.Embedding(table, tokens);
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l);
    Value h;
    {
      auto s = b.EnterScope(p + ".attention");
      Value xn = b.RmsNorm(x, param(p + ".attention_norm.weight", {c.dim}), c.eps);
      Value q = b.Matmul(xn, param(p + ".attention.wq.weight", {c.heads * hd, c.dim}), MatmulOptions::TransB());
      Value k = b.Matmul(xn, param(p + ".attention.wk.weight", {c.kv_heads * hd, c.dim}), MatmulOptions::TransB());
      Value v = b.Matmul(xn, param(p + ".attention.wv.weight", {c.kv_heads * hd, c.dim}), MatmulOptions::TransB());
      q = b.Rope(b.Reshape(q, {batch, seq, c.heads, hd}), c.rope_theta);
      k = b.Rope(b.Reshape(k, {batch, seq, c.kv_heads, hd}), c.rope_theta);
      v = b.Reshape(v, {batch, seq, c.kv_heads, hd});
      Value a = b.Reshape(b.Attention(q, k, v, /*causal=*/true), {batch, seq, c.heads * hd});
      MatmulOptions o = MatmulOptions::TransB();
      o.residual = x;
      h = b.Matmul(a, param(p + ".attention.wo.weight", {c.dim, c.heads * hd}), o);
    }
    {
      auto s = b.EnterScope(p + ".feed_forward");
      Value hn = b.RmsNorm(h, param(p + ".ffn_norm.weight", {c.dim}), c.eps);
      Value gate = b.Matmul(hn, param(p + ".feed_forward.w1.weight", {c.ffn, c.dim}), MatmulOptions::TransB());
      Value up = b.Matmul(hn, param(p + ".feed_forward.w3.weight", {c.ffn, c.dim}), MatmulOptions::TransB());
      MatmulOptions o = MatmulOptions::TransB();
      o.residual = h;
      x = b.Matmul(b.SwiGLU(gate, up), param(p + ".feed_forward.w2.weight", {c.dim, c.ffn}), o);
    }
  }
  {
    auto s = b.EnterScope("output");
    Value xn = b.RmsNorm(x, param("norm.weight", {c.dim}), c.eps);
    Value head = c.tied ? table : param("output.weight", {c.vocab, c.dim});
    Value logits = b.Matmul(xn, head, MatmulOptions::TransB());
    b.Output("loss", b.SoftmaxCrossEntropy(logits, targets));
  }
  return b.Finish();
}

graph::Feeds RandomParameters(const graph::Graph& g, std::mt19937_64& rng) {
  graph::Feeds f;
  for (const graph::Node& n : g.nodes()) {
    if (n.op != graph::OpKind::kParameter || !graph::AttrBool(n, "trainable")) continue;
    const std::string& name = graph::AttrString(n, "name");
    Shape shape;
    for (const Dim& d : graph::AttrShape(n, "shape")) shape.push_back(d.value());
    graph::HostTensor t = graph::HostTensor::Random(shape, DType::kF32, rng, 0.3);
    if (shape.size() == 1) {
      for (double& v : t.data) v = 1.0 + v;  // norm weights near 1
    }
    f[name] = t;
  }
  return f;
}

graph::Feeds RandomBatch(int64_t batch, int64_t seq, int64_t vocab, std::mt19937_64& rng) {
  graph::Feeds f;
  f["tokens"] = graph::HostTensor::Random({batch, seq}, DType::kI32, rng, 1.0, vocab);
  f["targets"] = graph::HostTensor::Random({batch, seq}, DType::kI32, rng, 1.0, vocab);
  return f;
}

}  // namespace sg::compiler::testing
