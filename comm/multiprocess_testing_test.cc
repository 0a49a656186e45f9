// The multi-process harness's store: served by the parent on a port that is bound before the workers
// start (no window in which a test running in parallel can take it), and private to its run (jobs
// started at the same time never join each other's store).
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "comm/socket.h"
#include "gtest/gtest.h"

namespace sg::comm {
namespace {

// Every worker: the store's port is already taken when it starts (by the parent's server), the
// store answers with the run's secret, and the world all-reduces.
TEST(Workers, DISABLED_StorePortHeldFromTheStart) {
  const int port = int(testing::EnvInt("MASTER_PORT", 0));
  ASSERT_GT(port, 0);
  absl::StatusOr<Fd> squat = ListenTcp("127.0.0.1", port, nullptr);
  EXPECT_FALSE(squat.ok()) << "port " << port << " was free when rank " << testing::EnvInt("RANK", -1)
                           << " started: another job could have taken it";
  const char* secret = std::getenv("SG_STORE_SECRET");
  ASSERT_NE(secret, nullptr);
  EXPECT_GE(std::string(secret).size(), 32u);
  auto w = testing::MakeWorkerWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  float x = float(w->rank + 1);
  ASSERT_TRUE(w->world->AllReduce(TensorView(&x, DType::kF32, {1}, Device::Cpu()), ReduceOp::kSum).ok());
  EXPECT_EQ(x, float(w->size * (w->size + 1) / 2));
  EXPECT_TRUE(w->rdzv->Finalize(absl::Now() + absl::Seconds(20)).ok());
}

TEST(RunWorkersTest, StorePortIsHeldBeforeWorkersStart) {
  testing::WorkerRun run = testing::RunWorkers(3, "Workers.DISABLED_StorePortHeldFromTheStart", {}, absl::Seconds(40));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
}

// Each rank claims the store's "job" key for its own job: a rank that found another job's id there
// joined the wrong store.
TEST(Workers, DISABLED_ClaimTheStore) {
  const char* env_job = std::getenv("SG_TEST_JOB");
  ASSERT_NE(env_job, nullptr);
  const std::string job = env_job;
  auto w = testing::MakeWorkerWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::string> owner =
      w->rdzv->store().CompareAndSet("job", "", job, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(*owner, job) << "rank " << w->rank << " of job " << job << " joined job " << *owner << "'s store";
  ASSERT_TRUE(w->world->Barrier().ok());
  EXPECT_TRUE(w->rdzv->Finalize(absl::Now() + absl::Seconds(20)).ok());
}

TEST(RunWorkersTest, ConcurrentRunsKeepTheirOwnStores) {
  constexpr int kJobs = 4;
  std::vector<testing::WorkerRun> runs(kJobs);
  std::vector<std::thread> threads;
  for (int j = 0; j < kJobs; ++j) {
    threads.emplace_back([&runs, j] {
      runs[size_t(j)] = testing::RunWorkers(2, "Workers.DISABLED_ClaimTheStore", {absl::StrCat("SG_TEST_JOB=", j)},
                                            absl::Seconds(60));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int j = 0; j < kJobs; ++j) EXPECT_TRUE(runs[size_t(j)].AllPassed()) << "job " << j << "\n" << runs[size_t(j)].Summary();
}

}  // namespace
}  // namespace sg::comm
