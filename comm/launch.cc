// launch: starts N local ranks of a program with the torchrun environment, prefixes their output
// with "[rank k] ", and stops every rank when one fails (SIGTERM, then SIGKILL after a grace
// period), returning the failed rank's exit code.
//
//   launch --nproc=2 [--master_port=29500] [--master_addr=127.0.0.1] [--grace_s=5] -- prog args...
//
// Multi-node: run one launch per node with --nnodes, --node_rank and a shared --master_addr/port
// (RANK = node_rank * nproc + local rank), or use mpirun / srun, whose variables comm reads too.
// Without --master_port, launch itself serves the rendezvous store (see comm/env.h,
// SG_STORE_EXTERNAL), a fresh one for each restart.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "comm/process_supervisor.h"
#include "comm/store.h"

ABSL_FLAG(int, nproc, 0, "ranks to start on this node (>= 1)");
ABSL_FLAG(int, master_port, 0, "rendezvous store port (0: this launcher serves one on a free port)");
ABSL_FLAG(std::string, master_addr, "127.0.0.1", "rendezvous store host");
ABSL_FLAG(int, nnodes, 1, "nodes in the job");
ABSL_FLAG(int, node_rank, 0, "this node's index in [0, --nnodes)");
ABSL_FLAG(int, grace_s, 5, "seconds between SIGTERM and SIGKILL when stopping ranks");
ABSL_FLAG(int, max_restarts, 0, "restarts with one rank fewer after a rank fails (single node)");
ABSL_FLAG(int, min_nproc, 0, "fewest ranks a restart may run with (0: 1)");

