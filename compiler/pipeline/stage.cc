#include "compiler/pipeline/stage.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

using graph::Builder;
using graph::Value;

// The slice of the Llama module a stage holds; parameter names are the full model's.
class LlamaStageModule : public graph::Module {
 public:
  LlamaStageModule(const graph::LlamaConfig& c, const StageSpec& s) : c_(c), s_(s) {
    if (s.first()) tok_embeddings_ = DeclareParameter("tok_embeddings.weight", {c.vocab, c.dim}, c.dtype);
    for (int64_t i = s.first_layer; i < s.end_layer; ++i) {
      layers_.push_back(AddSubmodule<graph::TransformerBlock>(absl::StrCat("layers.", i), c));
    }
    if (s.last()) {
      norm_ = AddSubmodule<graph::RmsNormModule>("norm", c.dim, c.norm_eps, c.dtype);
      output_ = AddSubmodule<graph::Linear>("output", c.dim, c.vocab, c.dtype);
    }
  }

  // h_out for a middle stage, logits for the last.
  Value Forward(Builder& b, Value in) const {
    Value h = in;
    if (s_.first()) {
      auto scope = b.EnterScope("tok_embeddings");
      h = b.Embedding(Param(b, tok_embeddings_), in);
    }
    for (const graph::TransformerBlock* layer : layers_) h = layer->Forward(b, h);
    if (s_.last()) h = output_->Forward(b, norm_->Forward(b, h));
    return h;
  }

 private:
  graph::LlamaConfig c_;
  StageSpec s_;
  const graph::ParameterSpec* tok_embeddings_ = nullptr;
  std::vector<graph::TransformerBlock*> layers_;
  graph::RmsNormModule* norm_ = nullptr;
  graph::Linear* output_ = nullptr;
};

// The stage forward; with `cotangent`, also the scalar "vjp" = sum(h_out * cotangent).
absl::StatusOr<graph::Graph> Capture(const graph::LlamaConfig& c, const StageSpec& s, bool cotangent) {
  LlamaStageModule model(c, s);
  Builder b;
  const graph::Dim batch = b.Symbol("batch", 1, c.max_batch);
  const graph::Dim seq = b.Symbol("seq", 1, c.max_seq_len, c.seq_multiple_of);
  Value in = s.first() ? b.Input("tokens", DType::kI32, {batch, seq}) : b.Input("h_in", c.dtype, {batch, seq, c.dim});
  Value out = model.Forward(b, in);
  if (s.last()) {
    Value targets = b.Input("targets", DType::kI32, {batch, seq});
    auto scope = b.EnterScope("loss");
    b.Output("loss", b.SoftmaxCrossEntropy(out, targets, -100));
  } else {
    b.Output("h_out", out);
    if (cotangent) {
      Value g = b.Input("cotangent", c.dtype, {batch, seq, c.dim});
      b.Output("vjp", b.ReduceSum(b.Mul(out, g), {0, 1, 2}));
    }
  }
  return b.Finish();
}

}  // namespace

absl::StatusOr<std::vector<StageSpec>> SplitLayers(int64_t n_layers, int stages) {
  SG_CHECK_ARG(stages >= 1 && stages <= n_layers, "pipeline: stages must be in [1, n_layers = ", n_layers,
               "], found ", stages);
  std::vector<StageSpec> specs;
  int64_t begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int64_t n = n_layers / stages + (s < n_layers % stages ? 1 : 0);
    specs.push_back({s, stages, begin, begin + n});
    begin += n;
  }
  return specs;
}

absl::StatusOr<StageGraphs> BuildLlamaStage(const graph::LlamaConfig& c, const StageSpec& spec) {
  SG_RETURN_IF_ERROR(c.Validate());
  SG_CHECK_ARG(spec.num_stages >= 1 && spec.stage >= 0 && spec.stage < spec.num_stages &&
                   spec.first_layer >= 0 && spec.first_layer <= spec.end_layer && spec.end_layer <= c.n_layers,
               "pipeline stage ", spec.stage, " of ", spec.num_stages, ": layers [", spec.first_layer, ", ",
               spec.end_layer, ") must lie in [0, ", c.n_layers, ")");
  StageGraphs g;
  g.spec = spec;
  SG_ASSIGN_OR_RETURN(g.forward, Capture(c, spec, false));
  SG_ASSIGN_OR_RETURN(graph::Graph with_vjp, Capture(c, spec, !spec.last()));
  graph::BackwardOptions bo;
  bo.loss = spec.last() ? "loss" : "vjp";
  for (const graph::Node& n : with_vjp.nodes()) {
    if (n.op == graph::OpKind::kParameter && std::get<bool>(n.attrs.at("trainable"))) {
      bo.wrt.push_back(n.outputs[0]);
      g.parameters.push_back(std::get<std::string>(n.attrs.at("name")));
    }
  }
  if (!spec.first()) bo.wrt.push_back(with_vjp.FindSource("h_in"));
  SG_ASSIGN_OR_RETURN(graph::BackwardResult r, graph::AppendBackward(with_vjp, bo));
  g.backward = std::move(r.graph);
  return g;
}

absl::StatusOr<std::unique_ptr<InterpretedStage>> InterpretedStage::Create(StageGraphs graphs,
                                                                          const graph::Feeds& params) {
  std::unique_ptr<InterpretedStage> s(new InterpretedStage());
  for (const std::string& name : graphs.parameters) {
    auto it = params.find(name);
    SG_CHECK_ARG(it != params.end(), "pipeline stage ", graphs.spec.stage, ": no value for parameter '", name, "'");
    s->params_[name] = it->second;
  }
  s->g_ = std::move(graphs);
  s->ZeroGrads();
  return s;
}

void InterpretedStage::ZeroGrads() {
  grads_.clear();
  for (const auto& [name, t] : params_) grads_["grad:" + name] = graph::HostTensor::Zeros(t.shape, t.dtype);
}

absl::StatusOr<graph::HostTensor> InterpretedStage::Forward(const graph::Feeds& inputs) {
  graph::Feeds feeds = params_;
  for (const auto& [k, v] : inputs) feeds[k] = v;
  SG_ASSIGN_OR_RETURN(graph::Feeds out, graph::Interpret(g_.forward, feeds));
  return std::move(out.at(g_.spec.last() ? "loss" : "h_out"));
}

absl::StatusOr<graph::HostTensor> InterpretedStage::Backward(const graph::Feeds& inputs,
                                                             const graph::HostTensor* cotangent) {
  SG_CHECK_ARG((cotangent != nullptr) == !g_.spec.last(), "pipeline stage ", g_.spec.stage,
               ": a cotangent of h_out is required exactly when the stage is not the last");
  graph::Feeds feeds = params_;
  for (const auto& [k, v] : inputs) feeds[k] = v;
  if (cotangent != nullptr) feeds["cotangent"] = *cotangent;
  SG_ASSIGN_OR_RETURN(graph::Feeds out, graph::Interpret(g_.backward, feeds));
  for (auto& [name, acc] : grads_) {
    const graph::HostTensor& g = out.at(name);
    for (size_t i = 0; i < acc.data.size(); ++i) acc.data[i] += g.data[i];
  }
  if (g_.spec.first()) return graph::HostTensor{};
  return std::move(out.at("grad:h_in"));
}

}  // namespace sg::compiler
