#include "trainer/job_link.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::trainer {
namespace {

volatile sig_atomic_t g_sigterm = 0;
void OnSigterm(int) { g_sigterm = 1; }

std::string Key(const std::string& key) { return "trainer/" + key; }

}  // namespace

// Heartbeat and check period: a tenth of the deadline, within [100 ms, 1 s].
absl::Duration JobLink::Interval() const {
  return std::clamp(options_.deadline / 10, absl::Milliseconds(100), absl::Seconds(1));
}

absl::StatusOr<std::unique_ptr<JobLink>> JobLink::Start(const JobLinkOptions& options) {
  std::unique_ptr<JobLink> link(new JobLink());
  link->options_ = options;
  SG_ASSIGN_OR_RETURN(link->info_, comm::RankInfoFromEnv());
  if (const char* a = std::getenv("SG_RESTART_COUNT"); a != nullptr && *a != '\0') link->attempt_ = a;
  SG_ASSIGN_OR_RETURN(link->store_, comm::StoreClient::Connect(link->info_.master_addr, link->info_.master_port,
                                                               link->info_.secret, absl::Now() + absl::Seconds(60)));
  // Every rank's first heartbeat within moments of the others' (compile times differ), so a rank
  // is never judged on a silence that is only its late start.
  SG_RETURN_IF_ERROR(link->Publish(absl::StrCat("ready/", link->rank()), "1"));
  for (int r = 0; r < link->world_size(); ++r) {
    SG_RETURN_IF_ERROR(link->Await(absl::StrCat("ready/", r), absl::Minutes(5)).status());
  }
  if (options.deadline > absl::ZeroDuration()) {
    comm::HealthOptions h;
    h.group = options.group;
    h.deadline = options.deadline;
    h.interval = link->Interval();
    h.lag_deadline = options.straggler_deadline;
    h.on_failure = [](const comm::RankFault& f) {
      std::fprintf(stderr, "health: %s\n", f.ToString().c_str());
      std::fflush(stderr);
    };
    SG_ASSIGN_OR_RETURN(link->health_, comm::HealthMonitor::Start(link->info_, h));
  }
  if (options.handle_sigterm) {
    struct sigaction sa {};
    sa.sa_handler = OnSigterm;
    sigaction(SIGTERM, &sa, nullptr);
    link->sigterm_watcher_ = std::thread([p = link.get()] { p->WatchSigterm(); });
  }
  return link;
}

JobLink::~JobLink() {
  stop_ = true;
  if (sigterm_watcher_.joinable()) sigterm_watcher_.join();
}

void JobLink::WatchSigterm() {
  while (!stop_) {
    if (g_sigterm == 0) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    const std::string report = ConcludeFailure();
    std::fprintf(stderr, "stopping on SIGTERM: %s\n", report.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(128 + SIGTERM);
  }
}

std::optional<comm::RankFault> JobLink::fault() const {
  return health_ != nullptr ? health_->report() : std::nullopt;
}

absl::Status JobLink::Publish(const std::string& key, const std::string& value) {
  return store_->Set(Key(key), value, absl::Now() + absl::Seconds(30));
}

absl::StatusOr<std::string> JobLink::Await(const std::string& key, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::string> v = store_->TryGet(Key(key), absl::Now() + absl::Seconds(10));
    if (v.ok()) return v;
    if (!absl::IsNotFound(v.status())) {
      return absl::UnavailableError(absl::StrCat("rank ", rank(), " waiting for '", key, "': ", v.status().message()));
    }
    if (std::optional<comm::RankFault> f = fault()) {
      return absl::AbortedError(absl::StrCat("rank ", rank(), " waiting for '", key, "': ", f->ToString()));
    }
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank(), " waited ", absl::FormatDuration(timeout),
                                                      " for '", key, "'"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status JobLink::Finish(absl::Duration timeout) {
  absl::MutexLock l(&conclude_mu_);
  if (concluded_) return absl::FailedPreconditionError("JobLink::Finish after ConcludeFailure");
  concluded_ = true;
  conclusion_ = "the run had finished";
  const absl::Time deadline = absl::Now() + timeout;
  if (health_ != nullptr) {
    SG_RETURN_IF_ERROR(health_->Stop(deadline));  // kept: the SIGTERM watcher may still read it
  }
  SG_RETURN_IF_ERROR(Publish(absl::StrCat("finished/", rank()), "1"));
  if (rank() == 0) {
    for (int r = 1; r < world_size(); ++r) {
      SG_RETURN_IF_ERROR(Await(absl::StrCat("finished/", r), deadline - absl::Now()).status());
    }
  }
  return absl::OkStatus();
}

}  // namespace sg::trainer

namespace sg::trainer {

std::string JobLink::ConcludeFailure() {
  absl::MutexLock l(&conclude_mu_);
  if (concluded_) return conclusion_;
  concluded_ = true;
  if (health_ == nullptr) return conclusion_ = "no rank fault seen (failure detection is off)";
  const absl::Duration bound = options_.deadline + 2 * Interval();
  const absl::Time start = absl::Now();
  health_->Expedite();  // a peer that is gone is named now, not after the deadline
  std::optional<comm::RankFault> f = health_->WaitForReport(start + bound);
  // Done only when exiting because of another rank: the others then stop watching this one. A
  // rank at fault itself (a straggler judging itself) or without a verdict stays watched, so the
  // others still name it.
  if (f.has_value() && f->rank != rank()) {
    (void)health_->Stop(absl::Now() + absl::Seconds(2));
  }
  conclusion_ = f.has_value() ? f->ToString()
                              : absl::StrCat("no rank fault seen within ", absl::FormatDuration(bound));
  const std::string me = absl::StrCat("reported/", rank());
  (void)store_->Set(Key(me), conclusion_, absl::Now() + absl::Seconds(2));
  if (rank() == 0 && f.has_value()) {
    // Keep the store up until every other survivor has its report (or the bound passes again).
    const absl::Time end = absl::Now() + bound;
    for (int r = 1; r < world_size(); ++r) {
      if (r == f->rank) continue;
      while (absl::Now() < end &&
             !store_->TryGet(Key(absl::StrCat("reported/", r)), absl::Now() + absl::Seconds(2)).ok()) {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
  }
  return conclusion_;
}

}  // namespace sg::trainer
