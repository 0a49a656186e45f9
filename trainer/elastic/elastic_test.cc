// Elastic recovery end to end, with real processes: the launcher runs the toy trainer on 4 ranks,
// rank 2 is SIGKILLed in the middle of step 13, the launcher stops the survivors and restarts with
// 3 ranks, which reload step 10 (resharded 4 -> 3) and train to step 30. The final state must
// equal the single-process reference bit for bit and an uninterrupted 3-rank run from the same
// checkpoint; the loss curve must continue where it left off.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/sharded.h"
#include "trainer/elastic/toy_model.h"

namespace sg::trainer {
namespace {

constexpr int64_t kSteps = 30, kSize = 1000, kSamples = 24;

struct Result {
  int exit_code;
  std::string output;
};

Result RunCommand(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  Result r{-1, ""};
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Launch(int nproc, const std::string& launch_flags, const std::string& dir,
                   const std::string& trainer_flags) {
  return absl::StrCat("comm/launch --nproc=", nproc, " --grace_s=2 ", launch_flags,
                      " -- trainer/elastic/toy_trainer --ckpt_dir=", dir, " --steps=", kSteps,
                      " --every=5 --size=", kSize, " --samples=", kSamples, " ", trainer_flags);
}

std::string TempRoot(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string root = std::string(t ? t : "/tmp") + "/elastic_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  return root;
}

std::vector<float> LoadState(const std::string& dir) {
  auto spec = sharding::TensorSpec::Create(sharding::DeviceMesh::Parse("1").value(),
                                           {sharding::Placement::Replicate()}, {kSize});
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto got = LoadShards(dir, 0, {{"P", *spec}});
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return {};
  const float* p = (*got)[0].tensor.data<float>();
  return std::vector<float>(p, p + kSize);
}

// "[rank 0] step T loss X" lines, split into the attempts before and after "resumed from".
std::vector<std::map<int64_t, double>> LossesByAttempt(const std::string& out) {
  std::vector<std::map<int64_t, double>> attempts(1);
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("[rank 0] resumed from step") != std::string::npos) attempts.emplace_back();
    int64_t step;
    double loss;
    if (std::sscanf(line.c_str(), "[rank 0] step %ld loss %lf", &step, &loss) == 2) {
      attempts.back()[step] = loss;
    }
  }
  return attempts;
}

double ReferenceLoss(int64_t step) {
  std::vector<float> p = ToyExpectedState(step, kSize, kSamples);
  double s = 0;
  for (float x : p) s += double(x) * x;
  return s / kSize;
}

TEST(ElasticTest, KilledRankRestartsWithThreeFromLastCheckpointAndMatchesReference) {
  const std::string root = TempRoot("run");
  Result r = RunCommand(Launch(4, "--max_restarts=1 --min_nproc=2", root, "--kill_rank=2 --kill_step=13"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("launch: rank 2 exited with code 137"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launch: restarting with 3 ranks (restart 1 of 1)"), std::string::npos) << r.output;
  // The newest checkpoint before the kill was step 10; nothing checkpointed is lost.
  EXPECT_NE(r.output.find("[rank 0] resumed from step 10 on 3 ranks (saved on 4, restart 1)"),
            std::string::npos) << r.output;
  auto m10 = ReadShardedManifest(StepDir(root, 10));
  ASSERT_TRUE(m10.ok()) << m10.status();
  EXPECT_EQ(m10->extra.at("restart"), "0");
  EXPECT_EQ(m10->mesh.size(), 4);

  // Final state: bit for bit the single-process reference.
  auto latest = FindLatestShardedCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, StepDir(root, kSteps));
  std::vector<float> want = ToyExpectedState(kSteps, kSize, kSamples);
  std::vector<float> got = LoadState(*latest);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);

  // The loss curve: attempt 0 covers 1..11 or 12 (13 died mid-step), attempt 1 redoes 11.. and
  // continues to 30 with the same values for the redone steps.
  auto attempts = LossesByAttempt(r.output);
  ASSERT_EQ(attempts.size(), 2u) << r.output;
  EXPECT_EQ(attempts[0].count(13), 0u) << r.output;
  // Rank 2 inside step 13 means every rank finished step 11 (rank 0 may or may not have printed
  // step 12 before it was stopped).
  for (int64_t t = 1; t <= 11; ++t) EXPECT_EQ(attempts[0].count(t), 1u) << "step " << t;
  EXPECT_EQ(attempts[1].begin()->first, 11) << r.output;
  for (int64_t t = 11; t <= kSteps; ++t) ASSERT_EQ(attempts[1].count(t), 1u) << "step " << t;
  for (int64_t t = 11; t <= 12; ++t) {
    if (attempts[0].count(t) == 0) continue;
    EXPECT_NEAR(attempts[0][t], attempts[1][t], 1e-5 * std::abs(attempts[0][t])) << "step " << t;
  }
  for (const auto& a : attempts) {
    for (const auto& [t, loss] : a) {
      double ref = ReferenceLoss(t);
      EXPECT_NEAR(loss, ref, 1e-5 * ref) << "step " << t;
    }
  }

  // An uninterrupted 3-rank run from a copy of the same checkpoint ends in the same state.
  const std::string again = TempRoot("again");
  std::filesystem::copy(StepDir(root, 10), StepDir(again, 10), std::filesystem::copy_options::recursive);
  Result u = RunCommand(Launch(3, "", again, ""));
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_NE(u.output.find("[rank 0] resumed from step 10 on 3 ranks"), std::string::npos) << u.output;
  std::vector<float> uninterrupted = LoadState(StepDir(again, kSteps));
  ASSERT_EQ(uninterrupted.size(), got.size());
  EXPECT_EQ(std::memcmp(uninterrupted.data(), got.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace sg::trainer
