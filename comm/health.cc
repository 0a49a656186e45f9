#include "comm/health.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/core/status.h"

namespace sg::comm {
namespace {

std::string HealthKey(const std::string& group, absl::string_view what, int rank) {
  return absl::StrCat("health/", group, "/", what, "/", rank);
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// What this host can see of process `pid`: 'X' gone, 'T' stopped, 'Z' zombie, 'R'/'S'/'D' alive.
char ProcessState(int pid) {
  if (pid <= 0) return '?';
  if (::kill(pid, 0) != 0 && errno == ESRCH) return 'X';
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(f, line)) return 'X';
  size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= line.size()) return '?';
  char s = line[close + 2];
  return s == 't' ? 'T' : s;
}

}  // namespace

absl::string_view RankFault::KindName(Kind k) {
  switch (k) {
    case Kind::kDead: return "died";
    case Kind::kHung: return "hung";
    case Kind::kStopped: return "is stopped";
    case Kind::kSilent: return "stopped heartbeating";
    case Kind::kBehind: return "fell behind";
    case Kind::kStoreLost: return "lost the store";
  }
  return "?";
}

std::string RankFault::ToString() const {
  std::string s = absl::StrCat("rank ", rank, " ", KindName(kind), " (");
  if (!detail.empty()) absl::StrAppend(&s, detail, "; ");
  absl::StrAppend(&s, kind == Kind::kBehind ? "no progress for " : "no heartbeat for ",
                  absl::FormatDuration(absl::Trunc(silent_for, absl::Milliseconds(1))), ")");
  if (seq > 0) {
    absl::StrAppend(&s, "; it last entered ", op, " #", seq);
  } else {
    absl::StrAppend(&s, "; it entered no collective");
  }
  if (waiting_seq > seq && !waiting_ranks.empty()) {
    absl::StrAppend(&s, ", ranks ", absl::StrJoin(waiting_ranks, ","), " are waiting in ",
                    waiting_op, " #", waiting_seq);
  }
  absl::StrAppend(&s, " [reported by rank ", reporter, "]");
  return s;
}

absl::StatusOr<std::unique_ptr<HealthMonitor>> HealthMonitor::Start(const RankInfo& info,
                                                                    HealthOptions options) {
  SG_CHECK_ARG(options.interval > absl::ZeroDuration() && options.deadline > options.interval,
               "HealthMonitor: need 0 < interval < deadline, found interval ",
               absl::FormatDuration(options.interval), ", deadline ",
               absl::FormatDuration(options.deadline));
  std::unique_ptr<HealthMonitor> m(new HealthMonitor());
  m->info_ = info;
  m->options_ = std::move(options);
  m->hostname_ = Hostname();
  SG_ASSIGN_OR_RETURN(m->store_, StoreClient::Connect(info.master_addr, info.master_port,
                                                      info.secret, absl::Now() + m->options_.deadline));
  m->started_ = absl::Now();
  m->store_ok_ = m->started_;
  m->peers_.resize(size_t(info.world_size));
  for (Peer& p : m->peers_) p.beat_changed = p.seq_changed = m->started_;
  // The first heartbeat before returning: a rank that has started is never judged on its absence.
  SG_RETURN_IF_ERROR(m->store_->Set(HealthKey(m->options_.group, "hb", info.rank),
                                    absl::StrCat(0, " ", ::getpid(), " ", m->hostname_),
                                    absl::Now() + m->options_.deadline));
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

HealthMonitor::~HealthMonitor() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status HealthMonitor::Stop(absl::Time deadline) {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  return store_->Set(HealthKey(options_.group, "done", info_.rank), "1", deadline);
}

std::optional<RankFault> HealthMonitor::report() const {
  absl::MutexLock l(&mu_);
  return fault_;
}

std::optional<RankFault> HealthMonitor::WaitForReport(absl::Time deadline) const {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(
                            +[](const std::optional<RankFault>* f) { return f->has_value(); }, &fault_),
                        deadline);
  return fault_;
}

void HealthMonitor::Run() {
  while (!stop_) {
    absl::Time now = absl::Now();
    std::optional<RankFault> f = Check(now);
    if (f.has_value() && !report().has_value()) Latch(*std::move(f));
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](HealthMonitor* m) { return m->stop_.load() || m->wake_.load(); }, this),
                         options_.interval);
    wake_ = false;
  }
}

void HealthMonitor::Expedite() {
  expedite_ = true;
  absl::MutexLock l(&mu_);
  wake_ = true;
}

void HealthMonitor::Latch(RankFault fault) {
  {
    absl::MutexLock l(&mu_);
    fault_ = fault;
  }
  if (options_.abort_group) {
    (void)store_->CompareAndSet(absl::StrCat(options_.group, "/abort"), "",
                                absl::StrCat("health monitor: ", fault.ToString()),
                                absl::Now() + absl::Seconds(2));
  }
  if (options_.on_failure) options_.on_failure(fault);
}

std::optional<RankFault> HealthMonitor::Check(absl::Time now) {
  const std::string& g = options_.group;
  // Store calls get a short deadline: a monitor that blocks cannot judge anything.
  absl::Time d = now + std::min(options_.interval * 2, options_.deadline / 2);
  absl::Status beat = store_->Set(HealthKey(g, "hb", info_.rank),
                                  absl::StrCat(++beats_, " ", ::getpid(), " ", hostname_), d);
  if (!beat.ok()) return StoreFault(now, beat);
  store_ok_ = now;

  // Read every rank's state first; judge after, against the newest collective.
  const Collective newest = ReadPeers(now, d);
  if (std::optional<RankFault> f = FindSilent(now, newest)) return f;
  return FindBehind(now, newest);
}

