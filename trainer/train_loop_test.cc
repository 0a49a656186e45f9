#include "trainer/train_loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"
#include "trainer/model/llama_model.h"
#include "trainer/safetensors/hf_llama_names.h"

namespace sg::trainer {
namespace {

// Small enough for a few dozen steps in seconds on two cores, big enough to learn byte statistics.
LlamaConfig SmallConfig() {
  LlamaConfig c;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 64;
  c.vocab_size = 258;
  c.max_seq_len = 64;
  c.bos_token_id = ByteTokenizer::kBos;
  c.eos_token_id = ByteTokenizer::kEos;
  return c;
}

// AdamW's eps in these comparisons of two forms of the same step (1e-5, as compiler/testing's
// kCompareAdamWEps, for the same reason): at 1e-8 a weight whose gradient is at rounding level
// takes an lr-sized step whose sign follows the rounding. Gradient accumulation against the larger
// batch, seed 14206622695370858266 (2026-12-01): the losses agreed, o_proj differed 1.5e-4 after 3
// steps.
TrainOptions SmallOptions(uint64_t seed) {
  TrainOptions o;
  o.eps = 1e-5;
  o.config = SmallConfig();
  o.batch = 4;
  o.seq = 32;
  o.total_steps = 40;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup = 5;
  o.seed = seed;
  return o;
}

const TokenSplit& DefaultCorpusTokens() {
  static const TokenSplit* split = [] {
    TextCorpus corpus = LoadDefaultCorpus().value();
    return new TokenSplit(TokenizeCorpus(corpus, ByteTokenizer(), 0.05).value());
  }();
  return *split;
}

std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t != nullptr ? t : "/tmp") + "/" + name;
}

TEST(ScheduleTest, WarmupCosineAndFloor) {
  TrainOptions o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup = 10;
  o.total_steps = 110;
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(0, o), 0.1);   // 1/10 of the peak
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(9, o), 1.0);   // end of warm-up
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(10, o), 1.0);  // cosine starts at the peak
  EXPECT_NEAR(ScheduledLearningRate(60, o), 0.55, 1e-12);  // half-way: (lr + min_lr) / 2
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(110, o), 0.1);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(500, o), 0.1);
  for (int64_t s = 10; s < 110; ++s) EXPECT_GE(ScheduledLearningRate(s, o), ScheduledLearningRate(s + 1, o));
}

TEST(ModelNamesTest, EveryHfParameterMapsBothWaysAndCoversTheGraph) {
  const LlamaConfig c = SmallConfig();
  for (const HfParameter& p : HfLlamaParameters(c)) {
    absl::StatusOr<std::string> g = GraphParameterName(p.name);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(HfParameterName(*g).value(), p.name);
  }
  EXPECT_EQ(GraphParameterName("model.layers.0.self_attn.q_proj.weight").value(), "layers.0.attention.wq.weight");
  EXPECT_EQ(GraphParameterName("model.layers.1.mlp.up_proj.weight").value(), "layers.1.feed_forward.w3.weight");
  EXPECT_FALSE(GraphParameterName("model.layers.x.mlp.up_proj.weight").ok());
  EXPECT_FALSE(HfParameterName("layers.0.attention.wz.weight").ok());

  std::unique_ptr<Trainer> t = Trainer::Create(SmallOptions(1), DefaultCorpusTokens()).value();
  EXPECT_EQ(t->compiled().parameter_names().size(), HfLlamaParameters(c).size());
}

TEST(TrainLoopTest, LossFallsOnTheDefaultCorpus) {
  std::unique_ptr<Trainer> t = Trainer::Create(SmallOptions(testing::Rng()()), DefaultCorpusTokens()).value();
  std::vector<double> losses;
  while (t->step() < t->options().total_steps) losses.push_back(t->Step().value().loss);
  // Uniform over 258 bytes is ln 258 = 5.55 nats; 40 small steps learn the unigram/bigram statistics.
  EXPECT_NEAR(losses.front(), std::log(258.0), 0.3);
  double tail = 0;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) tail += losses[i] / 5;
  std::cout << "first " << losses.front() << ", last five average " << tail << "\n";
  // Over 41 seeds (2026-11-30) the last five averaged up to 3.72 (SG_TEST_SEED=
  // 11719608893051603256; 3.6, the bound before, failed 4 of them): 3.9 still asks for 1.65 nats
  // learned.
  EXPECT_LT(tail, 3.9) << "first " << losses.front() << ", last five average " << tail;
  const double val = t->ValidationLoss(2).value();
  std::cout << "validation " << val << "\n";
  EXPECT_LT(val, 3.7);
}

