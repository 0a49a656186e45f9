// Failure detection: every rank heartbeats through the rendezvous store and watches every other
// rank's heartbeat and collective progress, so that a rank that dies, hangs or falls behind is
// named -- by every survivor, within a deadline -- instead of each survivor timing out on its own.
//
//   HealthOptions opt;  opt.deadline = absl::Seconds(10);
//   SG_ASSIGN_OR_RETURN(auto health, HealthMonitor::Start(info, opt));   // after the rendezvous
//   ... training; a collective stuck on a lost rank fails with the monitor's report (the abort key)
//   if (auto r = health->report()) LOG << r->ToString();  // "rank 2 died (process 4711 is gone) ..."
//   SG_RETURN_IF_ERROR(health->Stop(deadline));            // a clean exit is not a failure
//
// Keys (all under "health/<group>/"): "hb/<rank>" = "<counter> <pid> <hostname>", rewritten every
// `interval` by a background thread; "done/<rank>" once the rank stops cleanly. The monitor reads
// the process group's "<group>/progress/<rank>" = "<seq> <op>" keys (process_group.h) to say which
// collective each rank last entered.
//
// Verdicts, judged on each watcher's own clock (no clock sync needed between hosts):
//   dead/hung  a rank's heartbeat counter has not changed for `deadline`. On the same host the
//              watcher also looks at the process: gone (died), stopped (SIGSTOP / debugger) or
//              running (hung in user code holding the heartbeat thread off, or its store link down).
//   behind     a rank's last entered collective has stayed below the group's newest one for
//              `lag_deadline` while it is still heartbeating: a slow or stuck-in-compute rank.
// The first verdict is latched: report() returns it, `on_failure` runs once, and (with
// abort_group) it becomes "<group>/abort", so the group's collectives fail at once naming the
// rank, the operation and the sequence number. Watching continues; later faults are not reported.
//
// Not a substitute for collective deadlines (ProcessGroupOptions::timeout): it makes them
// informative and early. Rank 0 hosts the store; if rank 0 dies the monitors report the store as
// unreachable naming rank 0.
#ifndef SGTRAIN_COMM_HEALTH_H_
#define SGTRAIN_COMM_HEALTH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/env.h"
#include "comm/store.h"

namespace sg::comm {

struct RankFault {
  enum class Kind { kDead, kHung, kStopped, kSilent, kBehind, kStoreLost };
  Kind kind = Kind::kSilent;
  int rank = -1;               // the rank at fault
  std::string op;              // the collective it last entered ("" if none)
  int64_t seq = 0;             // its sequence number (0 if none)
  std::string waiting_op;      // the newest collective any rank entered, which the others wait in
  int64_t waiting_seq = 0;
  std::vector<int> waiting_ranks;  // ranks already in waiting_seq
  absl::Duration silent_for;   // how long its heartbeat (or progress) has not moved
  std::string detail;          // e.g. "process 4711 is gone"
  int reporter = -1;           // the rank that judged it
  absl::Time detected;

  static absl::string_view KindName(Kind k);  // "died", "hung", "stopped", ...
  // "rank 2 died (process 4711 is gone; no heartbeat for 3.1s); it last entered all_reduce #17,
  //  ranks 0,1,3 are waiting in all_reduce #18 [reported by rank 0]"
  std::string ToString() const;
};

struct HealthOptions {
  std::string group = "world";                   // the ProcessGroup name whose progress is read
  absl::Duration interval = absl::Milliseconds(500);  // heartbeat and check period
  absl::Duration deadline = absl::Seconds(10);   // heartbeat silence before dead/hung
  absl::Duration lag_deadline = absl::Seconds(60);  // progress lag before "behind"
  bool abort_group = true;                       // write the verdict to "<group>/abort"
  std::function<void(const RankFault&)> on_failure;  // runs once, on the monitor thread
};

class HealthMonitor {
 public:
  // Connects its own store client (so a busy training thread never delays a heartbeat), writes
  // the first heartbeat and starts the thread. `info` is this rank's RankInfo.
  static absl::StatusOr<std::unique_ptr<HealthMonitor>> Start(const RankInfo& info,
                                                              HealthOptions options);
  // Stops the thread without marking the rank done (as if it died, to the others).
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // Marks this rank as finished (others stop watching it) and stops the thread.
  absl::Status Stop(absl::Time deadline);