namespace {

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

int Usage(const std::string& why) {
  std::cerr << "launch: " << why << "\n"
            << "usage: launch --nproc=N [--master_port=P] [--master_addr=A] [--nnodes=M "
               "--node_rank=K] [--grace_s=S] [--max_restarts=R --min_nproc=M] -- program args...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Starts N local ranks of a program with the torchrun environment.\n"
      "  launch --nproc=N [launcher flags] -- program args...");
  // Everything after the first `--` is the program's argv, verbatim: Abseil never sees it, so a
  // program flag named like a launcher flag stays the program's.
  int split = 1;
  while (split < argc && std::string(argv[split]) != "--") ++split;
  std::vector<std::string> program(argv + std::min(split + 1, argc), argv + argc);
  const std::vector<char*> rest = absl::ParseCommandLine(split, argv);
  if (rest.size() > 1) return Usage(absl::StrCat("unknown argument '", rest[1], "' before --"));
  int nproc = absl::GetFlag(FLAGS_nproc), port = absl::GetFlag(FLAGS_master_port);
  const int nnodes = absl::GetFlag(FLAGS_nnodes), node_rank = absl::GetFlag(FLAGS_node_rank);
  const int grace_s = absl::GetFlag(FLAGS_grace_s), max_restarts = absl::GetFlag(FLAGS_max_restarts);
  int min_nproc = absl::GetFlag(FLAGS_min_nproc);
  const std::string addr = absl::GetFlag(FLAGS_master_addr);
  if (nproc < 1) return Usage("--nproc must be >= 1");
  if (program.empty()) return Usage("expected a program after --");
  if (nnodes < 1 || node_rank < 0 || node_rank >= nnodes) {
    return Usage(absl::StrCat("--node_rank must be in [0, ", nnodes, "), found ", node_rank));
  }
  if (min_nproc == 0) min_nproc = 1;
  if (max_restarts < 0 || min_nproc < 1 || min_nproc > nproc) {
    return Usage(absl::StrCat("need --max_restarts >= 0 and 1 <= --min_nproc <= --nproc, found ",
                              max_restarts, " and ", min_nproc));
  }
  if (max_restarts > 0 && nnodes > 1) return Usage("--max_restarts is single-node only (--nnodes=1)");
  const bool fixed_port = port != 0;
  if (!fixed_port && nnodes > 1) return Usage("--master_port is required with --nnodes > 1");

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::string> drop = {"RANK",        "WORLD_SIZE",       "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
                                   "MASTER_ADDR", "MASTER_PORT",      "SG_RESTART_COUNT", "SG_MAX_RESTARTS"};
  // With --master_port a store served by someone else (SG_STORE_EXTERNAL=1) may be meant.
  if (!fixed_port) drop.push_back("SG_STORE_EXTERNAL");
  std::vector<std::string> base = sg::comm::CurrentEnvironment(drop);
  for (int restart = 0;; ++restart) {
    // Without --master_port the store is served from here, on a port the kernel picks when it is
    // bound, for this attempt's ranks (SG_STORE_EXTERNAL=1: rank 0 does not host it): a port picked
    // free and bound later by rank 0 could be taken in between by another job on the host.
    std::unique_ptr<sg::comm::StoreServer> store;
    if (!fixed_port) {
      sg::comm::StoreServerOptions so;
      const char* bind = std::getenv("SG_STORE_BIND_ADDR");
      so.host = bind != nullptr && *bind != '\0' ? bind : "127.0.0.1";
      so.port = 0;
      const char* secret = std::getenv("SG_STORE_SECRET");
      so.secret = secret != nullptr ? secret : "";
      absl::StatusOr<std::unique_ptr<sg::comm::StoreServer>> s = sg::comm::StoreServer::Start(so);
      if (!s.ok()) {
        std::cerr << "launch: cannot serve the store: " << s.status() << "\n";
        return 1;
      }
      store = *std::move(s);
      port = store->port();
    }
    std::vector<sg::comm::ProcessSpec> specs;
    for (int local = 0; local < nproc; ++local) {
      sg::comm::ProcessSpec spec;
      spec.argv = program;
      spec.env = base;
      spec.env.push_back(absl::StrCat("RANK=", node_rank * nproc + local));
      spec.env.push_back(absl::StrCat("WORLD_SIZE=", nnodes * nproc));
      spec.env.push_back(absl::StrCat("LOCAL_RANK=", local));
      spec.env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", nproc));
      spec.env.push_back(absl::StrCat("MASTER_ADDR=", addr));
      spec.env.push_back(absl::StrCat("MASTER_PORT=", port));
      if (store != nullptr) spec.env.push_back("SG_STORE_EXTERNAL=1");
      spec.env.push_back(absl::StrCat("SG_RESTART_COUNT=", restart));
      spec.env.push_back(absl::StrCat("SG_MAX_RESTARTS=", max_restarts));
      specs.push_back(std::move(spec));
    }

    sg::comm::SupervisorOptions opt;
    opt.grace = absl::Seconds(grace_s);
    opt.on_line = [&](int i, absl::string_view line) {
      std::string out = absl::StrCat("[rank ", node_rank * nproc + i, "] ", line);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
    };
    opt.stop_requested = [] { return g_signal != 0; };
    absl::StatusOr<sg::comm::SupervisedResult> r = sg::comm::RunSupervised(specs, opt);
    if (!r.ok()) {
      std::cerr << "launch: " << r.status() << "\n";
      return 1;
    }
    if (g_signal != 0) return 128 + g_signal;
    if (r->first_failed < 0) return 0;
    std::cerr << "launch: rank " << node_rank * nproc + r->first_failed << " exited with code "
              << r->exit_code << "; stopped the other ranks\n";
    // The rank that failed first is the one lost; the others were stopped by this launcher.
    if (restart >= max_restarts) {
      if (max_restarts > 0) std::cerr << "launch: no restarts left (--max_restarts=" << max_restarts << ")\n";
      return r->exit_code;
    }
    if (nproc - 1 < min_nproc) {
      std::cerr << "launch: cannot restart: " << nproc - 1 << " ranks would remain, --min_nproc="
                << min_nproc << "\n";
      return r->exit_code;
    }
    --nproc;
    std::cerr << "launch: restarting with " << nproc << " ranks (restart " << restart + 1 << " of "
              << max_restarts << ")\n";
  }
}
