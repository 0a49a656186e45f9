#include "trainer/config/llama_config.h"

#include <cstdlib>
#include <random>

#include "gtest/gtest.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string TmpPath(const std::string& name) {
  return JoinPath(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", name);
}

// meta-llama/Llama-2-7b-hf's config.json as published.
constexpr char kLlama2_7b[] = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

// TinyLlama-1.1B's shape (grouped-query attention with 4 KV heads).
constexpr char kTinyLlama[] = R"({"hidden_size": 2048, "intermediate_size": 5632,
  "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
  "rms_norm_eps": 1e-05, "max_position_embeddings": 2048, "model_type": "llama"})";

TEST(LlamaConfigTest, PresetsHaveTheDocumentedShapes) {
  struct Want {
    const char* name;
    int64_t dim, layers, heads, kv, ffn, vocab;
  };
  for (const Want& w : {Want{"124m", 768, 12, 12, 12, 2048, 32000}, Want{"1b", 2048, 16, 32, 8, 8192, 32000},
                        Want{"7b", 4096, 32, 32, 32, 11008, 32000}}) {
    auto c = LlamaPreset(w.name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->dim, w.dim) << w.name;
    EXPECT_EQ(c->n_layers, w.layers) << w.name;
    EXPECT_EQ(c->n_heads, w.heads) << w.name;
    EXPECT_EQ(c->n_kv_heads, w.kv) << w.name;
    EXPECT_EQ(c->ffn_dim, w.ffn) << w.name;
    EXPECT_EQ(c->vocab_size, w.vocab) << w.name;
  }
  for (const std::string& name : LlamaPresetNames()) {
    auto c = LlamaPreset(name);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(ValidateLlamaConfig(*c).ok()) << name << ": " << ValidateLlamaConfig(*c);
  }
  auto tiny = LlamaPreset("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->vocab_size, 258);  // bytes + BOS + EOS
  EXPECT_LT(tiny->n_kv_heads, tiny->n_heads);  // exercises grouped-query attention on the CPU
  EXPECT_LT(ParameterCount(*tiny), 2'000'000);

  auto unknown = LlamaPreset("13b");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'13b'"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("tiny, 124m, 1b, 7b"), std::string::npos);
}

// Published parameter counts: Llama 2 7B has 6,738,415,616 and TinyLlama 1.1B 1,100,048,384.
TEST(LlamaConfigTest, ParameterCountMatchesPublishedModels) {
  auto llama2 = ParseHfConfig(kLlama2_7b, "llama2.json");
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  EXPECT_EQ(ParameterCount(*llama2), 6738415616);
  auto tinyllama = ParseHfConfig(kTinyLlama, "tinyllama.json");
  ASSERT_TRUE(tinyllama.ok()) << tinyllama.status();
  EXPECT_EQ(ParameterCount(*tinyllama), 1100048384);
  EXPECT_EQ(tinyllama->norm_eps, 1e-5);
  EXPECT_EQ(tinyllama->rope_theta, 10000.0);  // absent -> Hugging Face's default
}

TEST(LlamaConfigTest, ParsesLlama2ConfigAsThe7bPreset) {
  auto parsed = ParseHfConfig(kLlama2_7b, "config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto preset = LlamaPreset("7b");
  ASSERT_TRUE(preset.ok());
  LlamaConfig want = *preset;
  want.bos_token_id = 1;
  want.eos_token_id = 2;
  EXPECT_EQ(*parsed, want) << LlamaConfigToString(*parsed);
}

TEST(LlamaConfigTest, WriteThenReadRoundTripsRandomConfigs) {
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 20; ++i) {
    LlamaConfig c;
    c.n_kv_heads = 1 + int64_t(rng() % 4);
    c.n_heads = c.n_kv_heads * (1 + int64_t(rng() % 4));
    c.dim = c.n_heads * 2 * (1 + int64_t(rng() % 64));
    c.n_layers = 1 + int64_t(rng() % 40);
    c.ffn_dim = 1 + int64_t(rng() % 20000);
    c.vocab_size = 2 + int64_t(rng() % 200000);
    c.max_seq_len = 1 + int64_t(rng() % 100000);
    c.norm_eps = std::ldexp(1.0 + double(rng() % 1000) / 1000.0, -int(rng() % 30));
    c.rope_theta = 1000.0 + double(rng() % 1000000) + 0.25;
    c.bos_token_id = int64_t(rng() % 2) ? 0 : -1;
    c.eos_token_id = int64_t(rng() % c.vocab_size);
    const std::string path = TmpPath("config_" + std::to_string(i) + ".json");
    ASSERT_TRUE(WriteHfConfig(c, path).ok());
    auto back = ReadHfConfig(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c) << LlamaConfigToString(c) << " vs " << LlamaConfigToString(*back);
  }
}

// Each bad file is refused with the file, the field, what was expected and what was found.
TEST(LlamaConfigTest, BadConfigsNameFileFieldExpectedAndFound) {
  struct Case {
    std::string json;
    std::vector<std::string> want;
  };
  const std::string base = R"("hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100)";
  const std::vector<Case> cases = {
      {R"({"intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})",
       {"'hidden_size'", "expected an integer", "field missing"}},
      {"{" + base + R"(, "num_key_value_heads": "four"})", {"'num_key_value_heads'", "\"four\""}},
      {"{" + base + R"(, "num_key_value_heads": 3})", {"'num_key_value_heads'", "divisor", "found 3"}},
      {"{" + base + R"(, "tie_word_embeddings": true})", {"'tie_word_embeddings'", "expected false", "found true"}},
      {"{" + base + R"(, "model_type": "mistral"})", {"'model_type'", "\"llama\"", "\"mistral\""}},
      {"{" + base + R"(, "hidden_act": "gelu"})", {"'hidden_act'", "\"silu\"", "\"gelu\""}},
      {"{" + base + R"(, "rope_scaling": {"type": "linear", "factor": 2.0}})", {"'rope_scaling'", "null"}},
      {"{" + base + R"(, "head_dim": 128})", {"'head_dim'", "= 64", "found 128"}},
      {"{" + base + R"(, "rms_norm_eps": -1})", {"'rms_norm_eps'", "positive", "found -1"}},
      {"{" + base + R"(, "eos_token_id": 100})", {"'eos_token_id'", "below vocab_size (100)", "found 100"}},
      {R"({"hidden_size": 2.5, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100})", {"'hidden_size'", "found 2.5"}},
      {R"({"hidden_size": 0, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100})", {"'hidden_size'", ">= 1", "found 0"}},
      {"[1, 2]", {"JSON object", "[1,2]"}},
      {"{\"hidden_size\": 12", {"not valid JSON"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = TmpPath("bad_" + std::to_string(i) + ".json");
    ASSERT_TRUE(WriteFileAtomic(path, cases[i].json).ok());
    auto c = ReadHfConfig(path);
    ASSERT_FALSE(c.ok()) << cases[i].json;
    const std::string msg(c.status().message());
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const std::string& w : cases[i].want) EXPECT_NE(msg.find(w), std::string::npos) << w << " in: " << msg;
  }
  auto missing = ReadHfConfig(TmpPath("nope/config.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope/config.json"), std::string::npos);
}

TEST(LlamaConfigTest, ValidateNamesTheBrokenRelation) {
  LlamaConfig c = *LlamaPreset("tiny");
  c.n_heads = 4;
  c.n_kv_heads = 3;
  absl::Status s = ValidateLlamaConfig(c);
  EXPECT_NE(s.message().find("n_heads (4) must be divisible by n_kv_heads (3)"), std::string::npos) << s;
  c = *LlamaPreset("tiny");
  c.n_heads = 4;
  c.dim = 130;
  s = ValidateLlamaConfig(c);
  EXPECT_NE(s.message().find("dim (130)"), std::string::npos) << s;
  c = *LlamaPreset("tiny");
  c.vocab_size = 0;
  EXPECT_FALSE(HfConfigJson(c).ok());
}

}  // namespace
}  // namespace sg::trainer