  // The first fault seen, if any.
  std::optional<RankFault> report() const;
  // Waits until a fault is seen or `deadline` passes.
  std::optional<RankFault> WaitForReport(absl::Time deadline) const;
  // For a rank that already knows the job is failing (a launcher's SIGTERM, a collective that
  // failed): checks at once, and from now on judges a peer on this host whose process is gone as
  // dead without waiting out the deadline. Not for normal operation: it trusts pids, which a peer
  // in another pid namespace under the same hostname would defeat.
  void Expedite();
  int64_t heartbeats_sent() const { return beats_.load(); }

 private:
  HealthMonitor() = default;
  void Run();
  // One round: heartbeat, then judge every other rank. Returns a fault, if any.
  std::optional<RankFault> Check(absl::Time now);
  void Latch(RankFault fault);

  struct Peer {
    std::string last_beat;               // raw heartbeat value
    absl::Time beat_changed;             // when last_beat last changed, on our clock
    int pid = 0;
    std::string host;
    int64_t seq = 0;
    std::string op;
    absl::Time seq_changed;
    absl::Time behind_since = absl::InfinitePast();  // InfinitePast: not behind
    bool done = false;
  };
  // A collective as the progress keys name it (seq 0: none). Check judges every rank against the
  // newest one any rank entered.
  struct Collective {
    int64_t seq = 0;
    std::string op;
  };

  // Check's steps, in order. A failed heartbeat of our own judges only the store: the store is
  // lost once no round trip has succeeded for `deadline`; until then no verdict (nullopt).
  std::optional<RankFault> StoreFault(absl::Time now, const absl::Status& beat) const;
  // Refreshes every rank's Peer from the store (store calls bounded by `d`); returns the newest
  // collective among the ranks not done.
  Collective ReadPeers(absl::Time now, absl::Time d);
  // One rank's done, heartbeat and progress keys; false when it is done (it is no longer watched).
  bool ReadPeer(int r, absl::Time now, absl::Time d);
  // The first other rank whose heartbeat has not moved for `deadline` (or, after Expedite(), whose
  // process on this host is gone), named as dead, stopped, hung or silent.
  std::optional<RankFault> FindSilent(absl::Time now, const Collective& newest) const;
  // What this host can tell of a silent rank's process: sets `f`'s kind and detail.
  void DescribeSilence(const Peer& p, RankFault* f) const;
  // The first rank whose progress has stayed behind `newest` for `lag_deadline`; updates each
  // rank's behind_since.
  std::optional<RankFault> FindBehind(absl::Time now, const Collective& newest);
  // A fault of `kind` for rank `r`, with what it and the waiting ranks last entered.
  RankFault FaultFor(int r, RankFault::Kind kind, absl::Duration silent, absl::Time now,
                     const Collective& newest) const;

  RankInfo info_;
  HealthOptions options_;
  std::string hostname_;
  std::unique_ptr<StoreClient> store_;
  std::vector<Peer> peers_;
  absl::Time started_;
  absl::Time store_ok_;  // last successful store round trip
  std::atomic<int64_t> beats_{0};
  // stop_ and wake_ are set under mu_ (so the thread's wait sees them at once) and read anywhere.
  std::atomic<bool> stop_{false};
  std::atomic<bool> expedite_{false};
  std::atomic<bool> wake_{false};  // Expedite(): check now instead of after the interval
  mutable absl::Mutex mu_;
  std::optional<RankFault> fault_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_HEALTH_H_
