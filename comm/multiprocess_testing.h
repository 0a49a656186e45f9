// Multi-process tests on localhost: the test binary re-runs itself as N worker processes, each
// running one (DISABLED_) gtest test with the launcher's environment, and the parent checks them.
//
//   TEST(AllReduceTest, ThreeRanks) {
//     WorkerRun run = RunWorkers(3, "Workers.DISABLED_AllReduce", {"SG_X=1"}, absl::Seconds(30));
//     EXPECT_TRUE(run.AllPassed()) << run.Summary();
//   }
//   TEST(Workers, DISABLED_AllReduce) { WorkerWorld w = MakeWorkerWorld(); ... }
#ifndef SGTRAIN_COMM_MULTIPROCESS_TESTING_H_
#define SGTRAIN_COMM_MULTIPROCESS_TESTING_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/ucx_transport.h"

namespace sg::comm::testing {

struct WorkerRun {
  std::vector<int> exit_codes;
  std::vector<std::string> outputs;
  bool timed_out = false;
  // Every worker exited 0 after running exactly one test that passed.
  bool AllPassed() const;
  // Exit codes and every worker's output, for a failure message.
  std::string Summary() const;
};

// Runs `n` copies of this binary with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT and `env`
// ("NAME=value"), each running the gtest `test` (e.g. "Workers.DISABLED_Foo"). The rendezvous store
// is served by this process (SG_STORE_EXTERNAL=1: rank 0 does not host it) on a port bound before
// the workers start and kept until they are gone, with a fresh SG_STORE_SECRET (unless `env` sets
// one), so tests running in parallel can neither take each other's port nor join each other's job.
// All are stopped at `timeout`. With `stop_all_on_failure` false, a worker that dies (e.g. one
// killed on purpose) leaves the others running.
WorkerRun RunWorkers(int n, const std::string& test, const std::vector<std::string>& env,
                     absl::Duration timeout, bool stop_all_on_failure = true);

// The rendezvous, UCX transport and world group of a worker, from its environment.
struct WorkerWorld {
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<UcxTransport> ucx;
  std::unique_ptr<ProcessGroup> world;
  int rank = 0, size = 1;
};
absl::StatusOr<WorkerWorld> MakeWorkerWorld(ProcessGroupOptions options = {});

// An integer from the environment (for worker parameters), or `fallback`.
int64_t EnvInt(const char* name, int64_t fallback);

// Rank r's input for case `c` of a collective test: n values uniform in [-1, 1), rounded to
// `dtype`, as doubles; the same on every rank for the same (seed, c, r).
std::vector<double> RankInput(int64_t seed, int c, int r, int64_t n, DType dtype = DType::kF32);
// gtest failures (the first 5) where got differs from want by more than a ring over n ranks may
// round: relative 1e-5 x n in f32, 2^-7 x n in bf16 (a rounding per hop).
void ExpectCollectiveNear(const std::vector<double>& got, const std::vector<double>& want, DType dtype, int n,
                          const std::string& what);

}  // namespace sg::comm::testing

#endif  // SGTRAIN_COMM_MULTIPROCESS_TESTING_H_
