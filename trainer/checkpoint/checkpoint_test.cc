#include "trainer/checkpoint/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/io/file_io.h"
#include "trainer/safetensors/hf_llama_names.h"

namespace sg::trainer {
namespace {

namespace fs = std::filesystem;

std::string TmpPath(const std::string& name) { return JoinPath(std::getenv("TEST_TMPDIR"), name); }

LlamaConfig SmallConfig(int64_t dim = 32) {
  LlamaConfig c;
  c.dim = dim;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 48;
  c.vocab_size = 40;
  c.max_seq_len = 16;
  return c;
}

// Model and AdamW-like optimizer state for `c`, with fresh random values.
struct State {
  std::vector<NamedTensor> model, optimizer;
};
State RandomState(const LlamaConfig& c, DType dtype = DType::kF32) {
  State s;
  for (const HfParameter& p : HfLlamaParameters(c)) {
    s.model.push_back({p.name, testing::RandomTensor(p.shape, dtype, Device::Cpu(), testing::Rng())});
    s.optimizer.push_back({p.name + ".exp_avg", testing::RandomTensor(p.shape, DType::kF32, Device::Cpu(), testing::Rng())});
    s.optimizer.push_back({p.name + ".exp_avg_sq", testing::RandomTensor(p.shape, DType::kF32, Device::Cpu(), testing::Rng())});
  }
  return s;
}

std::vector<NamedTensorView> Views(const std::vector<NamedTensor>& ts) {
  std::vector<NamedTensorView> v;
  for (const NamedTensor& t : ts) v.push_back({t.name, t.tensor.view()});
  return v;
}

CheckpointContents Contents(const LlamaConfig& c, const State& s, int64_t step) {
  CheckpointContents cc;
  cc.config = c;
  cc.model = Views(s.model);
  cc.optimizer = Views(s.optimizer);
  cc.state.step = step;
  cc.state.data = {3, 1234};
  cc.state.rng = "12345 67890 " + std::to_string(step);
  cc.state.world_size = 2;
  cc.state.extra = {{"loss", "2.5"}};
  return cc;
}

void ExpectSameTensors(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  std::map<std::string, const Tensor*> by_name;
  for (const NamedTensor& t : got) by_name[t.name] = &t.tensor;
  for (const NamedTensor& w : want) {
    ASSERT_TRUE(by_name.count(w.name)) << w.name;
    const Tensor& g = *by_name[w.name];
    ASSERT_EQ(g.dtype(), w.tensor.dtype());
    ASSERT_EQ(g.shape(), w.tensor.shape());
    EXPECT_EQ(std::memcmp(g.view().raw(), w.tensor.view().raw(), size_t(g.nbytes())), 0) << w.name;
  }
}

TEST(CheckpointTest, SaveLoadRoundTripsEverything) {
  const LlamaConfig c = SmallConfig();
  const State s = RandomState(c, DType::kBF16);
  CheckpointContents cc = Contents(c, s, 700);
  ASSERT_TRUE(WriteFileAtomic(TmpPath("tok.model"), "tokenizer bytes").ok());
  cc.extra_files = {{"tokenizer.model", TmpPath("tok.model")}};
  cc.torch_dtype = "bfloat16";
  const std::string dir = TmpPath("ckpt_rt");
  ASSERT_TRUE(SaveCheckpoint(dir, cc).ok());
  auto ck = LoadCheckpoint(dir, &c);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->config, c);
  ExpectSameTensors(ck->model, s.model);
  ExpectSameTensors(ck->optimizer, s.optimizer);
  EXPECT_EQ(ck->state.step, 700);
  EXPECT_EQ(ck->state.data, (DataPosition{3, 1234}));
  EXPECT_EQ(ck->state.rng, "12345 67890 700");
  EXPECT_EQ(ck->state.world_size, 2);
  EXPECT_EQ(ck->state.extra.at("loss"), "2.5");
  ASSERT_EQ(ck->extra_files.count("tokenizer.model"), 1u);
  EXPECT_EQ(*ReadFile(ck->extra_files.at("tokenizer.model")), "tokenizer bytes");
  // transformers requires the "pt" format tag on model.safetensors.
  EXPECT_EQ(SafetensorsFile::Open(JoinPath(dir, kModelFile))->metadata().at("format"), "pt");
  // The weights alone load the way a Hugging Face directory does.
  auto hf = LoadHfModel(dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ExpectSameTensors(hf->model, s.model);
}

TEST(CheckpointTest, CorruptedOrMismatchedFilesAreRefusedByName) {
  const LlamaConfig c = SmallConfig();
  const std::string dir = TmpPath("ckpt_bad");
  auto fresh = [&] {
    ASSERT_TRUE(RemoveAll(dir).ok());
    ASSERT_TRUE(SaveCheckpoint(dir, Contents(c, RandomState(c), 5)).ok());
  };
  auto expect_refused = [&](const std::vector<std::string>& want, const LlamaConfig* expected = nullptr) {
    auto ck = LoadCheckpoint(dir, expected);
    ASSERT_FALSE(ck.ok());
    for (const std::string& w : want) EXPECT_NE(ck.status().message().find(w), std::string::npos) << w << " in " << ck.status();
  };

  fresh();  // flip one byte in the middle of the weights
  std::string bytes = *ReadFile(JoinPath(dir, kModelFile));
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kModelFile), bytes).ok());
  expect_refused({dir, "file 'model.safetensors' has content hash", "corrupted"});

  fresh();  // truncated optimizer state
  bytes = *ReadFile(JoinPath(dir, kOptimizerFile));
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kOptimizerFile), bytes.substr(0, bytes.size() - 4)).ok());
  expect_refused({"file 'optimizer.safetensors' has", "truncated"});

  fresh();
  ASSERT_TRUE(RemoveAll(JoinPath(dir, kConfigFile)).ok());
  expect_refused({"file 'config.json'", "missing"});

  fresh();  // a checkpoint of another shape than the run's config
  LlamaConfig wider = SmallConfig(64);
  expect_refused({JoinPath(dir, kConfigFile), "field 'hidden_size' is 32, the run's config expects 64"}, &wider);

  fresh();
  std::string state = *ReadFile(JoinPath(dir, kStateFile));
  state.replace(state.find("\"version\": 1"), 12, "\"version\": 9");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kStateFile), state).ok());
  expect_refused({kStateFile, "field 'version': expected 1, found 9"});

  ASSERT_TRUE(RemoveAll(dir).ok());
  auto missing = LoadCheckpoint(dir);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// A Hugging Face directory whose config.json disagrees with its weights is refused naming the tensor.
