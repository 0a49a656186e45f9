// Runs the real `launch` binary on small shell programs.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace {

struct Result {
  int exit_code;
  std::string output;
};

Result Launch(const std::string& args) {
  std::string cmd = absl::StrCat("comm/launch ", args, " 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(LaunchTest, StartsRanksWithEnvironmentAndPrefixesOutput) {
  Result r = Launch("--nproc=3 --master_port=23456 -- /bin/sh -c "
                    "'echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK $MASTER_ADDR:$MASTER_PORT\"'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    std::string want = absl::StrCat("[rank ", k, "] r=", k, " w=3 l=", k, " 127.0.0.1:23456\n");
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  }
}

// Without --master_port launch serves the store itself: the port is listening before any rank runs
// (bash's /dev/tcp connects to it) and the ranks are told not to host it.
TEST(LaunchTest, ServesTheStoreWithoutAMasterPort) {
  Result r = Launch("--nproc=2 -- /bin/bash -c "
                    "'exec 3<>/dev/tcp/127.0.0.1/$MASTER_PORT && echo \"store up, external=$SG_STORE_EXTERNAL\"'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(r.output.find(absl::StrCat("[rank ", k, "] store up, external=1\n")), std::string::npos) << r.output;
  }
}

TEST(LaunchTest, OneFailingRankStopsTheOthersAndSetsTheExitCode) {
  absl::Time start = absl::Now();
  // Rank 1 fails at once; the others would sleep for a minute (and ignore nothing: SIGTERM ends
  // them). Rank 2 traps SIGTERM to test the SIGKILL after the grace period.
  Result r = Launch("--nproc=3 --grace_s=1 -- /bin/sh -c "
                    "'if [ $RANK = 1 ]; then echo failing; exit 7; fi; "
                    "if [ $RANK = 2 ]; then trap \"\" TERM; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("[rank 1] failing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with code 7"), std::string::npos) << r.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

// A rank killed from outside is the one blamed even when a peer's error exit is reaped first: rank
// 0 exits with 3 as if reacting to it, rank 1 (ignoring the launcher's SIGTERM) is SIGKILLed half
// a second later, well inside the grace period. Under load the killed rank's teardown made rank 0
// the one reported (trainer/elastic's test, 2026-12-01).
TEST(LaunchTest, ARankKilledFromOutsideIsBlamedOverAnErrorExit) {
  Result r = Launch("--nproc=2 --grace_s=5 -- /bin/sh -c "
                    "'if [ $RANK = 0 ]; then sleep 0.1; exit 3; fi; trap \"\" TERM; sleep 0.5; kill -9 $$'");
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_NE(r.output.find("launch: rank 1 exited with code 137"), std::string::npos) << r.output;
}

// Attempt 0: rank 2 fails; attempt 1 runs with 2 ranks and SG_RESTART_COUNT=1 and succeeds.
TEST(LaunchTest, MaxRestartsRestartsWithTheRemainingRanks) {
  Result r = Launch("--nproc=3 --grace_s=1 --max_restarts=2 --min_nproc=2 -- /bin/sh -c "
                    "'echo \"attempt $SG_RESTART_COUNT world $WORLD_SIZE\"; "
                    "if [ $SG_RESTART_COUNT = 0 ] && [ $RANK = 2 ]; then exit 5; fi; "
                    "if [ $SG_RESTART_COUNT = 0 ]; then sleep 60; fi'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] attempt 0 world 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting with 2 ranks (restart 1 of 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] attempt 1 world 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("attempt 1 world 3"), std::string::npos) << r.output;
}

TEST(LaunchTest, RestartsStopAtMinNprocAndMaxRestarts) {
  Result r = Launch("--nproc=2 --grace_s=1 --max_restarts=5 --min_nproc=2 -- /bin/sh -c 'exit 4'");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("cannot restart: 1 ranks would remain, --min_nproc=2"), std::string::npos) << r.output;
  r = Launch("--nproc=3 --grace_s=1 --max_restarts=1 -- /bin/sh -c 'exit 4'");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("no restarts left (--max_restarts=1)"), std::string::npos) << r.output;
}

TEST(LaunchTest, BadArgumentsAreExplained) {
  Result r = Launch("--nproc=0 -- true");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--nproc must be >= 1"), std::string::npos) << r.output;
  r = Launch("--nproc=2");
  EXPECT_NE(r.output.find("expected a program after --"), std::string::npos) << r.output;
  r = Launch("--nproc=2 true");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown argument 'true' before --"), std::string::npos) << r.output;
}

// Type errors and unknown flags are Abseil's: it names the flag and exits with 1.
TEST(LaunchTest, BadFlagValuesAndUnknownFlagsAreRejected) {
  Result r = Launch("--nproc=two -- true");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("Illegal value 'two' specified for flag 'nproc'"), std::string::npos) << r.output;
  r = Launch("--nprocs=2 -- true");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("Unknown command line flag 'nprocs'"), std::string::npos) << r.output;
}

TEST(LaunchTest, ArgumentsAfterTheSeparatorAreTheProgramsVerbatim) {
  Result r = Launch("--nproc=1 -- /bin/echo --nproc=5 --unknown -- 'two words'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] --nproc=5 --unknown -- two words\n"), std::string::npos) << r.output;
}

}  // namespace
