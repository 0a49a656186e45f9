// Fuzz entry: arbitrary bytes sent to a live store server on a raw connection, after its hello.
// The first input byte picks a server without or with a shared secret (so both the command
// decoder and the authentication gate are exercised). The server must answer or close, never
// crash or hang, and keep serving a well-behaved client (checked every 256 inputs).
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "comm/socket.h"
#include "comm/store.h"
#include "fuzz/replay.h"

namespace {

struct Servers {
  std::unique_ptr<sg::comm::StoreServer> open, secret;
  std::unique_ptr<sg::comm::StoreClient> canary;
};

Servers& Get() {
  static Servers* s = [] {
    auto* s = new Servers;
    sg::comm::StoreServerOptions o;
    o.max_message_bytes = 1 << 16;
    o.max_total_bytes = 1 << 20;
    o.auth_timeout = absl::Milliseconds(200);
    s->open = sg::comm::StoreServer::Start(o).value();
    o.secret = "fuzz secret";
    s->secret = sg::comm::StoreServer::Start(o).value();
    s->canary = sg::comm::StoreClient::Connect("127.0.0.1", s->open->port(), "",
                                               absl::Now() + absl::Seconds(5))
                    .value();
    return s;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Servers& s = Get();
  static int64_t runs = 0;
  const bool with_secret = size > 0 && (data[0] & 1);
  if (size > 0) {
    ++data;
    --size;
  }
  const int port = with_secret ? s.secret->port() : s.open->port();
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::StatusOr<sg::comm::Fd> fd = sg::comm::ConnectTcp("127.0.0.1", port, deadline);
  if (!fd.ok()) std::abort();
  (void)sg::comm::WriteAll(fd->get(), data, size, deadline, "fuzz input");
  ::shutdown(fd->get(), SHUT_WR);
  // Drain replies until the server closes (it sees our EOF) or the deadline.
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, sg::comm::PollTimeoutMs(deadline)) <= 0) break;
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
  }
  if (absl::Now() >= deadline) std::abort();  // the server neither answered nor closed
  if (++runs % 256 == 0) {
    std::string v = std::to_string(runs);
    if (!s.canary->Set("canary", v, absl::Now() + absl::Seconds(5)).ok() ||
        s.canary->Get("canary", absl::Now() + absl::Seconds(5)).value_or("") != v) {
      std::abort();
    }
  }
  return 0;
}
