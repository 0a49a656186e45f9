// A Llama decoder (Meta's layout and parameter names) written with the capture API. The graph
// tests use it and the trainer reuses it.
//
//   LlamaConfig c = LlamaConfig::Llama1B();
//   SG_ASSIGN_OR_RETURN(Graph fwd, BuildLlamaForward(c));          // outputs "loss"
//   SG_ASSIGN_OR_RETURN(Graph step, BuildLlamaTrainStep(c, {}));   // + backward + AdamW
//
// Inputs: "tokens" and "targets" (i32[batch, seq]; targets == -100 are ignored). `batch` and
// `seq` are symbols constrained by max_batch / max_seq_len / seq_multiple_of. Parameters:
// "tok_embeddings.weight", "layers.<i>.attention_norm.weight", "layers.<i>.attention.w{q,k,v,o}.weight",
// "layers.<i>.ffn_norm.weight", "layers.<i>.feed_forward.w{1,2,3}.weight", "norm.weight",
// "output.weight"; Linear weights are [out_features, in_features] as in PyTorch.
// The model is written the plain way (rmsnorm, add, silu * up, matmul then add): the fusion pass,
// not the model, turns it into the fused kernels.
#ifndef SGTRAIN_GRAPH_MODELS_LLAMA_H_
#define SGTRAIN_GRAPH_MODELS_LLAMA_H_

#include <vector>

#include "absl/status/statusor.h"
#include "graph/builder.h"
#include "graph/ir.h"
#include "graph/optimizer.h"

namespace sg::graph {

struct LlamaConfig {
  int64_t dim = 64;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t ffn_dim = 128;
  int64_t vocab = 256;
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  int64_t max_batch = 1024;
  int64_t max_seq_len = 8192;
  int64_t seq_multiple_of = 1;
  DType dtype = DType::kBF16;  // parameters and activations; the loss is f32

  int64_t head_dim() const { return dim / n_heads; }
  // Llama 3.2 1B shapes (untied output embedding).
  static LlamaConfig Llama1B();
  // A few-thousand-parameter model for interpreter tests (f32).
  static LlamaConfig Tiny();
  // OK, or InvalidArgument naming the inconsistent fields (e.g. n_heads % n_kv_heads != 0).
  absl::Status Validate() const;
};

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, DType dtype);
  Value Forward(Builder& b, Value x) const;
 private:
  const ParameterSpec* weight_;
};

class RmsNormModule : public Module {
 public:
  RmsNormModule(int64_t dim, double eps, DType dtype);
  Value Forward(Builder& b, Value x) const;
 private:
  const ParameterSpec* weight_;
  double eps_;
};

class Attention : public Module {
 public:
  explicit Attention(const LlamaConfig& c);
  Value Forward(Builder& b, Value x) const;
 private:
  LlamaConfig c_;
  Linear *wq_, *wk_, *wv_, *wo_;
};

class FeedForward : public Module {
 public:
  explicit FeedForward(const LlamaConfig& c);
  Value Forward(Builder& b, Value x) const;
 private:
  Linear *w1_, *w2_, *w3_;
};

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const LlamaConfig& c);
  Value Forward(Builder& b, Value h) const;
 private:
  RmsNormModule *attention_norm_, *ffn_norm_;
  Attention* attention_;
  FeedForward* feed_forward_;
};

class Llama : public Module {
 public:
  explicit Llama(const LlamaConfig& c);
  // logits [batch, seq, vocab] for tokens [batch, seq].
  Value Forward(Builder& b, Value tokens) const;
  const LlamaConfig& config() const { return c_; }
 private:
  LlamaConfig c_;
  const ParameterSpec* tok_embeddings_;
  std::vector<TransformerBlock*> layers_;
  RmsNormModule* norm_;
  Linear* output_;
};

// The forward graph: inputs tokens/targets, output "loss" (mean cross-entropy).
absl::StatusOr<Graph> BuildLlamaForward(const LlamaConfig& c);
// Forward + backward + grad clipping + AdamW (graph/optimizer.h).
absl::StatusOr<Graph> BuildLlamaTrainStep(const LlamaConfig& c, const TrainStepOptions& options);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_MODELS_LLAMA_H_
