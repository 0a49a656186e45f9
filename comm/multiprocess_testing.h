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

// Runs `n` copies of this binary with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT (a free
// port) and `env` ("NAME=value"), each running the gtest `test` (e.g. "Workers.DISABLED_Foo").
// All are stopped at `timeout`.
WorkerRun RunWorkers(int n, const std::string& test, const std::vector<std::string>& env,
                     absl::Duration timeout);

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

}  // namespace sg::comm::testing

#endif  // SGTRAIN_COMM_MULTIPROCESS_TESTING_H_
