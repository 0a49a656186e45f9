// Per-shard trainer checkpoints in one process (the multi-rank paths run in elastic_llama_test.sh
// and fault_detection_test.sh): save, reload into a trainer with other initial weights, continue
// bit-exactly; a flipped byte is refused naming the shard; --inject_fault's spec is checked.
#include "trainer/sharded_save.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"
#include "trainer/fault_injection.h"

namespace sg::trainer {
namespace {

TrainOptions SmallOptions(uint64_t seed) {
  TrainOptions o;
  o.config.dim = 32;
  o.config.n_layers = 2;
  o.config.n_heads = 4;
  o.config.n_kv_heads = 2;
  o.config.ffn_dim = 64;
  o.config.vocab_size = 258;
  o.config.max_seq_len = 64;
  o.config.bos_token_id = ByteTokenizer::kBos;
  o.config.eos_token_id = ByteTokenizer::kEos;
  o.batch = 4;
  o.seq = 32;
  o.total_steps = 8;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup = 2;
  o.seed = seed;
  return o;
}

const TokenSplit& Tokens() {
  static const TokenSplit* split = [] {
    TextCorpus corpus = LoadDefaultCorpus().value();
    return new TokenSplit(TokenizeCorpus(corpus, ByteTokenizer(), 0.05).value());
  }();
  return *split;
}

std::string TempRoot(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string root = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  std::filesystem::remove_all(root);
  return root;
}

TEST(ShardedSaveTest, ResumeIsBitExactAndACorruptShardIsRefusedByName) {
  const uint64_t seed = testing::Rng()();
  const TrainOptions o = SmallOptions(seed);
  std::unique_ptr<Trainer> straight = Trainer::Create(o, Tokens()).value();
  std::vector<float> expected;
  for (int i = 0; i < 8; ++i) expected.push_back(float(straight->Step().value().loss));

  std::unique_ptr<Trainer> first = Trainer::Create(o, Tokens()).value();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(float(first->Step().value().loss), expected[i]);
  const std::string root = TempRoot("sharded_save");
  const std::string dir = StepDir(root, 4);
  ShardedSaveOptions so;
  so.notes = {{"loss", "1.5"}};
  ASSERT_TRUE(SaveTrainerShards(*first, dir, so, /*link=*/nullptr).ok());
  first.reset();
  EXPECT_TRUE(IsShardedCheckpoint(dir));
  EXPECT_EQ(FindLatestTrainerCheckpoint(root).value(), dir);

  absl::StatusOr<Checkpoint> state = ReadTrainerShardState(dir);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->config, o.config);
  EXPECT_EQ(state->state.step, 4);
  EXPECT_EQ(state->state.world_size, 1);
  EXPECT_EQ(state->state.extra.at("loss"), "1.5");

  // Other initial weights and seed: everything comes from the checkpoint.
  std::unique_ptr<Trainer> resumed = Trainer::Create(SmallOptions(seed + 1), Tokens()).value();
  ASSERT_TRUE(resumed->RestoreShards(dir, state->state).ok());
  EXPECT_EQ(resumed->step(), 4);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(float(resumed->Step().value().loss), expected[i]) << "step " << i + 1;

  // One flipped byte near the end of the shard (tensor data).
  const std::string shard = dir + "/shard_00000.safetensors";
  const auto size = std::filesystem::file_size(shard);
  std::FILE* f = std::fopen(shard.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fseek(f, long(size) - 7, SEEK_SET), 0);
  const int c = std::fgetc(f);
  ASSERT_EQ(std::fseek(f, long(size) - 7, SEEK_SET), 0);
  std::fputc(c ^ 0x01, f);
  std::fclose(f);
  std::unique_ptr<Trainer> refused = Trainer::Create(o, Tokens()).value();
  absl::Status s = refused->RestoreShards(dir, state->state);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shard_00000.safetensors (rank 0)"), absl::string_view::npos) << s;
}

TEST(ShardedSaveTest, PruneKeepsTheNewestAndThisAttemptsStaging) {
  const std::string root = TempRoot("sharded_prune");
  const TrainOptions o = SmallOptions(1);
  std::unique_ptr<Trainer> t = Trainer::Create(o, Tokens()).value();
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_TRUE(t->Step().ok());
    ASSERT_TRUE(SaveTrainerShards(*t, StepDir(root, step), {}, nullptr).ok());
  }
  std::filesystem::create_directories(StepDir(root, 5) + ".tmp.0");  // a save lost in attempt 0
  std::filesystem::create_directories(StepDir(root, 5) + ".tmp.1");  // this attempt's, in flight
  ASSERT_TRUE(PruneShardedCheckpoints(root, 2, "1").ok());
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(root)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000003", "step_00000004", "step_00000005.tmp.1"}));
}

TEST(FaultPlanTest, ParsesTheThreeKindsAndRefusesOthers) {
  FaultPlan p = FaultPlan::Parse("kill_in_step:2:5").value();
  EXPECT_EQ(p.kind, FaultPlan::Kind::kKillInStep);
  EXPECT_TRUE(p.Applies(FaultPlan::Kind::kKillInStep, 2, 5) == p.first_attempt);
  EXPECT_FALSE(p.Applies(FaultPlan::Kind::kKillInStep, 1, 5));
  EXPECT_FALSE(p.Applies(FaultPlan::Kind::kKillInSave, 2, 5));
  EXPECT_EQ(FaultPlan::Parse("stop_in_step:0:1").value().kind, FaultPlan::Kind::kStopInStep);
  EXPECT_EQ(FaultPlan::Parse("sleep_in_step:1:3").value().kind, FaultPlan::Kind::kSleepInStep);
  EXPECT_EQ(FaultPlan::Parse("kill_in_save:3:4").value().kind, FaultPlan::Kind::kKillInSave);
  EXPECT_EQ(FaultPlan::Parse("").value().kind, FaultPlan::Kind::kNone);
  for (const char* bad : {"kill", "kill_in_step:2", "explode:1:2", "kill_in_step:x:2", "kill_in_step:1:0"}) {
    absl::StatusOr<FaultPlan> r = FaultPlan::Parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("expected <kill_in_step|stop_in_step|sleep_in_step|kill_in_save>"),
              absl::string_view::npos);
  }
}

}  // namespace
}  // namespace sg::trainer