std::optional<RankFault> HealthMonitor::StoreFault(absl::Time now, const absl::Status& beat) const {
  if (now - store_ok_ < options_.deadline) return std::nullopt;
  RankFault f;
  f.kind = RankFault::Kind::kStoreLost;
  f.rank = 0;
  f.silent_for = now - store_ok_;
  f.detail = absl::StrCat("the store it hosts is unreachable: ", beat.message());
  f.reporter = info_.rank;
  f.detected = now;
  return f;
}

HealthMonitor::Collective HealthMonitor::ReadPeers(absl::Time now, absl::Time d) {
  Collective newest;
  for (int r = 0; r < info_.world_size; ++r) {
    const Peer& p = peers_[size_t(r)];
    if (!ReadPeer(r, now, d)) continue;
    if (p.seq > newest.seq) {
      newest.seq = p.seq;
      newest.op = p.op;
    }
  }
  return newest;
}

bool HealthMonitor::ReadPeer(int r, absl::Time now, absl::Time d) {
  const std::string& g = options_.group;
  Peer& p = peers_[size_t(r)];
  if (p.done) return false;
  if (store_->TryGet(HealthKey(g, "done", r), d).ok()) {
    p.done = true;
    return false;
  }
  if (absl::StatusOr<std::string> hb = store_->TryGet(HealthKey(g, "hb", r), d); hb.ok()) {
    if (*hb != p.last_beat) {
      p.last_beat = *hb;
      p.beat_changed = now;
      std::istringstream in(*hb);
      int64_t counter = 0;
      in >> counter >> p.pid >> p.host;
    }
  }
  if (absl::StatusOr<std::string> pr = store_->TryGet(absl::StrCat(g, "/progress/", r), d);
      pr.ok()) {
    std::istringstream in(*pr);
    int64_t seq = 0;
    std::string op;
    in >> seq >> op;
    if (seq != p.seq) {
      p.seq = seq;
      p.op = op;
      p.seq_changed = now;
    }
  }
  return true;
}

RankFault HealthMonitor::FaultFor(int r, RankFault::Kind kind, absl::Duration silent, absl::Time now,
                                  const Collective& newest) const {
  const Peer& p = peers_[size_t(r)];
  RankFault f;
  f.kind = kind;
  f.rank = r;
  f.op = p.op;
  f.seq = p.seq;
  f.waiting_op = newest.op;
  f.waiting_seq = newest.seq;
  for (int q = 0; q < info_.world_size; ++q) {
    if (peers_[size_t(q)].seq == newest.seq && q != r) f.waiting_ranks.push_back(q);
  }
  f.silent_for = silent;
  f.reporter = info_.rank;
  f.detected = now;
  return f;
}

std::optional<RankFault> HealthMonitor::FindSilent(absl::Time now, const Collective& newest) const {
  for (int r = 0; r < info_.world_size; ++r) {
    const Peer& p = peers_[size_t(r)];
    if (p.done || r == info_.rank) continue;
    absl::Duration silent = now - p.beat_changed;
    const bool gone = expedite_ && p.host == hostname_ && p.pid > 0 &&
                      (ProcessState(p.pid) == 'X' || ProcessState(p.pid) == 'Z');
    if (silent < options_.deadline && !gone) continue;
    RankFault f = FaultFor(r, RankFault::Kind::kSilent, silent, now, newest);
    DescribeSilence(p, &f);
    return f;
  }
  return std::nullopt;
}

void HealthMonitor::DescribeSilence(const Peer& p, RankFault* f) const {
  if (p.host == hostname_ && p.pid > 0) {
    char s = ProcessState(p.pid);
    if (s == 'X' || s == 'Z') {
      f->kind = RankFault::Kind::kDead;
      f->detail = absl::StrCat("process ", p.pid, " is gone");
    } else if (s == 'T') {
      f->kind = RankFault::Kind::kStopped;
      f->detail = absl::StrCat("process ", p.pid, " is stopped (SIGSTOP or a debugger)");
    } else {
      f->kind = RankFault::Kind::kHung;
      f->detail = absl::StrCat("process ", p.pid, " is alive but its heartbeat thread is not running");
    }
  } else if (p.pid > 0) {
    f->detail = absl::StrCat("process ", p.pid, " on ", p.host, ": died or hung");
  } else {
    f->detail = "it never sent a heartbeat";
  }
}

std::optional<RankFault> HealthMonitor::FindBehind(absl::Time now, const Collective& newest) {
  // Progress: a rank still heartbeating whose newest collective stays behind the group's. Timed
  // from when it was first seen behind (or last moved), not from its last change alone: it may
  // have been idle together with everyone until the others moved on.
  for (int r = 0; r < info_.world_size; ++r) {
    Peer& p = peers_[size_t(r)];
    if (p.done || p.seq >= newest.seq) {
      p.behind_since = absl::InfinitePast();
      continue;
    }
    if (p.behind_since == absl::InfinitePast() || p.seq_changed > p.behind_since) {
      p.behind_since = now;
    }
    if (now - p.behind_since >= options_.lag_deadline) {
      RankFault f = FaultFor(r, RankFault::Kind::kBehind, now - p.behind_since, now, newest);
      f.detail = absl::StrCat("heartbeating, but ", newest.seq - p.seq, " collective(s) behind");
      return f;
    }
  }
  return std::nullopt;
}

}  // namespace sg::comm
