#include "trainer/model/llama_model.h"

#include <cmath>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "graph/builder.h"
#include "kernels/core/status.h"
#include "trainer/safetensors/hf_llama_names.h"

namespace sg::trainer {
namespace {

struct LayerName {
  const char* graph;  // after "layers.<i>."
  HfLayerWeight hf;
};
constexpr LayerName kLayerNames[] = {
    {"attention_norm.weight", HfLayerWeight::kInputNorm},
    {"attention.wq.weight", HfLayerWeight::kQ},
    {"attention.wk.weight", HfLayerWeight::kK},
    {"attention.wv.weight", HfLayerWeight::kV},
    {"attention.wo.weight", HfLayerWeight::kO},
    {"ffn_norm.weight", HfLayerWeight::kPostAttentionNorm},
    {"feed_forward.w1.weight", HfLayerWeight::kGate},
    {"feed_forward.w3.weight", HfLayerWeight::kUp},
    {"feed_forward.w2.weight", HfLayerWeight::kDown},
};

// "<prefix><int>.<rest>" -> (int, rest).
bool SplitLayer(absl::string_view name, absl::string_view prefix, int64_t* layer, absl::string_view* rest) {
  if (!absl::ConsumePrefix(&name, prefix)) return false;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos) return false;
  if (!absl::SimpleAtoi(name.substr(0, dot), layer) || *layer < 0) return false;
  *rest = name.substr(dot + 1);
  return true;
}

}  // namespace

graph::LlamaConfig ToGraphConfig(const LlamaConfig& c) {
  graph::LlamaConfig g;
  g.dim = c.dim;
  g.n_layers = c.n_layers;
  g.n_heads = c.n_heads;
  g.n_kv_heads = c.n_kv_heads;
  g.ffn_dim = c.ffn_dim;
  g.vocab = c.vocab_size;
  g.norm_eps = c.norm_eps;
  g.rope_theta = c.rope_theta;
  g.max_seq_len = c.max_seq_len;
  g.dtype = DType::kF32;
  return g;
}

absl::StatusOr<std::string> HfParameterName(absl::string_view graph_name) {
  if (graph_name == "tok_embeddings.weight") return std::string(kHfEmbedTokens);
  if (graph_name == "norm.weight") return std::string(kHfFinalNorm);
  if (graph_name == "output.weight") return std::string(kHfLmHead);
  int64_t layer;
  absl::string_view rest;
  if (SplitLayer(graph_name, "layers.", &layer, &rest)) {
    for (const LayerName& n : kLayerNames) {
      if (rest == n.graph) return HfLayerWeightName(layer, n.hf);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model parameter '", graph_name, "' has no Hugging Face Llama name (expected ",
                   "tok_embeddings.weight, norm.weight, output.weight or layers.<i>.<weight>)"));
}

absl::StatusOr<std::string> GraphParameterName(absl::string_view hf_name) {
  if (hf_name == kHfEmbedTokens) return std::string("tok_embeddings.weight");
  if (hf_name == kHfFinalNorm) return std::string("norm.weight");
  if (hf_name == kHfLmHead) return std::string("output.weight");
  int64_t layer;
  absl::string_view rest;
  if (SplitLayer(hf_name, "model.layers.", &layer, &rest)) {
    for (const LayerName& n : kLayerNames) {
      if (HfLayerWeightName(layer, n.hf) == hf_name) return absl::StrCat("layers.", layer, ".", n.graph);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor '", hf_name, "' is not a Hugging Face Llama parameter"));
}

absl::StatusOr<graph::Graph> BuildTrainForward(const LlamaConfig& c) {
  SG_RETURN_IF_ERROR(ValidateLlamaConfig(c));
  return graph::BuildLlamaForward(ToGraphConfig(c));
}

absl::StatusOr<graph::Graph> BuildEvalForward(const LlamaConfig& c) {
  SG_RETURN_IF_ERROR(ValidateLlamaConfig(c));
  const graph::LlamaConfig gc = ToGraphConfig(c);
  SG_RETURN_IF_ERROR(gc.Validate());
  graph::Llama model(gc);
  graph::Builder b;
  const graph::Dim batch = b.Symbol("batch", 1, gc.max_batch);
  const graph::Dim seq = b.Symbol("seq", 1, gc.max_seq_len, gc.seq_multiple_of);
  graph::Value tokens = b.Input("tokens", DType::kI32, {batch, seq});
  graph::Value targets = b.Input("targets", DType::kI32, {batch, seq});
  graph::Value logits = model.Forward(b, tokens);
  b.Output("logits", logits);
  {
    auto scope = b.EnterScope("loss");
    b.Output("loss", b.SoftmaxCrossEntropy(logits, targets, -100));
  }
  return b.Finish();
}

std::vector<NamedTensor> InitialWeights(const LlamaConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };  // (0, 1)
  const double residual_scale = 1.0 / std::sqrt(2.0 * double(c.n_layers));
  std::vector<NamedTensor> out;
  for (const HfParameter& p : HfLlamaParameters(c)) {
    Tensor t = Tensor::Empty(p.shape, DType::kF32, Device::Cpu()).value();
    float* d = t.view().data<float>();
    const int64_t n = t.numel();
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < n; ++i) d[i] = 1.0f;
    } else {
      const bool residual = absl::EndsWith(p.name, "o_proj.weight") || absl::EndsWith(p.name, "down_proj.weight");
      const double std = 0.02 * (residual ? residual_scale : 1.0);
      for (int64_t i = 0; i < n; i += 2) {
        const double r = std::sqrt(-2.0 * std::log(uniform())), a = 2.0 * M_PI * uniform();
        d[i] = float(std * r * std::cos(a));
        if (i + 1 < n) d[i + 1] = float(std * r * std::sin(a));
      }
    }
    out.push_back({p.name, std::move(t)});
  }
  return out;
}

}  // namespace sg::trainer
