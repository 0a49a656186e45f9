// Internal: TCP sockets with deadlines, for the store and the launcher. Every blocking call takes an
// absl::Time deadline and returns DeadlineExceeded naming `what` when it passes.
//
//   SG_ASSIGN_OR_RETURN(Fd fd, ConnectTcp("127.0.0.1", 29500, absl::Now() + absl::Seconds(5)));
//   SG_RETURN_IF_ERROR(WriteAll(fd.get(), buf, n, deadline, "store request"));
#ifndef SGTRAIN_COMM_SOCKET_H_
#define SGTRAIN_COMM_SOCKET_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sg::comm {

// An owned file descriptor, closed on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

// Connects to host:port (IPv4; `host` is a name or dotted quad), retrying refused connections until
// `deadline` (the server may not be up yet). The socket has TCP_NODELAY set.
absl::StatusOr<Fd> ConnectTcp(const std::string& host, int port, absl::Time deadline);

// Listens on host:port; port 0 picks a free port, written to *bound_port.
absl::StatusOr<Fd> ListenTcp(const std::string& host, int port, int* bound_port);

// A port that was free a moment ago (binds port 0 on 127.0.0.1 and closes it). Racy by nature:
// for tests and the launcher's default, where a collision fails loudly rather than silently.
absl::StatusOr<int> PickFreePort();

// Writes/reads exactly `n` bytes. Peer closing the connection is Unavailable; the deadline passing
// is DeadlineExceeded. `what` names the transfer in errors.
absl::Status WriteAll(int fd, const void* data, size_t n, absl::Time deadline, absl::string_view what);
absl::Status ReadAll(int fd, void* data, size_t n, absl::Time deadline, absl::string_view what);

// Milliseconds from now to `deadline`, clamped to [0, INT_MAX]; -1 for an infinite deadline.
int PollTimeoutMs(absl::Time deadline);

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_SOCKET_H_
