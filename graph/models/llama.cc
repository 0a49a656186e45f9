#include "graph/models/llama.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::graph {

LlamaConfig LlamaConfig::Llama1B() {
  LlamaConfig c;
  c.dim = 2048;
  c.n_layers = 16;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.ffn_dim = 8192;
  c.vocab = 128256;
  c.rope_theta = 500000.0;
  return c;
}

LlamaConfig LlamaConfig::Tiny() {
  LlamaConfig c;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 24;
  c.vocab = 11;
  c.rope_theta = 10000.0;
  c.dtype = DType::kF32;
  return c;
}

absl::Status LlamaConfig::Validate() const {
  SG_CHECK_ARG(dim > 0 && n_layers > 0 && n_heads > 0 && n_kv_heads > 0 && ffn_dim > 0 && vocab > 0,
               "llama config: every size must be positive");
  SG_CHECK_ARG(dim % n_heads == 0, "llama config: dim=", dim, " is not a multiple of n_heads=", n_heads);
  SG_CHECK_ARG(n_heads % n_kv_heads == 0, "llama config: n_heads=", n_heads,
               " is not a multiple of n_kv_heads=", n_kv_heads);
  SG_CHECK_ARG(head_dim() % 2 == 0, "llama config: head_dim=", head_dim(), " must be even for RoPE");
  SG_CHECK_ARG(IsFloating(dtype), "llama config: dtype must be floating, found ", DTypeName(dtype));
  return absl::OkStatus();
}

Linear::Linear(int64_t in, int64_t out, DType dtype) {
  weight_ = DeclareParameter("weight", {out, in}, dtype);
}

Value Linear::Forward(Builder& b, Value x) const {
  auto scope = b.EnterScope(path());
  return b.Matmul(x, Param(b, weight_), MatmulOptions::TransB());
}

RmsNormModule::RmsNormModule(int64_t dim, double eps, DType dtype) : eps_(eps) {
  weight_ = DeclareParameter("weight", {dim}, dtype, ParameterSpec::Init::kOnes);
}

Value RmsNormModule::Forward(Builder& b, Value x) const {
  auto scope = b.EnterScope(path());
  return b.RmsNorm(x, Param(b, weight_), eps_);
}

Attention::Attention(const LlamaConfig& c) : c_(c) {
  const int64_t hd = c.head_dim();
  wq_ = AddSubmodule<Linear>("wq", c.dim, c.n_heads * hd, c.dtype);
  wk_ = AddSubmodule<Linear>("wk", c.dim, c.n_kv_heads * hd, c.dtype);
  wv_ = AddSubmodule<Linear>("wv", c.dim, c.n_kv_heads * hd, c.dtype);
  wo_ = AddSubmodule<Linear>("wo", c.n_heads * hd, c.dim, c.dtype);
}

Value Attention::Forward(Builder& b, Value x) const {
  const SymShape& xs = b.type(x).shape;  // [batch, seq, dim]
  const Dim batch = xs[0], seq = xs[1];
  const int64_t hd = c_.head_dim();
  Value q = wq_->Forward(b, x), k = wk_->Forward(b, x), v = wv_->Forward(b, x);
  auto scope = b.EnterScope(path());
  q = b.Rope(b.Reshape(q, {batch, seq, c_.n_heads, hd}), c_.rope_theta);
  k = b.Rope(b.Reshape(k, {batch, seq, c_.n_kv_heads, hd}), c_.rope_theta);
  v = b.Reshape(v, {batch, seq, c_.n_kv_heads, hd});
  Value o = b.Reshape(b.Attention(q, k, v, /*causal=*/true), {batch, seq, c_.n_heads * hd});
  return wo_->Forward(b, o);
}

FeedForward::FeedForward(const LlamaConfig& c) {
  w1_ = AddSubmodule<Linear>("w1", c.dim, c.ffn_dim, c.dtype);
  w2_ = AddSubmodule<Linear>("w2", c.ffn_dim, c.dim, c.dtype);
  w3_ = AddSubmodule<Linear>("w3", c.dim, c.ffn_dim, c.dtype);
}

Value FeedForward::Forward(Builder& b, Value x) const {
  Value gate = w1_->Forward(b, x), up = w3_->Forward(b, x);
  Value act;
  {
    auto scope = b.EnterScope(path());
    act = b.Mul(b.Silu(gate), up);
  }
  return w2_->Forward(b, act);
}

TransformerBlock::TransformerBlock(const LlamaConfig& c) {
  attention_norm_ = AddSubmodule<RmsNormModule>("attention_norm", c.dim, c.norm_eps, c.dtype);
  attention_ = AddSubmodule<Attention>("attention", c);
  ffn_norm_ = AddSubmodule<RmsNormModule>("ffn_norm", c.dim, c.norm_eps, c.dtype);
  feed_forward_ = AddSubmodule<FeedForward>("feed_forward", c);
}

Value TransformerBlock::Forward(Builder& b, Value h) const {
  Value a = attention_->Forward(b, attention_norm_->Forward(b, h));
  {
    auto scope = b.EnterScope(path());
    h = b.Add(h, a);
  }
  Value f = feed_forward_->Forward(b, ffn_norm_->Forward(b, h));
  auto scope = b.EnterScope(path());
  return b.Add(h, f);
}

Llama::Llama(const LlamaConfig& c) : c_(c) {
  tok_embeddings_ = DeclareParameter("tok_embeddings.weight", {c.vocab, c.dim}, c.dtype);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    layers_.push_back(AddSubmodule<TransformerBlock>(absl::StrCat("layers.", i), c));
  }
  norm_ = AddSubmodule<RmsNormModule>("norm", c.dim, c.norm_eps, c.dtype);
  output_ = AddSubmodule<Linear>("output", c.dim, c.vocab, c.dtype);
}

Value Llama::Forward(Builder& b, Value tokens) const {
  Value h;
  {
    auto scope = b.EnterScope("tok_embeddings");
    h = b.Embedding(Param(b, tok_embeddings_), tokens);
  }
  for (const TransformerBlock* layer : layers_) h = layer->Forward(b, h);
  return output_->Forward(b, norm_->Forward(b, h));
}

absl::StatusOr<Graph> BuildLlamaForward(const LlamaConfig& c) {
  SG_RETURN_IF_ERROR(c.Validate());
  Llama model(c);
  Builder b;
  const Dim batch = b.Symbol("batch", 1, c.max_batch);
  const Dim seq = b.Symbol("seq", 1, c.max_seq_len, c.seq_multiple_of);
  Value tokens = b.Input("tokens", DType::kI32, {batch, seq});
  Value targets = b.Input("targets", DType::kI32, {batch, seq});
  Value logits = model.Forward(b, tokens);
  {
    auto scope = b.EnterScope("loss");
    b.Output("loss", b.SoftmaxCrossEntropy(logits, targets, -100));
  }
  return b.Finish();
}

absl::StatusOr<Graph> BuildLlamaTrainStep(const LlamaConfig& c, const TrainStepOptions& options) {
  SG_ASSIGN_OR_RETURN(Graph fwd, BuildLlamaForward(c));
  return BuildTrainStep(fwd, options);
}

}  // namespace sg::graph
