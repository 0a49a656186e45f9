// Faults the trainer injects into itself on request (--inject_fault), so the reliability tests
// exercise the real binary: a rank lost in the middle of a step, a hung rank, a straggler, a rank
// lost while a checkpoint is being saved.
//
//   SG_ASSIGN_OR_RETURN(FaultPlan plan, FaultPlan::Parse("kill_in_step:2:5"));
//   if (plan.Applies(FaultPlan::Kind::kKillInStep, rank, step)) ArmStepFault(plan, absl::Milliseconds(300));
//
// Spec "<kind>:<rank>:<step>":
//   kill_in_step  the rank SIGKILLs itself `delay` into step <step> (mid-step: the others are
//                 inside that step's collectives)
//   stop_in_step  the same with SIGSTOP: the process stays, its heartbeat stops (a hung rank)
//   sleep_in_step the rank's training thread stalls for 10 minutes before step <step> while its
//                 heartbeat goes on (a straggler: stuck in compute or I/O, not dead)
//   kill_in_save  the rank SIGKILLs itself while the checkpoint of step <step> is being saved,
//                 after writing its shard and before the checkpoint is committed
// A plan applies only in the launcher's first attempt (SG_RESTART_COUNT unset or 0), so a job
// restarted after the fault runs clean.
#ifndef SGTRAIN_TRAINER_FAULT_INJECTION_H_
#define SGTRAIN_TRAINER_FAULT_INJECTION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sg::trainer {

struct FaultPlan {
  enum class Kind { kNone, kKillInStep, kStopInStep, kSleepInStep, kKillInSave };
  Kind kind = Kind::kNone;
  int rank = -1;
  int64_t step = 0;
  bool first_attempt = true;  // from SG_RESTART_COUNT at Parse time

  // "" gives an empty plan. InvalidArgument naming the expected form otherwise.
  static absl::StatusOr<FaultPlan> Parse(absl::string_view spec);
  // Whether this plan fires as `kind` on `rank` at `step`.
  bool Applies(Kind kind, int rank, int64_t step) const;
};

// Starts a thread that, after `delay`, sends the plan's signal (SIGKILL or SIGSTOP) to this process.
void ArmStepFault(const FaultPlan& plan, absl::Duration delay);
// Stalls the calling thread for 10 minutes (sleep_in_step); the heartbeat thread goes on.
void StallNow(const FaultPlan& plan);
// SIGKILLs this process now (kill_in_save).
[[noreturn]] void KillSelfNow(absl::string_view why);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_FAULT_INJECTION_H_
