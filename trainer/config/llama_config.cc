#include "trainer/config/llama_config.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/core/status.h"
#include "nlohmann/json.hpp"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

using nlohmann::json;

// The value as it appears in the file, shortened for messages.
std::string Found(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

absl::Status FieldError(absl::string_view source, absl::string_view field, absl::string_view expected,
                        absl::string_view found) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": field '", field, "': expected ", expected, ", found ", found));
}

// Reads an integer field; absent -> `fallback` (or an error when there is none).
absl::StatusOr<int64_t> GetInt(const json& j, absl::string_view source, const char* field,
                               std::optional<int64_t> fallback, int64_t min_value) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return FieldError(source, field, absl::StrCat("an integer >= ", min_value), "nothing (field missing)");
  }
  if (!it->is_number_integer()) {
    return FieldError(source, field, absl::StrCat("an integer >= ", min_value), Found(*it));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) {
    return FieldError(source, field, "an integer that fits in int64", Found(*it));
  }
  const int64_t v = it->get<int64_t>();
  if (v < min_value) return FieldError(source, field, absl::StrCat("an integer >= ", min_value), Found(*it));
  return v;
}

absl::StatusOr<double> GetPositiveNumber(const json& j, absl::string_view source, const char* field,
                                         double fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>())) {
    return FieldError(source, field, "a positive finite number", Found(*it));
  }
  return it->get<double>();
}

// A field that, when present, must equal `expected` (features the model does not implement).
absl::Status ExpectIfPresent(const json& j, absl::string_view source, const char* field, const json& expected,
                             absl::string_view why) {
  auto it = j.find(field);
  if (it == j.end() || *it == expected) return absl::OkStatus();
  return FieldError(source, field, absl::StrCat(expected.dump(), " (", why, ")"), Found(*it));
}

struct Preset {
  const char* name;
  LlamaConfig config;
};

LlamaConfig Make(int64_t dim, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                 int64_t seq, double eps) {
  LlamaConfig c;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.ffn_dim = ffn;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.norm_eps = eps;
  c.rope_theta = 10000.0;
  return c;
}

const std::vector<Preset>& Presets() {
  static const auto* presets = new std::vector<Preset>{
      // Byte-level vocabulary: 256 bytes + BOS (256) + EOS (257). About 0.85M parameters, so a few
      // hundred thousand tokens (a couple of minutes on 2 CPU cores) take the loss from ~5.5 nats
      // well towards 2. Head dim 64 (2 heads, 1 KV head): the CUDA attention kernels take 64 or 128,
      // so the same default run works on a GPU.
      {"tiny", [] {
         LlamaConfig c = Make(128, 4, 2, 1, 384, 258, 128, 1e-5);
         c.bos_token_id = 256;
         c.eos_token_id = 257;
         return c;
       }()},
      // GPT-2-small-sized Llama with the Llama 2 SentencePiece vocabulary.
      {"124m", Make(768, 12, 12, 12, 2048, 32000, 1024, 1e-5)},
      {"1b", Make(2048, 16, 32, 8, 8192, 32000, 2048, 1e-5)},
      // Llama 2 7B.
      {"7b", Make(4096, 32, 32, 32, 11008, 32000, 4096, 1e-5)},
  };
  return *presets;
}

}  // namespace

bool operator==(const LlamaConfig& a, const LlamaConfig& b) {
  return a.dim == b.dim && a.n_layers == b.n_layers && a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads &&
         a.ffn_dim == b.ffn_dim && a.vocab_size == b.vocab_size && a.max_seq_len == b.max_seq_len &&
         a.norm_eps == b.norm_eps && a.rope_theta == b.rope_theta && a.bos_token_id == b.bos_token_id &&
         a.eos_token_id == b.eos_token_id;
}

absl::Status ValidateLlamaConfig(const LlamaConfig& c) {
  auto positive = [](const char* field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("llama config: ", field, " must be positive, found ", v));
  };
  SG_RETURN_IF_ERROR(positive("dim", c.dim));
  SG_RETURN_IF_ERROR(positive("n_layers", c.n_layers));
  SG_RETURN_IF_ERROR(positive("n_heads", c.n_heads));
  SG_RETURN_IF_ERROR(positive("n_kv_heads", c.n_kv_heads));
  SG_RETURN_IF_ERROR(positive("ffn_dim", c.ffn_dim));
  SG_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  SG_RETURN_IF_ERROR(positive("max_seq_len", c.max_seq_len));
  SG_CHECK_ARG(c.dim % c.n_heads == 0, "llama config: dim (", c.dim, ") must be divisible by n_heads (",
               c.n_heads, ")");
  SG_CHECK_ARG(c.n_heads % c.n_kv_heads == 0, "llama config: n_heads (", c.n_heads,
               ") must be divisible by n_kv_heads (", c.n_kv_heads, ")");
  SG_CHECK_ARG(c.head_dim() % 2 == 0, "llama config: head_dim = dim / n_heads must be even for RoPE, found ",
               c.head_dim());
  SG_CHECK_ARG(c.norm_eps > 0 && std::isfinite(c.norm_eps), "llama config: norm_eps must be positive, found ",
               c.norm_eps);
  SG_CHECK_ARG(c.rope_theta > 0 && std::isfinite(c.rope_theta),
               "llama config: rope_theta must be positive, found ", c.rope_theta);
  for (auto [name, id] : {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id}}) {
    SG_CHECK_ARG(id >= -1 && id < c.vocab_size, "llama config: ", name, " must be -1 (unset) or in [0, ",
                 c.vocab_size, "), found ", id);
  }
  return absl::OkStatus();
}

std::vector<std::string> LlamaPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.push_back(p.name);
  return names;
}

