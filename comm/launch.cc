// launch: starts N local ranks of a program with the torchrun environment, prefixes their output
// with "[rank k] ", and stops every rank when one fails (SIGTERM, then SIGKILL after a grace
// period), returning the failed rank's exit code.
//
//   launch --nproc=2 [--master_port=29500] [--master_addr=127.0.0.1] [--grace_s=5] -- prog args...
//
// Multi-node: run one launch per node with --nnodes, --node_rank and a shared --master_addr/port
// (RANK = node_rank * nproc + local rank), or use mpirun / srun, whose variables comm reads too.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/process_supervisor.h"
#include "comm/socket.h"

namespace {

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

int Usage(const std::string& why) {
  std::cerr << "launch: " << why << "\n"
            << "usage: launch --nproc=N [--master_port=P] [--master_addr=A] [--nnodes=M "
               "--node_rank=K] [--grace_s=S] -- program args...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0, port = 0, nnodes = 1, node_rank = 0, grace_s = 5;
  std::string addr = "127.0.0.1";
  std::vector<std::string> program;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto int_flag = [&](const char* name, int* out) {
      std::string prefix = absl::StrCat("--", name, "=");
      if (!absl::StartsWith(a, prefix)) return false;
      if (!absl::SimpleAtoi(a.substr(prefix.size()), out)) {
        std::exit(Usage(absl::StrCat(name, ": expected an integer, found '", a.substr(prefix.size()), "'")));
      }
      return true;
    };
    if (a == "--") {
      for (++i; i < argc; ++i) program.push_back(argv[i]);
      break;
    }
    if (int_flag("nproc", &nproc) || int_flag("master_port", &port) || int_flag("nnodes", &nnodes) ||
        int_flag("node_rank", &node_rank) || int_flag("grace_s", &grace_s)) {
      continue;
    }
    if (absl::StartsWith(a, "--master_addr=")) {
      addr = a.substr(14);
      continue;
    }
    return Usage(absl::StrCat("unknown argument '", a, "'"));
  }
  if (nproc < 1) return Usage("--nproc must be >= 1");
  if (program.empty()) return Usage("expected a program after --");
  if (nnodes < 1 || node_rank < 0 || node_rank >= nnodes) {
    return Usage(absl::StrCat("--node_rank must be in [0, ", nnodes, "), found ", node_rank));
  }
  if (port == 0) {
    if (nnodes > 1) return Usage("--master_port is required with --nnodes > 1");
    absl::StatusOr<int> p = sg::comm::PickFreePort();
    if (!p.ok()) {
      std::cerr << "launch: " << p.status() << "\n";
      return 1;
    }
    port = *p;
  }

  std::vector<std::string> base = sg::comm::CurrentEnvironment(
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"});
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
    specs.push_back(std::move(spec));
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

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
  if (r->first_failed >= 0) {
    std::cerr << "launch: rank " << node_rank * nproc + r->first_failed << " exited with code "
              << r->exit_code << "; stopped the other ranks\n";
  }
  if (g_signal != 0) return 128 + g_signal;
  return r->exit_code;
}
