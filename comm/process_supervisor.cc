#include "comm/process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace sg::comm {
namespace {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // read end of the child's stdout+stderr pipe; -1 once at EOF
  std::string partial;  // output after the last newline
  bool running = false;
  bool term_sent = false;
  bool kill_sent = false;
};

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Signals the child's whole process group (it leads its own), so its children go too.
void Signal(const Child& c, int sig) {
  if (c.running) ::kill(-c.pid, sig);
}

absl::StatusOr<Child> Spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("process spec: empty argv");
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  Child c;
  int rc = ::posix_spawnp(&c.pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    return absl::NotFoundError(absl::StrCat("could not start '", spec.argv[0], "': ", std::strerror(rc)));
  }
  ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
  c.out_fd = pipe_fds[0];
  c.running = true;
  return c;
}

// Reads what is available from a child's pipe and hands complete lines to on_line.
void Drain(int index, Child& c, const SupervisorOptions& opt, bool flush_partial) {
  char buf[65536];
  while (c.out_fd >= 0) {
    ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
    if (n > 0) {
      c.partial.append(buf, size_t(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      ::close(c.out_fd);
      c.out_fd = -1;
    }
    break;
  }
  size_t start = 0;
  for (size_t nl; (nl = c.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (opt.on_line) opt.on_line(index, absl::string_view(c.partial).substr(start, nl + 1 - start));
  }
  c.partial.erase(0, start);
  if ((flush_partial || c.out_fd < 0) && !c.partial.empty()) {
    if (opt.on_line) opt.on_line(index, c.partial + "\n");
    c.partial.clear();
  }
}

}  // namespace

std::vector<std::string> CurrentEnvironment(const std::vector<std::string>& drop) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool dropped = false;
    for (const auto& d : drop) dropped |= (d == name);
    if (!dropped) env.push_back(entry);
  }
  return env;
}

absl::StatusOr<SupervisedResult> RunSupervised(const std::vector<ProcessSpec>& specs,
                                               const SupervisorOptions& opt) {
  std::vector<Child> children;
  SupervisedResult result;
  result.exit_codes.assign(specs.size(), -1);
  absl::Time kill_at = absl::InfiniteFuture();
  auto stop_all = [&] {
    if (kill_at != absl::InfiniteFuture()) return;
    for (Child& c : children) {
      Signal(c, SIGTERM);
      c.term_sent = true;
    }
    kill_at = absl::Now() + opt.grace;
  };
  for (const ProcessSpec& spec : specs) {
    absl::StatusOr<Child> c = Spawn(spec);
    if (!c.ok()) {
      stop_all();
      for (Child& ch : children) {
        Signal(ch, SIGKILL);
        ::waitpid(ch.pid, nullptr, 0);
        if (ch.out_fd >= 0) ::close(ch.out_fd);
      }
      return c.status();
    }
    children.push_back(*c);
  }

  size_t running = children.size();
  std::vector<pollfd> pfds;
  bool first_killed = false;  // result.first_failed was ended by a signal not sent from here
  while (running > 0) {
    pfds.clear();
    for (const Child& c : children) {
      if (c.out_fd >= 0) pfds.push_back({c.out_fd, POLLIN, 0});
    }
    ::poll(pfds.data(), pfds.size(), 50);
    for (size_t i = 0; i < children.size(); ++i) Drain(int(i), children[i], opt, false);
    int failed_now = -1;  // this round's first failure: one ended by a signal wins, since the
                          // ranks that exit with an error are usually reacting to it
    bool killed_now = false;  // failed_now was ended by a signal this supervisor did not send
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (!c.running) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r != c.pid) continue;
      c.running = false;
      --running;
      // Whatever the process group still holds of the pipe is drained below; stop its leftovers.
      ::kill(-c.pid, SIGKILL);
      result.exit_codes[i] = ExitCode(status);
      const bool killed = WIFSIGNALED(status) && !c.kill_sent && !(c.term_sent && WTERMSIG(status) == SIGTERM);
      if (result.exit_codes[i] != 0 &&
          (failed_now < 0 || (WIFSIGNALED(status) && result.exit_codes[size_t(failed_now)] <= 128))) {
        failed_now = int(i);
        killed_now = killed;
      }
    }
    if (failed_now >= 0 && result.first_failed < 0) {
      result.first_failed = failed_now;
      result.exit_code = result.exit_codes[size_t(failed_now)];
      first_killed = killed_now;
      if (opt.stop_all_on_failure) stop_all();
    } else if (failed_now >= 0 && killed_now && !first_killed && result.exit_code <= 128) {
      // A process killed from outside (SIGKILL, a crash) takes the blame from one that exited with
      // an error before it was reaped: the others react to its death, and a killed process with
      // much memory mapped can take longer to become reapable than its peers take to notice.
      result.first_failed = failed_now;
      result.exit_code = result.exit_codes[size_t(failed_now)];
      first_killed = true;
    }
    absl::Time now = absl::Now();
    if (running > 0 && opt.stop_requested && opt.stop_requested()) stop_all();
    if (running > 0 && now >= opt.deadline && !result.timed_out) {
      result.timed_out = true;
      stop_all();
    }
    if (now >= kill_at) {
      for (Child& c : children) {
        Signal(c, SIGKILL);
        c.kill_sent = true;
      }
    }
  }
  for (size_t i = 0; i < children.size(); ++i) {
    Drain(int(i), children[i], opt, true);
    if (children[i].out_fd >= 0) ::close(children[i].out_fd);
  }
  if (result.timed_out && result.exit_code == 0) result.exit_code = 124;
  return result;
}

}  // namespace sg::comm