// --precision f16 (dynamic loss scaling) trains like f32 on the same batches: the losses of the
// first 8 steps agree within 0.5% and those of all 20 within 5%, no step is skipped, and the scale
// is reported. The two runs drift apart chaotically as f16 roundings compound: over 350 seeds
// (2026-11-30) the first 8 steps differed by at most 0.066%, but later steps by up to 2.65%, and
// the 2% bound it had failed 3 seeds of 200 (SG_TEST_SEED=368786983606042567 for the whole
// binary: 2.1% at step 19, the same on the code before that day's changes). Updates 20% too
// large in the f16 run (its learning rate scaled, as a stand-in for a wrong unscale) fail the
// early bound by step 3 or 4 (5 seeds). The initial scale is 1024:
// at the default 65536 some seeds overflow this model's f16 gradients at a step and skip it (what
// dynamic loss scaling is for; f16_mixed_precision_test covers skipping), after which the two runs
// are one update apart and no longer comparable step by step.
TEST(TrainLoopTest, F16MixedPrecisionTracksF32) {
  const uint64_t seed = testing::Rng()();
  TrainOptions o32 = SmallOptions(seed), o16 = SmallOptions(seed);
  o32.total_steps = o16.total_steps = 20;
  o16.precision = compiler::Precision::kF16Mixed;
  o16.loss_scale.initial_scale = 1024;
  std::unique_ptr<Trainer> t32 = Trainer::Create(o32, DefaultCorpusTokens()).value();
  std::unique_ptr<Trainer> t16 = Trainer::Create(o16, DefaultCorpusTokens()).value();
  while (t32->step() < o32.total_steps) {
    const StepResult a = t32->Step().value(), b = t16->Step().value();
    EXPECT_NEAR(b.loss, a.loss, (a.step <= 8 ? 0.005 : 0.05) * a.loss) << "step " << a.step;
    EXPECT_FALSE(b.skipped) << "step " << b.step;
    EXPECT_EQ(b.loss_scale, 1024.0);
    EXPECT_EQ(a.loss_scale, 1.0);
  }
}

// --grad_accum 2 with batch 2 trains like one pass over batch 4 (the same sequences): the compiled
// step accumulates the two micro-batches' gradients before one update.
TEST(TrainLoopTest, GradientAccumulationMatchesTheLargerBatch) {
  const uint64_t seed = testing::Rng()();
  TrainOptions whole = SmallOptions(seed), accum = SmallOptions(seed);
  accum.batch = 2;
  accum.grad_accum = 2;
  std::unique_ptr<Trainer> a = Trainer::Create(whole, DefaultCorpusTokens()).value();
  std::unique_ptr<Trainer> b = Trainer::Create(accum, DefaultCorpusTokens()).value();
  EXPECT_EQ(a->tokens_per_step(), b->tokens_per_step());
  for (int i = 0; i < 3; ++i) {
    const double la = a->Step().value().loss, lb = b->Step().value().loss;
    EXPECT_NEAR(lb, la, 1e-4 * la) << "step " << i + 1;
  }
  const std::vector<NamedTensor> wa = a->Weights().value(), wb = b->Weights().value();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_LT(testing::RelativeError(testing::ToHost(wb[i].tensor.view()), testing::ToHost(wa[i].tensor.view())), 1e-4)
        << wa[i].name;
  }
}

