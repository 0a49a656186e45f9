#include "trainer/safetensors/hf_llama_names.h"

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string TmpPath(const std::string& name) {
  return JoinPath(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", name);
}

LlamaConfig SmallGqa() {
  LlamaConfig c;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.ffn_dim = 96;
  c.vocab_size = 50;
  c.max_seq_len = 32;
  return c;
}

// Names and shapes written out by hand from transformers' LlamaForCausalLM state_dict for layer 1.
TEST(HfLlamaNamesTest, NamesAndShapesFollowTransformers) {
  const LlamaConfig c = SmallGqa();
  const std::vector<HfParameter> params = HfLlamaParameters(c);
  ASSERT_EQ(params.size(), 1u + 9u * 2u + 2u);
  EXPECT_EQ(params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(params.front().shape, (Shape{50, 64}));
  EXPECT_EQ(params.back().name, "lm_head.weight");
  EXPECT_EQ(params.back().shape, (Shape{50, 64}));
  EXPECT_EQ(params[params.size() - 2].name, "model.norm.weight");
  const std::vector<std::pair<std::string, Shape>> layer1 = {
      {"model.layers.1.input_layernorm.weight", {64}},
      {"model.layers.1.self_attn.q_proj.weight", {64, 64}},
      {"model.layers.1.self_attn.k_proj.weight", {16, 64}},  // 2 kv heads x head_dim 8
      {"model.layers.1.self_attn.v_proj.weight", {16, 64}},
      {"model.layers.1.self_attn.o_proj.weight", {64, 64}},
      {"model.layers.1.post_attention_layernorm.weight", {64}},
      {"model.layers.1.mlp.gate_proj.weight", {96, 64}},
      {"model.layers.1.mlp.up_proj.weight", {96, 64}},
      {"model.layers.1.mlp.down_proj.weight", {64, 96}},
  };
  for (size_t i = 0; i < layer1.size(); ++i) {
    EXPECT_EQ(params[10 + i].name, layer1[i].first);
    EXPECT_EQ(params[10 + i].shape, layer1[i].second) << layer1[i].first;
  }
}

TEST(HfLlamaNamesTest, ShapesAddUpToParameterCountForEveryPreset) {
  for (const std::string& name : LlamaPresetNames()) {
    const LlamaConfig c = *LlamaPreset(name);
    int64_t total = 0;
    for (const HfParameter& p : HfLlamaParameters(c)) total += NumElements(p.shape);
    EXPECT_EQ(total, ParameterCount(c)) << name;
  }
}

TEST(HfLlamaNamesTest, CheckAcceptsAMatchingFileAndNamesTheMismatch) {
  const LlamaConfig c = SmallGqa();
  std::vector<NamedTensor> tensors;
  std::vector<NamedTensorView> views;
  for (const HfParameter& p : HfLlamaParameters(c)) {
    tensors.push_back({p.name, testing::RandomTensor(p.shape, DType::kBF16, Device::Cpu(), testing::Rng())});
  }
  for (const NamedTensor& t : tensors) views.push_back({t.name, t.tensor.view()});
  const std::string path = TmpPath("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, views, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(CheckHfLlamaTensors(TensorShapes(*f), c, path).ok());

  LlamaConfig other = c;
  other.n_kv_heads = 4;  // k/v become [32, 64]
  absl::Status s = CheckHfLlamaTensors(TensorShapes(*f), other, path);
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16,64], config expects [32,64]"),
            std::string::npos) << s;

  auto shapes = TensorShapes(tensors);
  shapes.erase(shapes.begin() + 3);
  s = CheckHfLlamaTensors(shapes, c, "ckpt");
  EXPECT_NE(s.message().find("missing tensor 'model.layers.0.self_attn.k_proj.weight' (config expects shape [16,64])"),
            std::string::npos) << s;

  shapes = TensorShapes(tensors);
  shapes.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {4}});  // ignored
  EXPECT_TRUE(CheckHfLlamaTensors(shapes, c, "ckpt").ok());
  shapes.push_back({"model.layers.2.mlp.up_proj.weight", {96, 64}});
  s = CheckHfLlamaTensors(shapes, c, "ckpt");
  EXPECT_NE(s.message().find("unexpected tensor 'model.layers.2.mlp.up_proj.weight'"), std::string::npos) << s;
}

}  // namespace
}  // namespace sg::trainer
