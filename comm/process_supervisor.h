// Runs a set of local processes (the ranks of a job), streams their output line by line, and stops
// all of them when one fails: SIGTERM to each process group, SIGKILL after a grace period. Used by
// the `launch` binary and by the multi-process tests.
//
//   std::vector<ProcessSpec> specs = ...;          // argv + full environment per rank
//   SupervisorOptions opt;
//   opt.on_line = [](int rank, absl::string_view line) { std::cout << "[rank " << rank << "] " << line; };
//   SG_ASSIGN_OR_RETURN(SupervisedResult r, RunSupervised(specs, opt));  // r.exit_code
#ifndef SGTRAIN_COMM_PROCESS_SUPERVISOR_H_
#define SGTRAIN_COMM_PROCESS_SUPERVISOR_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sg::comm {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> env;   // the complete environment, "NAME=value"
};

struct SupervisorOptions {
  // Called with each line (including its '\n', if any) that a process writes to stdout or stderr.
  std::function<void(int index, absl::string_view line)> on_line;
  // After the first failure, the others get SIGTERM, then SIGKILL once this has passed.
  absl::Duration grace = absl::Seconds(5);
  // Everything still running at the deadline is stopped the same way; the result says so.
  absl::Time deadline = absl::InfiniteFuture();
  // Polled every ~50 ms; when it returns true every process is stopped the same way (the launcher
  // sets it from SIGINT/SIGTERM).
  std::function<bool()> stop_requested;
  // Whether the first failure stops the others. Off for fault-injection tests, where a rank is
  // killed on purpose and the survivors must keep running to report it.
  bool stop_all_on_failure = true;
};

struct SupervisedResult {
  // Per process: its exit status, or 128 + signal number when a signal ended it.
  std::vector<int> exit_codes;
  // The process whose failure ended the job (-1 when none failed), and its exit code (0 when none
  // failed): the first to fail, except that one ended by a signal this supervisor did not send
  // (SIGKILL from outside, a crash) takes over from processes that exited with an error, which
  // usually react to it and may be reaped first.
  int first_failed = -1;
  int exit_code = 0;
  bool timed_out = false;
};

// Starts every process, supervises them until all have exited. An error only when a process could
// not be started (the others are stopped first).
absl::StatusOr<SupervisedResult> RunSupervised(const std::vector<ProcessSpec>& specs,
                                               const SupervisorOptions& options);

// The current process environment as "NAME=value" strings, minus the variables named in `drop`.
std::vector<std::string> CurrentEnvironment(const std::vector<std::string>& drop);

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_PROCESS_SUPERVISOR_H_