// TrainOptions::auto_recompute: under a budget nothing fits, the least-memory plan (full recompute)
// is chosen, and the run takes the same steps as one asked for full recompute; under a roomy budget
// no recompute. memory_plan() says which and what was planned against the budget.
TEST(TrainLoopTest, AutoRecomputeFitsTheBudget) {
  const uint64_t seed = testing::Rng()();
  TrainOptions tight = SmallOptions(seed), full = SmallOptions(seed), roomy = SmallOptions(seed);
  tight.auto_recompute = true;
  tight.memory_budget_bytes = 1024;
  full.recompute = compiler::RecomputePolicy::kFull;
  roomy.auto_recompute = true;
  roomy.memory_budget_bytes = int64_t(1) << 34;
  std::unique_ptr<Trainer> a = Trainer::Create(tight, DefaultCorpusTokens()).value();
  std::unique_ptr<Trainer> b = Trainer::Create(full, DefaultCorpusTokens()).value();
  std::unique_ptr<Trainer> c = Trainer::Create(roomy, DefaultCorpusTokens()).value();
  EXPECT_TRUE(absl::StartsWith(a->memory_plan(), "full")) << a->memory_plan();
  EXPECT_NE(a->memory_plan().find("GiB planned of 0.00"), std::string::npos) << a->memory_plan();
  EXPECT_NE(a->memory_plan().find("may not fit"), std::string::npos) << a->memory_plan();
  EXPECT_EQ(b->memory_plan(), "full");
  EXPECT_TRUE(absl::StartsWith(c->memory_plan(), "none, ")) << c->memory_plan();
  for (int i = 0; i < 3; ++i) {
    const double la = a->Step().value().loss, lb = b->Step().value().loss;
    EXPECT_NEAR(la, lb, 1e-6 * lb) << "step " << i + 1;
  }
  // Bad budget: named.
  TrainOptions bad = SmallOptions(seed);
  bad.memory_budget_bytes = -1;
  const absl::Status st = Trainer::Create(bad, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--memory_budget_gib: expected >= 0"), std::string::npos) << st;
}

// TrainOptions::eps must be positive; fsdp_host_gradient_units is refused by name when negative,
// without FSDP, and with gradient accumulation (its runs are in two_rank_test.sh: FSDP needs a
// launcher).
TEST(TrainLoopTest, BadAdamEpsAndHostGradientUnitsAreNamed) {
  TrainOptions o = SmallOptions(testing::Rng()());
  o.eps = 0;
  absl::Status st = Trainer::Create(o, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--adam_eps: expected a positive number, found 0"), std::string::npos) << st;
  o.eps = 1e-5;
  o.fsdp_host_gradient_units = -2;
  st = Trainer::Create(o, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--fsdp_host_gradient_units: expected >= 0, found -2"), std::string::npos) << st;
  o.fsdp_host_gradient_units = 3;
  st = Trainer::Create(o, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--fsdp_host_gradient_units: expected --strategy=fsdp, found --strategy=none"),
            std::string::npos)
      << st;
  o.strategy = compiler::Strategy::kFsdp;
  o.grad_accum = 2;
  st = Trainer::Create(o, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--fsdp_host_gradient_units: expected --grad_accum=1 (the deferred AdamW takes one "
                              "pass's gradients), found --grad_accum=2"),
            std::string::npos)
      << st;
}

// TrainOptions::lm_head_chunks: the LM head in blocks of tokens trains as the whole head does (the
// same losses to f32 rounding: dW is summed over the blocks); a value below 1 is named.
TEST(TrainLoopTest, LmHeadInBlocksTrainsTheSame) {
  const uint64_t seed = testing::Rng()();
  TrainOptions whole = SmallOptions(seed), blocks = SmallOptions(seed);
  blocks.lm_head_chunks = 3;
  std::unique_ptr<Trainer> a = Trainer::Create(whole, DefaultCorpusTokens()).value();
  std::unique_ptr<Trainer> b = Trainer::Create(blocks, DefaultCorpusTokens()).value();
  int head = 0;
  for (const compiler::Step& s : b->compiled().program().schedule.steps) head += absl::StartsWith(s.name, "lm head in 3 blocks");
  EXPECT_EQ(head, 1);
  EXPECT_EQ(b->memory_plan(), "none; LM head in 3 blocks");
  for (int i = 0; i < 3; ++i) {
    const double la = a->Step().value().loss, lb = b->Step().value().loss;
    EXPECT_NEAR(lb, la, 1e-5 * la) << "step " << i + 1;
  }
  blocks.lm_head_chunks = 0;
  const absl::Status st = Trainer::Create(blocks, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--lm_head_chunks: expected >= 1, found 0"), std::string::npos) << st;
}

// TrainOptions::bf16_gradients: bf16 mixed precision with the matmul weights' gradients in bf16
// trains as with f32 gradients (the first loss equal, the next ones within bf16 rounding of the
// gradients); outside one device without accumulation it is refused naming the flag.
TEST(TrainLoopTest, Bf16GradientsTrainLikeF32Gradients) {
  const uint64_t seed = testing::Rng()();
  TrainOptions f32 = SmallOptions(seed), bf16 = SmallOptions(seed);
  f32.precision = bf16.precision = compiler::Precision::kBF16Mixed;
  bf16.bf16_gradients = true;
  std::unique_ptr<Trainer> a = Trainer::Create(f32, DefaultCorpusTokens()).value();
  std::unique_ptr<Trainer> b = Trainer::Create(bf16, DefaultCorpusTokens()).value();
  auto g = b->compiled().View("grad:layers.0.feed_forward.w1.weight");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->dtype(), DType::kBF16);
  EXPECT_EQ(a->compiled().View("grad:layers.0.feed_forward.w1.weight")->dtype(), DType::kF32);
  for (int i = 0; i < 5; ++i) {
    const double la = a->Step().value().loss, lb = b->Step().value().loss;
    if (i == 0) {
      EXPECT_EQ(lb, la);
    }
    EXPECT_NEAR(lb, la, 1e-2 * la) << "step " << i + 1;
  }
  bf16.grad_accum = 2;
  const absl::Status st = Trainer::Create(bf16, DefaultCorpusTokens()).status();
  EXPECT_NE(st.message().find("--gradients=bf16: expected --precision=bf16 with --strategy=none, fsdp or hybrid and "
                              "--grad_accum=1, found --precision=bf16 --strategy=none --grad_accum=2"),
            std::string::npos)
      << st;
}

TEST(TrainLoopTest, ResumeFromCheckpointIsBitExact) {
  const uint64_t seed = testing::Rng()();
  TrainOptions o = SmallOptions(seed);
  o.total_steps = 8;
  std::unique_ptr<Trainer> straight = Trainer::Create(o, DefaultCorpusTokens()).value();
  std::vector<float> expected;
  for (int i = 0; i < 8; ++i) expected.push_back(float(straight->Step().value().loss));

  std::unique_ptr<Trainer> first = Trainer::Create(o, DefaultCorpusTokens()).value();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(float(first->Step().value().loss), expected[i]);
  const std::string dir = TempDir("resume_ckpt");
  ASSERT_TRUE(first->Save(dir).ok());
  std::map<std::string, std::vector<char>> state;
  for (const auto& [name, v] : first->compiled().program().sources) {
    std::vector<char> bytes(v.nbytes());
    ASSERT_TRUE(CopyTensor(v, TensorView(bytes.data(), v.dtype(), v.shape(), Device::Cpu()), Stream::Cpu()).ok());
    state[name] = bytes;
  }
  first.reset();

  // A fresh trainer (other initial weights) takes everything from the checkpoint.
  TrainOptions o2 = o;
  o2.seed = seed + 1;
  std::unique_ptr<Trainer> resumed = Trainer::Create(o2, DefaultCorpusTokens()).value();
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir, &o.config);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE(resumed->Restore(*ckpt).ok());
  EXPECT_EQ(resumed->step(), 4);
  // Every piece of state the step keeps (weights, AdamW moments, step counter) is restored; the
  // inputs and the learning rate are set by the next Step().
  for (const auto& [name, v] : resumed->compiled().program().sources) {
    if (name == "tokens" || name == "targets" || name == compiler::kLrName) continue;
    std::vector<char> bytes(v.nbytes());
    ASSERT_TRUE(CopyTensor(v, TensorView(bytes.data(), v.dtype(), v.shape(), Device::Cpu()), Stream::Cpu()).ok());
    EXPECT_TRUE(bytes == state[name]) << "source " << name;
  }
  for (int i = 4; i < 8; ++i) EXPECT_EQ(float(resumed->Step().value().loss), expected[i]) << "step " << i + 1;
  const std::vector<NamedTensor> a = straight->Weights().value(), b = resumed->Weights().value();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(a[i].tensor.data<float>(), b[i].tensor.data<float>(), a[i].tensor.view().nbytes()), 0)
        << a[i].name;
  }
}