absl::StatusOr<LlamaConfig> LlamaPreset(absl::string_view name) {
  for (const Preset& p : Presets()) {
    if (name == p.name) return p.config;
  }
  return absl::NotFoundError(absl::StrCat("unknown Llama preset '", name, "'; expected one of: ",
                                          absl::StrJoin(LlamaPresetNames(), ", ")));
}

absl::StatusOr<LlamaConfig> ParseHfConfig(absl::string_view json_text, absl::string_view source) {
  json j;
  try {
    j = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object at the top level, found ", Found(j)));
  }
  SG_RETURN_IF_ERROR(ExpectIfPresent(j, source, "model_type", "llama", "only Llama models are supported"));
  SG_RETURN_IF_ERROR(ExpectIfPresent(j, source, "hidden_act", "silu", "the MLP is SwiGLU"));
  SG_RETURN_IF_ERROR(ExpectIfPresent(j, source, "tie_word_embeddings", false,
                                     "embeddings are untied: lm_head is its own matrix"));
  SG_RETURN_IF_ERROR(ExpectIfPresent(j, source, "attention_bias", false, "attention has no biases"));
  SG_RETURN_IF_ERROR(ExpectIfPresent(j, source, "mlp_bias", false, "the MLP has no biases"));
  SG_RETURN_IF_ERROR(ExpectIfPresent(j, source, "rope_scaling", nullptr, "RoPE scaling is not implemented"));

  LlamaConfig c;
  SG_ASSIGN_OR_RETURN(c.dim, GetInt(j, source, "hidden_size", std::nullopt, 1));
  SG_ASSIGN_OR_RETURN(c.ffn_dim, GetInt(j, source, "intermediate_size", std::nullopt, 1));
  SG_ASSIGN_OR_RETURN(c.n_layers, GetInt(j, source, "num_hidden_layers", std::nullopt, 1));
  SG_ASSIGN_OR_RETURN(c.n_heads, GetInt(j, source, "num_attention_heads", std::nullopt, 1));
  SG_ASSIGN_OR_RETURN(c.n_kv_heads, GetInt(j, source, "num_key_value_heads", c.n_heads, 1));
  SG_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, source, "vocab_size", std::nullopt, 1));
  SG_ASSIGN_OR_RETURN(c.max_seq_len, GetInt(j, source, "max_position_embeddings", 2048, 1));
  SG_ASSIGN_OR_RETURN(c.norm_eps, GetPositiveNumber(j, source, "rms_norm_eps", 1e-6));
  SG_ASSIGN_OR_RETURN(c.rope_theta, GetPositiveNumber(j, source, "rope_theta", 10000.0));
  SG_ASSIGN_OR_RETURN(c.bos_token_id, GetInt(j, source, "bos_token_id", -1, 0));
  SG_ASSIGN_OR_RETURN(c.eos_token_id, GetInt(j, source, "eos_token_id", -1, 0));

  if (c.dim % c.n_heads != 0) {
    return FieldError(source, "hidden_size", absl::StrCat("a multiple of num_attention_heads (", c.n_heads, ")"),
                      absl::StrCat(c.dim));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return FieldError(source, "num_key_value_heads",
                      absl::StrCat("a divisor of num_attention_heads (", c.n_heads, ")"), absl::StrCat(c.n_kv_heads));
  }
  SG_ASSIGN_OR_RETURN(int64_t head_dim, GetInt(j, source, "head_dim", c.head_dim(), 1));
  if (head_dim != c.head_dim()) {
    return FieldError(source, "head_dim",
                      absl::StrCat("hidden_size / num_attention_heads = ", c.head_dim()), absl::StrCat(head_dim));
  }
  for (auto [field, id] : {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id}}) {
    if (id >= c.vocab_size) {
      return FieldError(source, field, absl::StrCat("a token id below vocab_size (", c.vocab_size, ")"),
                        absl::StrCat(id));
    }
  }
  absl::Status valid = ValidateLlamaConfig(c);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  return c;
}

absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& path) {
  SG_ASSIGN_OR_RETURN(std::string text, ReadFile(path, int64_t(1) << 24));
  return ParseHfConfig(text, path);
}

absl::StatusOr<std::string> HfConfigJson(const LlamaConfig& c, absl::string_view torch_dtype) {
  SG_RETURN_IF_ERROR(ValidateLlamaConfig(c));
  json j = json::object();
  j["architectures"] = json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim();
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = std::string(torch_dtype);
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  return j.dump(2) + "\n";
}

absl::Status WriteHfConfig(const LlamaConfig& c, const std::string& path, absl::string_view torch_dtype) {
  SG_ASSIGN_OR_RETURN(std::string text, HfConfigJson(c, torch_dtype));
  return WriteFileAtomic(path, text);
}

int64_t ParameterCount(const LlamaConfig& c) {
  const int64_t attention = c.dim * c.dim * 2 + c.dim * c.kv_dim() * 2;  // q, o; k, v
  const int64_t mlp = 3 * c.dim * c.ffn_dim;                               // gate, up, down
  const int64_t norms = 2 * c.dim;
  return 2 * c.vocab_size * c.dim + c.n_layers * (attention + mlp + norms) + c.dim;
}

std::string LlamaConfigToString(const LlamaConfig& c) {
  return absl::StrCat("dim=", c.dim, " layers=", c.n_layers, " heads=", c.n_heads, " kv_heads=", c.n_kv_heads,
                      " ffn=", c.ffn_dim, " vocab=", c.vocab_size, " seq=", c.max_seq_len, " eps=", c.norm_eps,
                      " theta=", c.rope_theta);
}

}  // namespace sg::trainer
