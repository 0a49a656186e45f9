#include "trainer/safetensors/hf_llama_names.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace sg::trainer {

std::string HfLayerWeightName(int64_t layer, HfLayerWeight w) {
  const char* suffix = "";
  switch (w) {
    case HfLayerWeight::kInputNorm: suffix = "input_layernorm.weight"; break;
    case HfLayerWeight::kQ: suffix = "self_attn.q_proj.weight"; break;
    case HfLayerWeight::kK: suffix = "self_attn.k_proj.weight"; break;
    case HfLayerWeight::kV: suffix = "self_attn.v_proj.weight"; break;
    case HfLayerWeight::kO: suffix = "self_attn.o_proj.weight"; break;
    case HfLayerWeight::kPostAttentionNorm: suffix = "post_attention_layernorm.weight"; break;
    case HfLayerWeight::kGate: suffix = "mlp.gate_proj.weight"; break;
    case HfLayerWeight::kUp: suffix = "mlp.up_proj.weight"; break;
    case HfLayerWeight::kDown: suffix = "mlp.down_proj.weight"; break;
  }
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

Shape HfLayerWeightShape(const LlamaConfig& c, HfLayerWeight w) {
  switch (w) {
    case HfLayerWeight::kInputNorm:
    case HfLayerWeight::kPostAttentionNorm: return {c.dim};
    case HfLayerWeight::kQ:
    case HfLayerWeight::kO: return {c.dim, c.dim};
    case HfLayerWeight::kK:
    case HfLayerWeight::kV: return {c.kv_dim(), c.dim};
    case HfLayerWeight::kGate:
    case HfLayerWeight::kUp: return {c.ffn_dim, c.dim};
    case HfLayerWeight::kDown: return {c.dim, c.ffn_dim};
  }
  return {};
}

std::vector<HfParameter> HfLlamaParameters(const LlamaConfig& c) {
  std::vector<HfParameter> out;
  out.push_back({kHfEmbedTokens, {c.vocab_size, c.dim}});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (HfLayerWeight w : kAllHfLayerWeights) out.push_back({HfLayerWeightName(l, w), HfLayerWeightShape(c, w)});
  }
  out.push_back({kHfFinalNorm, {c.dim}});
  out.push_back({kHfLmHead, {c.vocab_size, c.dim}});
  return out;
}

std::vector<std::pair<std::string, Shape>> TensorShapes(const SafetensorsFile& f) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const SafetensorsEntry& e : f.entries()) out.emplace_back(e.name, e.shape);
  return out;
}

std::vector<std::pair<std::string, Shape>> TensorShapes(const std::vector<NamedTensor>& tensors) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const NamedTensor& t : tensors) out.emplace_back(t.name, t.tensor.shape());
  return out;
}

absl::Status CheckHfLlamaTensors(const std::vector<std::pair<std::string, Shape>>& found, const LlamaConfig& c,
                                 absl::string_view source) {
  std::map<std::string, Shape> have;
  for (const auto& [name, shape] : found) {
    if (absl::EndsWith(name, "rotary_emb.inv_freq")) continue;
    have[name] = shape;
  }
  for (const HfParameter& p : HfLlamaParameters(c)) {
    auto it = have.find(p.name);
    if (it == have.end()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": missing tensor '", p.name, "' (config expects shape ",
                                                     ShapeToString(p.shape), ")"));
    }
    if (it->second != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", p.name, "' has shape ",
                                                     ShapeToString(it->second), ", config expects ",
                                                     ShapeToString(p.shape)));
    }
    have.erase(it);
  }
  if (!have.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unexpected tensor '", have.begin()->first,
                                                   "' (not a Llama parameter for config: ", LlamaConfigToString(c),
                                                   ")"));
  }
  return absl::OkStatus();
}

}  // namespace sg::trainer