TEST(TrainLoopTest, SafetensorsRoundTripGivesIdenticalLogits) {
  TrainOptions o = SmallOptions(testing::Rng()());
  std::unique_ptr<Trainer> t = Trainer::Create(o, DefaultCorpusTokens()).value();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(t->Step().ok());
  const std::string dir = TempDir("roundtrip_ckpt");
  ASSERT_TRUE(t->Save(dir).ok());

  // The file is a Hugging Face Llama checkpoint: HF names and shapes only.
  SafetensorsFile f = SafetensorsFile::Open(dir + "/" + kModelFile).value();
  EXPECT_TRUE(CheckHfLlamaTensors(TensorShapes(f), o.config, f.path()).ok());
  EXPECT_NE(f.Find("model.layers.1.self_attn.k_proj.weight"), nullptr);

  o.seed += 7;  // different initial weights, replaced by the file's
  std::unique_ptr<Trainer> loaded = Trainer::Create(o, DefaultCorpusTokens()).value();
  ASSERT_TRUE(loaded->SetWeights(f.LoadAll().value(), f.path()).ok());

  std::mt19937_64& rng = testing::Rng();
  Tensor tokens = Tensor::Empty({2, 16}, DType::kI32, Device::Cpu()).value();
  Tensor targets = Tensor::Empty({2, 16}, DType::kI32, Device::Cpu()).value();
  for (int i = 0; i < 32; ++i) {
    tokens.data<int32_t>()[i] = int32_t(rng() % 258);
    targets.data<int32_t>()[i] = int32_t(rng() % 258);
  }
  const auto [loss_a, logits_a] = t->Forward(tokens, targets).value();
  const auto [loss_b, logits_b] = loaded->Forward(tokens, targets).value();
  EXPECT_EQ(loss_a, loss_b);
  ASSERT_EQ(logits_a.size(), size_t(2 * 16 * 258));
  EXPECT_EQ(logits_a, logits_b);
  // Not a vacuous comparison: the logits vary and the initial weights of `loaded` differed.
  EXPECT_NE(logits_a[0], logits_a[1]);
  std::unique_ptr<Trainer> fresh = Trainer::Create(o, DefaultCorpusTokens()).value();
  EXPECT_NE(fresh->Forward(tokens, targets).value().first, loss_a);
}

