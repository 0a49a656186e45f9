// Llama hyper-parameters: named presets, the Hugging Face `config.json` format, parameter count.
//
//   SG_ASSIGN_OR_RETURN(sg::trainer::LlamaConfig c, sg::trainer::LlamaPreset("tiny"));
//   SG_ASSIGN_OR_RETURN(c, sg::trainer::ReadHfConfig("/models/llama/config.json"));
//   SG_RETURN_IF_ERROR(sg::trainer::WriteHfConfig(c, "/ckpt/config.json"));
#ifndef SGTRAIN_TRAINER_CONFIG_LLAMA_CONFIG_H_
#define SGTRAIN_TRAINER_CONFIG_LLAMA_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sg::trainer {

// The model's shape. Embeddings are untied (lm_head is its own matrix), attention and MLP have no
// biases, the MLP is SwiGLU and RoPE follows Hugging Face's (rotate-half) convention.
struct LlamaConfig {
  int64_t dim = 0;          // hidden_size
  int64_t n_layers = 0;     // num_hidden_layers
  int64_t n_heads = 0;      // num_attention_heads
  int64_t n_kv_heads = 0;   // num_key_value_heads (grouped-query attention when < n_heads)
  int64_t ffn_dim = 0;      // intermediate_size
  int64_t vocab_size = 0;   // vocab_size
  int64_t max_seq_len = 0;  // max_position_embeddings
  double norm_eps = 1e-5;   // rms_norm_eps
  double rope_theta = 10000.0;
  // Special tokens written to config.json so that other tools generate correctly; -1 = unset.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_dim() const { return head_dim() * n_kv_heads; }

  friend bool operator==(const LlamaConfig& a, const LlamaConfig& b);
  friend bool operator!=(const LlamaConfig& a, const LlamaConfig& b) { return !(a == b); }
};

// Checks the relations the model relies on (all sizes positive, dim divisible by n_heads, n_heads
// divisible by n_kv_heads, even head_dim for RoPE, eps and theta positive). The error names the
// field, the value found and what was expected.
absl::Status ValidateLlamaConfig(const LlamaConfig& c);

// "tiny" (a byte-level model that learns visibly in a couple of CPU minutes), "124m", "1b", "7b".
// NotFound lists the known names.
absl::StatusOr<LlamaConfig> LlamaPreset(absl::string_view name);
std::vector<std::string> LlamaPresetNames();

// Parses a Hugging Face Llama config.json. `source` names the file in errors. Required:
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size; optional with
// Hugging Face's defaults: num_key_value_heads (= num_attention_heads), rms_norm_eps (1e-6),
// rope_theta (10000), max_position_embeddings (2048), tie_word_embeddings (must be false when
// present), bos/eos_token_id. Refused with a message naming file, field, expected and found: a
// wrong type or value, model_type other than "llama", hidden_act other than "silu", biases,
// rope_scaling, or a head_dim that differs from hidden_size / num_attention_heads.
absl::StatusOr<LlamaConfig> ParseHfConfig(absl::string_view json_text, absl::string_view source);
absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& path);

// The config.json text that transformers' LlamaForCausalLM loads (validates `c` first).
absl::StatusOr<std::string> HfConfigJson(const LlamaConfig& c, absl::string_view torch_dtype = "float32");
// Writes HfConfigJson atomically.
absl::Status WriteHfConfig(const LlamaConfig& c, const std::string& path,
                           absl::string_view torch_dtype = "float32");

// Number of parameters: embeddings, per-layer attention/MLP/norm weights, final norm and lm_head.
int64_t ParameterCount(const LlamaConfig& c);

// "dim=128 layers=4 heads=4 kv_heads=2 ffn=384 vocab=258 seq=128 eps=1e-05 theta=10000"
std::string LlamaConfigToString(const LlamaConfig& c);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_CONFIG_LLAMA_CONFIG_H_
