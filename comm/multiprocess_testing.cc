#include "comm/multiprocess_testing.h"

#include <unistd.h>

#include <climits>
#include <cmath>
#include <random>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/process_supervisor.h"
#include "gtest/gtest.h"
#include "kernels/core/dtype.h"
#include "kernels/core/status.h"

namespace sg::comm::testing {

bool WorkerRun::AllPassed() const {
  if (timed_out || exit_codes.empty()) return false;
  for (size_t i = 0; i < exit_codes.size(); ++i) {
    if (exit_codes[i] != 0) return false;
    if (outputs[i].find("[  PASSED  ] 1 test.") == std::string::npos) return false;
  }
  return true;
}

std::string WorkerRun::Summary() const {
  std::string s = timed_out ? "workers timed out\n" : "";
  for (size_t i = 0; i < exit_codes.size(); ++i) {
    absl::StrAppend(&s, "---- rank ", i, " exit code ", exit_codes[i], " ----\n", outputs[i]);
  }
  return s;
}

namespace {

// 128 random bits as hex: each run's store secret.
std::string RandomSecret() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&s, absl::Hex(rd(), absl::kZeroPad8));
  return s;
}

}  // namespace

WorkerRun RunWorkers(int n, const std::string& test, const std::vector<std::string>& env,
                     absl::Duration timeout, bool stop_all_on_failure) {
  WorkerRun run;
  char self[PATH_MAX];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    run.outputs.push_back("cannot find this binary");
    run.exit_codes.push_back(-1);
    return run;
  }
  self[len] = '\0';
  // The store is served from here on a port the kernel picks and that stays bound until every
  // worker is gone: a port picked free and bound later by rank 0 could be taken in between by a
  // test running in parallel (rank 0 then failed with "address in use" while the other ranks
  // joined that test's store and mixed the two jobs). A secret of its own per run keeps any other
  // job's ranks out of it.
  std::string secret = RandomSecret();
  for (const std::string& e : env) {
    if (absl::StartsWith(e, "SG_STORE_SECRET=")) secret = e.substr(16);
  }
  StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.secret = secret;
  absl::StatusOr<std::unique_ptr<StoreServer>> store = StoreServer::Start(so);
  if (!store.ok()) {
    run.outputs.push_back(absl::StrCat("cannot start the workers' store: ", store.status().message()));
    run.exit_codes.push_back(-1);
    return run;
  }
  // The children must not write the parent's XML report or inherit its sharding.
  std::vector<std::string> base = CurrentEnvironment(
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SG_STORE_EXTERNAL", "SG_STORE_SECRET",
       "SG_STORE_BIND_ADDR", "XML_OUTPUT_FILE", "GTEST_OUTPUT", "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS",
       "GTEST_SHARD_STATUS_FILE", "TEST_SHARD_STATUS_FILE", "TEST_PREMATURE_EXIT_FILE", "GTEST_FILTER"});
  std::vector<ProcessSpec> specs;
  for (int r = 0; r < n; ++r) {
    ProcessSpec spec;
    spec.argv = {self, "--gtest_also_run_disabled_tests", "--gtest_filter=" + test};
    spec.env = base;
    spec.env.push_back(absl::StrCat("RANK=", r));
    spec.env.push_back(absl::StrCat("WORLD_SIZE=", n));
    spec.env.push_back(absl::StrCat("LOCAL_RANK=", r));
    spec.env.push_back("MASTER_ADDR=127.0.0.1");
    spec.env.push_back(absl::StrCat("MASTER_PORT=", (*store)->port()));
    spec.env.push_back("SG_STORE_EXTERNAL=1");
    spec.env.push_back(absl::StrCat("SG_STORE_SECRET=", secret));
    for (const auto& e : env) spec.env.push_back(e);
    specs.push_back(std::move(spec));
  }
  run.outputs.assign(size_t(n), "");
  SupervisorOptions opt;
  opt.on_line = [&](int i, absl::string_view line) { run.outputs[size_t(i)].append(line.data(), line.size()); };
  opt.deadline = absl::Now() + timeout;
  opt.grace = absl::Seconds(2);
  opt.stop_all_on_failure = stop_all_on_failure;
  // A worker's failure should not kill the others: tests check every rank's own verdict. The
  // supervisor stops all on the first nonzero exit, so tests that expect one use exit code 0 for
  // "behaved as expected".
  absl::StatusOr<SupervisedResult> r = RunSupervised(specs, opt);
  if (!r.ok()) {
    run.outputs[0] += std::string(r.status().message());
    run.exit_codes.assign(size_t(n), -1);
    return run;
  }
  run.exit_codes = r->exit_codes;
  run.timed_out = r->timed_out;
  return run;
}

absl::StatusOr<WorkerWorld> MakeWorkerWorld(ProcessGroupOptions options) {
  WorkerWorld w;
  SG_ASSIGN_OR_RETURN(RankInfo info, RankInfoFromEnv());
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  SG_ASSIGN_OR_RETURN(w.rdzv, Rendezvous::Create(info, deadline));
  SG_ASSIGN_OR_RETURN(w.ucx, UcxTransport::Create(w.rdzv->store(), "test", info.rank,
                                                  info.world_size, deadline));
  SG_ASSIGN_OR_RETURN(w.world, ProcessGroup::Create(&w.rdzv->store(), w.ucx.get(), nullptr, "world",
                                                    options));
  w.rank = info.rank;
  w.size = info.world_size;
  return w;
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoll(v);
}

std::vector<double> RankInput(int64_t seed, int c, int r, int64_t n, DType dtype) {
  std::mt19937_64 rng(uint64_t(seed) * 7919 + uint64_t(c) * 131 + uint64_t(r));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const float f = u(rng);
    x = dtype == DType::kBF16 ? BFloat16::FromFloat(f).ToFloat() : f;
  }
  return v;
}

void ExpectCollectiveNear(const std::vector<double>& got, const std::vector<double>& want, DType dtype, int n,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = dtype == DType::kF32 ? 1e-5 * n : std::ldexp(1.0, -7) * n;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      ++bad;
    }
  }
}

}  // namespace sg::comm::testing
