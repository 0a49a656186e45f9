#include "trainer/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sg::trainer {

absl::StatusOr<FaultPlan> FaultPlan::Parse(absl::string_view spec) {
  FaultPlan plan;
  if (spec.empty()) return plan;
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--inject_fault: expected <kill_in_step|stop_in_step|sleep_in_step|kill_in_save>:<rank>:<step>, found '",
        spec, "'"));
  };
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &plan.rank) || !absl::SimpleAtoi(parts[2], &plan.step) ||
      plan.rank < 0 || plan.step < 1) {
    return bad();
  }
  if (parts[0] == "kill_in_step") {
    plan.kind = Kind::kKillInStep;
  } else if (parts[0] == "stop_in_step") {
    plan.kind = Kind::kStopInStep;
  } else if (parts[0] == "sleep_in_step") {
    plan.kind = Kind::kSleepInStep;
  } else if (parts[0] == "kill_in_save") {
    plan.kind = Kind::kKillInSave;
  } else {
    return bad();
  }
  const char* restart = std::getenv("SG_RESTART_COUNT");
  plan.first_attempt = restart == nullptr || std::string(restart) == "0";
  return plan;
}

bool FaultPlan::Applies(Kind k, int r, int64_t s) const {
  return first_attempt && kind == k && rank == r && step == s;
}

void ArmStepFault(const FaultPlan& plan, absl::Duration delay) {
  const int sig = plan.kind == FaultPlan::Kind::kStopInStep ? SIGSTOP : SIGKILL;
  std::fprintf(stderr, "inject_fault: rank %d sends itself %s %.0f ms into step %ld\n", plan.rank,
               sig == SIGSTOP ? "SIGSTOP" : "SIGKILL", absl::ToDoubleMilliseconds(delay), long(plan.step));
  std::fflush(stderr);
  std::thread([sig, delay] {
    absl::SleepFor(delay);
    ::kill(::getpid(), sig);
  }).detach();
}

void StallNow(const FaultPlan& plan) {
  std::fprintf(stderr, "inject_fault: rank %d stalls before step %ld (heartbeat on)\n", plan.rank, long(plan.step));
  std::fflush(stderr);
  absl::SleepFor(absl::Minutes(10));
}

void KillSelfNow(absl::string_view why) {
  std::fprintf(stderr, "inject_fault: SIGKILL %s\n", std::string(why).c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  std::_Exit(137);  // not reached
}

}  // namespace sg::trainer
