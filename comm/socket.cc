#include "comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::comm {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return ms > INT_MAX ? INT_MAX : int(ms);
}

namespace {

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port) {
  SG_CHECK_ARG(port >= 0 && port <= 65535, "TCP port must be in [0, 65535], found ", port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

absl::Status Errno(absl::string_view what) {
  int e = errno;
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(e)));
}

}  // namespace

absl::StatusOr<Fd> ConnectTcp(const std::string& host, int port, absl::Time deadline) {
  SG_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  std::string last_error = "no attempt";
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return Errno("socket()");
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int prc = ::poll(&p, 1, PollTimeoutMs(deadline));
      int err = 0;
      socklen_t len = sizeof(err);
      if (prc == 1) ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = (prc == 1 && err == 0) ? 0 : -1;
      errno = prc == 1 ? err : ETIMEDOUT;
    }
    if (rc == 0) {
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    last_error = std::strerror(errno);
    if (absl::Now() + backoff >= deadline) break;
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("could not connect to ", host, ":", port,
                                                  " before the deadline (last error: ", last_error,
                                                  ")"));
}

absl::StatusOr<Fd> ListenTcp(const std::string& host, int port, int* bound_port) {
  SG_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Errno("socket()");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("bind(", host, ":", port, ")"));
  }
  if (::listen(fd.get(), 1024) != 0) return Errno("listen()");
  socklen_t len = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  if (bound_port != nullptr) *bound_port = ntohs(addr.sin_port);
  return fd;
}

absl::StatusOr<int> PickFreePort() {
  int port = 0;
  SG_ASSIGN_OR_RETURN(Fd fd, ListenTcp("127.0.0.1", 0, &port));
  return port;
}

absl::Status WriteAll(int fd, const void* data, size_t n, absl::Time deadline, absl::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return Errno(absl::StrCat("sending ", what));
    pollfd pfd{fd, POLLOUT, 0};
    int rc = ::poll(&pfd, 1, PollTimeoutMs(deadline));
    if (rc == 0) {
      return absl::DeadlineExceededError(absl::StrCat("deadline passed while sending ", what));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t n, absl::Time deadline, absl::string_view what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= size_t(r);
      continue;
    }
    if (r == 0) {
      return absl::UnavailableError(absl::StrCat("connection closed by peer while receiving ", what));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno(absl::StrCat("receiving ", what));
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, PollTimeoutMs(deadline));
    if (rc == 0) {
      return absl::DeadlineExceededError(absl::StrCat("deadline passed while receiving ", what));
    }
  }
  return absl::OkStatus();
}

}  // namespace sg::comm