// The compiled forward-only path (validation, sampling) against the f64 interpreter on the same
// trained weights: the mean loss over the same validation windows, and a greedy continuation.
TEST(TrainLoopTest, ValidationAndSamplingMatchTheInterpreter) {
  TrainOptions o = SmallOptions(testing::Rng()());
  std::unique_ptr<Trainer> t = Trainer::Create(o, DefaultCorpusTokens()).value();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(t->Step().ok());
  const double val = t->ValidationLoss(2).value();

  const std::vector<int32_t>& v = *DefaultCorpusTokens().val;
  double want = 0;
  for (int64_t batch = 0; batch < 2; ++batch) {
    Tensor tokens = Tensor::Empty({o.batch, o.seq}, DType::kI32, Device::Cpu()).value();
    Tensor targets = Tensor::Empty({o.batch, o.seq}, DType::kI32, Device::Cpu()).value();
    for (int64_t r = 0; r < o.batch; ++r) {
      const int64_t start = (batch * o.batch + r) * o.seq;  // unshuffled windows, in stream order
      std::copy_n(v.begin() + start, o.seq, tokens.data<int32_t>() + r * o.seq);
      std::copy_n(v.begin() + start + 1, o.seq, targets.data<int32_t>() + r * o.seq);
    }
    want += t->Forward(tokens, targets).value().first / 2;
  }
  EXPECT_GT(want, 1.0);
  EXPECT_NEAR(val, want, 1e-4 * want);
  // After more updates the validation path sees the new weights.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(t->Step().ok());
  EXPECT_NE(t->ValidationLoss(2).value(), val);

  // Greedy sampling: each token is the argmax of the interpreter's last-position logits.
  const std::vector<int32_t> prompt = {ByteTokenizer::kBos, 'T', 'h', 'e'};
  const std::vector<int32_t> got = t->Sample(prompt, 6, /*temperature=*/0).value();
  ASSERT_EQ(got.size(), 6u);
  std::vector<int32_t> seq = prompt;
  for (int32_t next : got) {
    const int64_t len = int64_t(seq.size());
    Tensor tokens = Tensor::Empty({1, len}, DType::kI32, Device::Cpu()).value();
    Tensor targets = Tensor::Empty({1, len}, DType::kI32, Device::Cpu()).value();
    std::copy(seq.begin(), seq.end(), tokens.data<int32_t>());
    std::fill_n(targets.data<int32_t>(), len, 0);
    const std::vector<double> logits = t->Forward(tokens, targets).value().second;
    const double* last = logits.data() + (len - 1) * 258;
    const int64_t best = std::max_element(last, last + 258) - last;
    // Ties aside (f32 vs f64), the compiled path picks the same token.
    EXPECT_NEAR(last[next], last[best], 1e-4) << "after " << len << " tokens";
    seq.push_back(next);
  }
}

TEST(TrainLoopTest, WeightsOfAnotherShapeAreRefusedByName) {
  std::unique_ptr<Trainer> t = Trainer::Create(SmallOptions(1), DefaultCorpusTokens()).value();
  LlamaConfig other = SmallConfig();
  other.ffn_dim = 96;
  absl::Status s = t->SetWeights(InitialWeights(other, 1), "other.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("other.safetensors"), std::string::npos) << s;
  EXPECT_NE(s.message().find("mlp.gate_proj.weight"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[96,32]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[64,32]"), std::string::npos) << s;
}

}  // namespace
}  // namespace sg::trainer