TEST(CheckpointTest, HfModelShapesAreCheckedAgainstItsConfig) {
  const LlamaConfig c = SmallConfig();
  const std::string dir = TmpPath("hf_model");
  ASSERT_TRUE(MakeDirectories(dir).ok());
  const State s = RandomState(c);
  ASSERT_TRUE(WriteSafetensors(JoinPath(dir, kModelFile), Views(s.model), {{"format", "pt"}}).ok());
  LlamaConfig mha = c;
  mha.n_kv_heads = 4;
  ASSERT_TRUE(WriteHfConfig(mha, JoinPath(dir, kConfigFile)).ok());
  auto hf = LoadHfModel(dir);
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16,32], config "
                                       "expects [32,32]"),
            std::string::npos) << hf.status();
}

TEST(CheckpointTest, SaveRefusesModelsThatDoNotMatchTheConfig) {
  const LlamaConfig c = SmallConfig();
  State s = RandomState(c);
  s.model.pop_back();  // no lm_head
  const std::string dir = TmpPath("ckpt_refused");
  absl::Status st = SaveCheckpoint(dir, Contents(c, s, 1));
  EXPECT_NE(st.message().find("missing tensor 'lm_head.weight'"), std::string::npos) << st;
  EXPECT_FALSE(fs::exists(dir));
}

// SIGKILL a process in the middle of saving over an existing checkpoint: the directory always
// loads, as the old checkpoint or (when the save finished first) the new one.
TEST(CheckpointTest, KillDuringSaveLeavesThePreviousCheckpoint) {
  const LlamaConfig c = SmallConfig(256);  // ~3 MB of weights + 6 MB of optimizer state per save
  const std::string dir = TmpPath("ckpt_kill");
  const State old_state = RandomState(c);
  ASSERT_TRUE(SaveCheckpoint(dir, Contents(c, old_state, 1)).ok());
  const State new_state = RandomState(c);
  auto& rng = testing::Rng();
  int saw_old = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      absl::Status st = SaveCheckpoint(dir, Contents(c, new_state, 2 + trial));
      _exit(st.ok() ? 0 : 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    auto ck = LoadCheckpoint(dir, &c);
    ASSERT_TRUE(ck.ok()) << "trial " << trial << ": " << ck.status();
    if (ck->state.step == 1) {
      ++saw_old;
      ExpectSameTensors(ck->model, old_state.model);
    } else {
      EXPECT_EQ(ck->state.step, 2 + trial);
      ExpectSameTensors(ck->model, new_state.model);
      ASSERT_TRUE(SaveCheckpoint(dir, Contents(c, old_state, 1)).ok());  // back to the old one
    }
  }
  std::cerr << saw_old << " of 8 kills left the previous checkpoint in place\n";
}

TEST(CheckpointTest, FindsTheLatestStepAndPrunes) {
  const std::string root = TmpPath("run");
  const LlamaConfig c = SmallConfig();
  const State s = RandomState(c);
  EXPECT_EQ(FindLatestCheckpoint(root).status().code(), absl::StatusCode::kNotFound);
  for (int64_t step : {100, 500, 300}) ASSERT_TRUE(SaveCheckpoint(StepDir(root, step), Contents(c, s, step)).ok());
  ASSERT_TRUE(MakeDirectories(JoinPath(root, "step_00000900.tmp.77")).ok());  // an interrupted save
  EXPECT_EQ(StepDir(root, 500), JoinPath(root, "step_00000500"));
  auto latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, StepDir(root, 500));
  ASSERT_TRUE(PruneCheckpoints(root, 2).ok());
  EXPECT_FALSE(fs::exists(StepDir(root, 100)));
  EXPECT_TRUE(fs::exists(StepDir(root, 300)));
  EXPECT_EQ(LoadCheckpoint(*latest)->state.step, 500);
}

}  // namespace
}  // namespace sg::trainer
