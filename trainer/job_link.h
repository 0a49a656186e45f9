// The trainer's link to the other ranks of a multi-rank job, beside the compiler's collectives:
// failure detection while training (comm/health.h), a store connection to coordinate per-shard
// checkpoint commits (trainer/sharded_save.h), and a reported stop on SIGTERM from the launcher.
//
//   JobLinkOptions o;  o.deadline = absl::Seconds(30);
//   SG_ASSIGN_OR_RETURN(auto link, JobLink::Start(o));    // after Trainer::Create (the rendezvous)
//   SG_RETURN_IF_ERROR(link->Publish("ckpt/1/rank/2", record));
//   SG_ASSIGN_OR_RETURN(std::string r, link->Await("ckpt/1/rank/0", absl::Minutes(10)));
//   SG_RETURN_IF_ERROR(link->Finish(absl::Seconds(60)));  // before a clean exit
//
// Failure detection: a HealthMonitor watches every rank's heartbeat and the progress of the
// compiler's world group. A rank that dies, hangs (SIGSTOP, a stuck process) or falls behind is
// reported by every survivor ("health: rank 2 died (process 4711 is gone; no heartbeat for 3.1s);
// it last entered all_gather #37, ranks 0,1,3 are waiting in all_gather #38 [reported by rank 1]")
// within `deadline` (+ one check interval), and the group is aborted, so the survivors' pending
// collectives fail at once with that report and the trainer exits non-zero instead of hanging.
// Only the world group is aborted: a collective on a sub-group (HYBRID_SHARD rows) still waits
// for its own deadline (CompileOptions::comm_timeout_s).
//
// Stopping on a failure (ConcludeFailure): a rank whose step failed (often because the transport
// noticed the lost peer first) or that the launcher SIGTERMs expedites the monitor (a peer on this
// host whose process is gone is named at once, HealthMonitor::Expedite) and waits up to
// deadline + 2 check intervals for its verdict, so it names the rank at fault rather than the
// transport error. When the verdict names another rank it marks itself finished, so that the
// others do not blame a rank that merely exited; it publishes its report. Rank 0, whose exit takes
// the store down, first waits (as long again) for the other survivors' reports. On SIGTERM the
// process prints "stopping on SIGTERM: <report>" and exits with 143. A rank lost on this host is
// thus reported within the launcher's default grace period whatever the deadline; a hung rank or
// one on another host takes the deadline, and the grace period (--grace_s) must exceed about
// twice the deadline for every report to appear.
//
// Keys live under "trainer/" in the job's store (rank 0 hosts it).
#ifndef SGTRAIN_TRAINER_JOB_LINK_H_
#define SGTRAIN_TRAINER_JOB_LINK_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/env.h"
#include "comm/health.h"
#include "comm/store.h"

namespace sg::trainer {

struct JobLinkOptions {
  std::string group = "compiler/world";  // the process group whose collectives are watched
  // Heartbeat silence before a rank is reported dead/hung; zero turns failure detection off.
  absl::Duration deadline = absl::Seconds(30);
  // How long a heartbeating rank may stay behind the others' newest collective.
  absl::Duration straggler_deadline = absl::Seconds(300);
  bool handle_sigterm = true;
};

class JobLink {
 public:
  // Reads the rank from the launcher's environment and connects to the job's store; collective
  // only in that every rank should start one (a rank without a monitor is reported as silent).
  static absl::StatusOr<std::unique_ptr<JobLink>> Start(const JobLinkOptions& options);
  // Stops the monitor without marking this rank finished (to the others it looks lost).
  ~JobLink();
  JobLink(const JobLink&) = delete;
  JobLink& operator=(const JobLink&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  // The launcher's attempt number (SG_RESTART_COUNT; "0" outside a restarting launcher).
  const std::string& attempt() const { return attempt_; }
  // The first rank fault the monitor saw, if any.
  std::optional<comm::RankFault> fault() const;
  // A number every rank draws in the same order (e.g. one per checkpoint save), for unique keys.
  int64_t NextSequence() { return ++sequence_; }

  absl::Status Publish(const std::string& key, const std::string& value);
  // Waits for `key`. Fails early, with the monitor's report, once a rank fault is seen;
  // DeadlineExceeded naming the key after `timeout`.
  absl::StatusOr<std::string> Await(const std::string& key, absl::Duration timeout);

  // Marks this rank finished for the monitor and the others; rank 0 (the store's host) then waits
  // for every rank to finish, so no rank loses the store before it is done with it.
  absl::Status Finish(absl::Duration timeout);
  // Before exiting on an error (see above): the monitor's report, or a line saying none was seen.
  // Runs once; later calls (the SIGTERM watcher racing the main thread) return the same text.
  std::string ConcludeFailure();

 private:
  JobLink() = default;
  void WatchSigterm();
  absl::Duration Interval() const;

  comm::RankInfo info_;
  JobLinkOptions options_;
  std::string attempt_ = "0";
  int64_t sequence_ = 0;
  std::unique_ptr<comm::StoreClient> store_;
  std::unique_ptr<comm::HealthMonitor> health_;
  absl::Mutex conclude_mu_;  // Finish and ConcludeFailure: one of them, once
  bool concluded_ = false;
  std::string conclusion_;
  std::atomic<bool> stop_{false};
  std::thread sigterm_watcher_;
};

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_JOB_LINK_H_
