// Hugging Face Llama parameter names and shapes, so our checkpoints load in transformers and
// transformers' checkpoints load here. Weights are in Hugging Face's [out_features, in_features]
// orientation (y = x W^T). Hugging Face's q_proj/k_proj rows are already ordered for its
// rotate-half RoPE, which is the convention our model uses, so no permutation is applied.
//
//   for (const HfParameter& p : HfLlamaParameters(config)) { ... p.name, p.shape ... }
//   std::string q = HfLayerWeightName(3, HfLayerWeight::kQ);  // "model.layers.3.self_attn.q_proj.weight"
//   SG_RETURN_IF_ERROR(CheckHfLlamaTensors(TensorShapes(file), config, file.path()));
#ifndef SGTRAIN_TRAINER_SAFETENSORS_HF_LLAMA_NAMES_H_
#define SGTRAIN_TRAINER_SAFETENSORS_HF_LLAMA_NAMES_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/shape.h"
#include "trainer/config/llama_config.h"
#include "trainer/safetensors/safetensors.h"

namespace sg::trainer {

inline constexpr char kHfEmbedTokens[] = "model.embed_tokens.weight";  // [vocab, dim]
inline constexpr char kHfFinalNorm[] = "model.norm.weight";            // [dim]
inline constexpr char kHfLmHead[] = "lm_head.weight";                  // [vocab, dim]

// The nine per-layer weights, in the order HfLlamaParameters lists them.
enum class HfLayerWeight { kInputNorm, kQ, kK, kV, kO, kPostAttentionNorm, kGate, kUp, kDown };
inline constexpr HfLayerWeight kAllHfLayerWeights[] = {
    HfLayerWeight::kInputNorm, HfLayerWeight::kQ,    HfLayerWeight::kK,
    HfLayerWeight::kV,         HfLayerWeight::kO,    HfLayerWeight::kPostAttentionNorm,
    HfLayerWeight::kGate,      HfLayerWeight::kUp,   HfLayerWeight::kDown};

// "model.layers.{layer}.self_attn.q_proj.weight", "model.layers.{layer}.mlp.gate_proj.weight", ...
std::string HfLayerWeightName(int64_t layer, HfLayerWeight w);
// The weight's shape under `c`: q/o [dim, dim], k/v [kv_dim, dim], gate/up [ffn, dim],
// down [dim, ffn], norms [dim].
Shape HfLayerWeightShape(const LlamaConfig& c, HfLayerWeight w);

struct HfParameter {
  std::string name;
  Shape shape;
};
// Every parameter: embed_tokens, then each layer's nine weights, then norm and lm_head. The
// shapes' element counts add up to ParameterCount(c).
std::vector<HfParameter> HfLlamaParameters(const LlamaConfig& c);

// Names and shapes of a tensor list (e.g. a loaded file), for CheckHfLlamaTensors.
std::vector<std::pair<std::string, Shape>> TensorShapes(const SafetensorsFile& f);
std::vector<std::pair<std::string, Shape>> TensorShapes(const std::vector<NamedTensor>& tensors);

// Checks `found` against the config's parameters: each one present with the right shape, nothing
// unexpected (older checkpoints' "...rotary_emb.inv_freq" buffers are ignored). The error names
// `source`, the tensor, the shape found and the shape the config expects, e.g.
// "model.safetensors: tensor 'model.layers.3.self_attn.k_proj.weight' has shape [512,256], config
// expects [128,256]".
absl::Status CheckHfLlamaTensors(const std::vector<std::pair<std::string, Shape>>& found, const LlamaConfig& c,
                                 absl::string_view source);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_SAFETENSORS_HF_LLAMA_NAMES_H_
