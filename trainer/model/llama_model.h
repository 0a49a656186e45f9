// The trainer's view of the Llama model: our LlamaConfig as the graph layer's model
// (graph/models/llama.h, defined once there), the mapping between the graph's parameter names
// (Meta's layout) and Hugging Face's, initial weights, and the forward graphs the trainer compiles
// (loss) or interprets (loss + logits, for validation and sampling).
//
//   SG_ASSIGN_OR_RETURN(graph::Graph fwd, BuildTrainForward(config));          // output "loss"
//   std::vector<NamedTensor> w = InitialWeights(config, /*seed=*/1);          // HF names
//   SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName("model.norm.weight"));  // "norm.weight"
#ifndef SGTRAIN_TRAINER_MODEL_LLAMA_MODEL_H_
#define SGTRAIN_TRAINER_MODEL_LLAMA_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/ir.h"
#include "graph/models/llama.h"
#include "trainer/config/llama_config.h"
#include "trainer/safetensors/safetensors.h"

namespace sg::trainer {

// The graph layer's config for `c`, parameters in f32 (the compiler's mixed-precision rewrite
// turns compute to bf16 when asked; master weights stay f32). max_seq_len bounds the `seq` symbol.
graph::LlamaConfig ToGraphConfig(const LlamaConfig& c);

// Graph name <-> Hugging Face name, e.g. "layers.3.attention.wq.weight" <->
// "model.layers.3.self_attn.q_proj.weight", "tok_embeddings.weight" <-> "model.embed_tokens.weight",
// "output.weight" <-> "lm_head.weight". Both models use the rotate-half RoPE convention, so the
// tensors themselves are identical (no row permutation). InvalidArgument for an unknown name.
absl::StatusOr<std::string> HfParameterName(absl::string_view graph_name);
absl::StatusOr<std::string> GraphParameterName(absl::string_view hf_name);

// The forward graph the compiler trains: inputs "tokens", "targets" (i32[batch, seq]), output "loss".
absl::StatusOr<graph::Graph> BuildTrainForward(const LlamaConfig& c);
// The same model with a second output "logits" (f32[batch, seq, vocab]), for the forward-only
// path (validation loss and sampling through graph::Interpret).
absl::StatusOr<graph::Graph> BuildEvalForward(const LlamaConfig& c);

// Initial weights under Hugging Face names (HfLlamaParameters order), deterministic in `seed`:
// matrices ~ N(0, 0.02), the residual-branch outputs (o_proj, down_proj) scaled by
// 1/sqrt(2 * n_layers) as in GPT-2, norm weights 1. The normal samples come from our own
// Box-Muller over std::mt19937_64, so the weights are the same with any standard library.
std::vector<NamedTensor> InitialWeights(const LlamaConfig& c, uint64_t seed);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_MODEL_LLAMA_MODEL_H_
