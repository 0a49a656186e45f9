#include "trainer/run.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

// Runs happen under runs/<name> of the working directory: use the test's temporary directory.
class RunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    dir_ = std::string(t != nullptr ? t : "/tmp") + "/run_test";
    ASSERT_TRUE(MakeDirectories(dir_).ok());
    ASSERT_EQ(chdir(dir_.c_str()), 0);
  }
  // A run small enough for a test: two layers of width 32, a few steps.
  static RunFlags Small(const std::string& name) {
    RunFlags f;
    f.name = name;
    f.hf_config = "";
    f.steps = 3;
    f.batch = 2;
    f.seq = 16;
    f.eval_batches = 1;
    f.quiet = true;
    return f;
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = dir_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(p, text).ok());
    return p;
  }
  static std::string Config(int ffn) {
    return absl::StrCat(R"({"model_type": "llama", "hidden_size": 32, "intermediate_size": )", ffn,
                        R"(, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "vocab_size": 258, "max_position_embeddings": 64, "hidden_act": "silu"})");
  }
  static void ExpectMessage(const absl::Status& s, std::initializer_list<std::string> parts) {
    ASSERT_FALSE(s.ok());
    for (const std::string& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' in " << s;
  }
  std::string dir_;
};

TEST_F(RunTest, TrainsSavesAndResumes) {
  RunFlags f = Small("resume");
  f.hf_config = Write("small.json", Config(64));
  absl::StatusOr<RunSummary> a = RunTraining(f);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->steps, 3);
  EXPECT_EQ(a->checkpoint, "runs/resume/step_00000003");
  EXPECT_TRUE(LoadCheckpoint(a->checkpoint).ok());
  EXPECT_TRUE(ReadFile("runs/resume/loss.svg").ok());
  EXPECT_TRUE(ReadFile("runs/resume/metrics.jsonl").ok());

  f.resume = "latest";
  f.steps = 5;
  absl::StatusOr<RunSummary> b = RunTraining(f);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->first_step, 3);
  EXPECT_EQ(b->steps, 5);
}

TEST_F(RunTest, BadInputsNameTheFileAndField) {
  RunFlags f = Small("bad");
  f.hf_config = dir_ + "/missing.json";
  ExpectMessage(RunTraining(f).status(), {"missing.json"});

  f.hf_config = Write("malformed.json", R"({"model_type": "llama", "hidden_size": "wide"})");
  ExpectMessage(RunTraining(f).status(), {"malformed.json", "hidden_size"});

  f.hf_config = Write("small.json", Config(64));
  f.data = {dir_ + "/no_such_corpus.txt"};
  ExpectMessage(RunTraining(f).status(), {"no_such_corpus.txt"});

  f.data = {Write("shard.bin", "not a shard")};
  ExpectMessage(RunTraining(f).status(), {"shard.bin"});

  f.data = {};
  f.tokenizer = "sentencepiece";
  f.tokenizer_model = Write("tokenizer.model", "garbage");
  ExpectMessage(RunTraining(f).status(), {"tokenizer.model"});

  f.tokenizer = "words";
  ExpectMessage(RunTraining(f).status(), {"--tokenizer", "words"});

  f.tokenizer = "bytes";
  f.resume = "latest";
  f.name = "never_ran";
  ExpectMessage(RunTraining(f).status(), {"--resume", "runs/never_ran"});
}

TEST_F(RunTest, CheckpointOfAnotherShapeIsRefused) {
  RunFlags f = Small("shape");
  f.hf_config = Write("small.json", Config(64));
  absl::StatusOr<RunSummary> a = RunTraining(f);
  ASSERT_TRUE(a.ok()) << a.status();
  f.hf_config = Write("wider.json", Config(96));
  f.resume = a->checkpoint;
  ExpectMessage(RunTraining(f).status(), {"wider.json", "ffn=64", "ffn=96"});

  // A checkpoint whose tensors disagree with its own config.json.
  ASSERT_TRUE(WriteFileAtomic(a->checkpoint + "/config.json", Config(96)).ok());
  f.hf_config = "";
  absl::Status s = RunTraining(f).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("config.json"), std::string::npos) << s;
}

}  // namespace
}  // namespace sg::trainer
