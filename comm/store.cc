#include "comm/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/hmac.h"
#include "comm/store_wire.h"
#include "kernels/core/status.h"

// GCC 12 at -O2 reports reads of a std::string returned through absl::StatusOr (the reply
// payloads below) as maybe-uninitialized: a known false positive with SSO strings (GCC bug 105562).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sg::comm {
namespace {

constexpr char kAuthContext[] = "sgtrain-store-auth-v1";
// How long a client waits for a reply beyond the server-side wait it asked for.
constexpr absl::Duration kReplyGrace = absl::Seconds(2);

int64_t WaitMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return INT64_MAX;
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
}

std::string ReplyFrame(StoreReply code, absl::string_view message = {}) {
  WireWriter w;
  w.U8(uint8_t(code));
  if (code == StoreReply::kBadRequest || code == StoreReply::kDenied || code == StoreReply::kError) {
    w.Str(message);
  }
  return w.Frame();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server: one thread, poll() over the listening socket, a wake-up pipe and every connection.

struct StoreServer::State {
  struct Conn {
    Fd fd;
    std::string in, out;
    std::string nonce;
    bool authed = false;
    bool closing = false;  // flush `out`, then close
    absl::Time accepted;
  };
  // A Get or Wait parked until its keys exist or its deadline passes.
  struct Waiter {
    int conn;
    std::vector<std::string> keys;
    absl::Time deadline;
    bool is_get;
  };
  std::map<std::string, std::string> data;
  size_t total_bytes = 0;
  std::map<int, Conn> conns;  // by fd
  std::vector<Waiter> waiters;
  std::atomic<bool> stop{false};
  // The server's options and rejection counter, set by Serve before its loop.
  const StoreServerOptions* opt = nullptr;
  std::atomic<int64_t>* rejected = nullptr;

  bool HasAll(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!data.count(k)) return false;
    }
    return true;
  }
  // An error reply; the connection stays open.
  static void Refuse(Conn& c, const std::string& why) { c.out += ReplyFrame(StoreReply::kError, why); }
  // An error reply, then the connection closes (a bad request, or one before authentication).
  void Reject(Conn& c, StoreReply code, const std::string& why);
  // Replies to every waiter whose keys now exist (or whose deadline passed, when `now` is given).
  void ServeWaiters(absl::Time now);
  // False (nothing stored) when the value would take the store over max_total_bytes.
  bool StoreValue(const std::string& key, std::string value);
  bool ReadKey(WireReader& r, std::string* k) const;
  bool ReadKeys(WireReader& r, std::vector<std::string>* keys) const;
  // Handles one complete request payload from connection `fd`.
  void Handle(int fd, Conn& c, absl::string_view payload);
  // The requests after authentication, their opcode read: false for a malformed request, which
  // Handle rejects; otherwise the reply is queued on `c`.
  bool HandleSet(Conn& c, WireReader& r);
  bool HandleGetOrWait(int fd, Conn& c, WireReader& r, bool is_get);
  bool HandleAdd(Conn& c, WireReader& r);
  bool HandleCompareSet(Conn& c, WireReader& r);
  bool HandleCheck(Conn& c, WireReader& r);
  bool HandleDelete(Conn& c, WireReader& r);
  // Accepts every pending connection on `listen_fd` and queues its hello.
  void Accept(int listen_fd);
  // Reads what connection `fd` sent and handles each complete frame; false once the peer is gone.
  bool Receive(int fd, Conn& c, std::vector<char>& buf);
};

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(StoreServerOptions options) {
  SG_CHECK_ARG(options.max_message_bytes >= 1024, "store max_message_bytes must be >= 1024, found ",
               options.max_message_bytes);
  std::unique_ptr<StoreServer> s(new StoreServer());
  s->options_ = std::move(options);
  s->state_ = std::make_unique<State>();
  SG_ASSIGN_OR_RETURN(s->listen_fd_, ListenTcp(s->options_.host, s->options_.port, &s->port_));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  s->wake_read_ = Fd(pipe_fds[0]);
  s->wake_write_ = Fd(pipe_fds[1]);
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

StoreServer::~StoreServer() {
  if (thread_.joinable()) {
    state_->stop = true;
    char c = 1;
    (void)!::write(wake_write_.get(), &c, 1);
    thread_.join();
  }
}

void StoreServer::State::Reject(Conn& c, StoreReply code, const std::string& why) {
  c.out += ReplyFrame(code, why);
  c.closing = true;
  c.in.clear();
  ++*rejected;
}

void StoreServer::State::ServeWaiters(absl::Time now) {
  for (size_t i = 0; i < waiters.size();) {
    Waiter& w = waiters[i];
    auto it = conns.find(w.conn);
    bool ready = HasAll(w.keys);
    if (it != conns.end() && (ready || now >= w.deadline)) {
      WireWriter r;
      if (ready) {
        r.U8(uint8_t(StoreReply::kOk));
        if (w.is_get) r.Str(data[w.keys[0]]);
      } else {
        r.U8(uint8_t(StoreReply::kTimeout));
        std::vector<std::string> missing;
        for (const auto& k : w.keys) {
          if (!data.count(k)) missing.push_back(k);
        }
        r.U32(uint32_t(missing.size()));
        for (const auto& k : missing) r.Str(k);
      }
      it->second.out += r.Frame();
    }
    if (it == conns.end() || ready || now >= w.deadline) {
      waiters.erase(waiters.begin() + i);
    } else {
      ++i;
    }
  }
}

bool StoreServer::State::StoreValue(const std::string& key, std::string value) {
  auto it = data.find(key);
  size_t old = it == data.end() ? 0 : key.size() + it->second.size();
  size_t now = key.size() + value.size();
  if (total_bytes - old + now > opt->max_total_bytes) return false;
  total_bytes = total_bytes - old + now;
  data[key] = std::move(value);
  return true;
}

bool StoreServer::State::ReadKey(WireReader& r, std::string* k) const {
  return r.Str(k) && k->size() <= opt->max_key_bytes;
}

bool StoreServer::State::ReadKeys(WireReader& r, std::vector<std::string>* keys) const {
  uint32_t n;
  if (!r.U32(&n) || n == 0 || n > 65536) return false;
  keys->resize(n);
  for (auto& k : *keys) {
    if (!ReadKey(r, &k)) return false;
  }
  return true;
}

void StoreServer::State::Handle(int fd, Conn& c, absl::string_view payload) {
  WireReader r(payload);
  uint8_t op_byte = 0;
  if (!r.U8(&op_byte)) return Reject(c, StoreReply::kBadRequest, "empty store request");
  StoreOp op = StoreOp(op_byte);
  if (!c.authed) {
    std::string mac;
    if (op != StoreOp::kAuth || !r.Str(&mac) || !r.done()) {
      return Reject(c, StoreReply::kDenied, "store requires authentication before any command (set SG_STORE_SECRET)");
    }
    if (!ConstantTimeEqual(mac, HmacSha256(opt->secret, c.nonce + kAuthContext))) {
      return Reject(c, StoreReply::kDenied, "store authentication failed: wrong secret");
    }
    c.authed = true;
    c.out += ReplyFrame(StoreReply::kOk);
    return;
  }
  bool well_formed = false;
  switch (op) {
    case StoreOp::kSet: well_formed = HandleSet(c, r); break;
    case StoreOp::kGet:
    case StoreOp::kWait: well_formed = HandleGetOrWait(fd, c, r, op == StoreOp::kGet); break;
    case StoreOp::kAdd: well_formed = HandleAdd(c, r); break;
    case StoreOp::kCompareSet: well_formed = HandleCompareSet(c, r); break;
    case StoreOp::kCheck: well_formed = HandleCheck(c, r); break;
    case StoreOp::kDelete: well_formed = HandleDelete(c, r); break;
    default: return Reject(c, StoreReply::kBadRequest, absl::StrCat("unknown store opcode ", int(op_byte)));
  }
  if (!well_formed) {
    Reject(c, StoreReply::kBadRequest,
           absl::StrCat("malformed store request (opcode ", int(op_byte), ", ", payload.size(), " bytes)"));
  }
}

bool StoreServer::State::HandleSet(Conn& c, WireReader& r) {
  std::string key, value;
  if (!ReadKey(r, &key) || !r.Str(&value) || !r.done()) return false;
  if (!StoreValue(key, std::move(value))) {
    Refuse(c, "store is full (max_total_bytes)");
    return true;
  }
  c.out += ReplyFrame(StoreReply::kOk);
  ServeWaiters(absl::InfinitePast());
  return true;
}

bool StoreServer::State::HandleGetOrWait(int fd, Conn& c, WireReader& r, bool is_get) {
  std::string key;
  std::vector<std::string> keys;
  int64_t wait_ms = 0;
  if (is_get ? !ReadKey(r, &key) : !ReadKeys(r, &keys)) return false;
  if (!r.I64(&wait_ms) || !r.done() || wait_ms < 0) return false;
  if (is_get) keys = {key};
  absl::Time deadline = wait_ms == INT64_MAX ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(wait_ms);
  if (is_get && wait_ms == 0 && !data.count(key)) {
    c.out += ReplyFrame(StoreReply::kNotFound);
    return true;
  }
  waiters.push_back({fd, std::move(keys), deadline, is_get});
  ServeWaiters(absl::InfinitePast());
  return true;
}

bool StoreServer::State::HandleAdd(Conn& c, WireReader& r) {
  std::string key;
  int64_t delta = 0;
  if (!ReadKey(r, &key) || !r.I64(&delta) || !r.done()) return false;
  int64_t cur = 0;
  if (auto it = data.find(key); it != data.end()) {
    if (it->second.size() != 8) {
      Refuse(c, absl::StrCat("key holds a ", it->second.size(), "-byte value, not an 8-byte counter"));
      return true;
    }
    std::memcpy(&cur, it->second.data(), 8);
  }
  // A hostile delta must not overflow (undefined behaviour); the counter stays as it was.
  if (__builtin_add_overflow(cur, delta, &cur)) {
    Refuse(c, absl::StrCat("counter overflow: adding ", delta, " to the counter"));
    return true;
  }
  if (!StoreValue(key, std::string(reinterpret_cast<const char*>(&cur), 8))) {
    Refuse(c, "store is full (max_total_bytes)");
    return true;
  }
  WireWriter w;
  w.U8(uint8_t(StoreReply::kOk));
  w.I64(cur);
  c.out += w.Frame();
  ServeWaiters(absl::InfinitePast());
  return true;
}

bool StoreServer::State::HandleCompareSet(Conn& c, WireReader& r) {
  std::string key, expected, desired;
  if (!ReadKey(r, &key) || !r.Str(&expected) || !r.Str(&desired) || !r.done()) return false;
  auto it = data.find(key);
  bool match = it == data.end() ? expected.empty() : it->second == expected;
  if (match && !StoreValue(key, std::move(desired))) {
    Refuse(c, "store is full (max_total_bytes)");
    return true;
  }
  WireWriter w;
  w.U8(uint8_t(StoreReply::kOk));
  w.Str(data.count(key) ? data[key] : std::string());
  c.out += w.Frame();
  ServeWaiters(absl::InfinitePast());
  return true;
}

bool StoreServer::State::HandleCheck(Conn& c, WireReader& r) {
  std::vector<std::string> keys;
  if (!ReadKeys(r, &keys) || !r.done()) return false;
  WireWriter w;
  w.U8(uint8_t(StoreReply::kOk));
  w.U8(HasAll(keys) ? 1 : 0);
  c.out += w.Frame();
  return true;
}

bool StoreServer::State::HandleDelete(Conn& c, WireReader& r) {
  std::string key;
  if (!ReadKey(r, &key) || !r.done()) return false;
  auto it = data.find(key);
  bool existed = it != data.end();
  if (existed) {
    total_bytes -= key.size() + it->second.size();
    data.erase(it);
  }
  WireWriter w;
  w.U8(uint8_t(StoreReply::kOk));
  w.U8(existed ? 1 : 0);
  c.out += w.Frame();
  return true;
}

void StoreServer::State::Accept(int listen_fd) {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (int(conns.size()) >= opt->max_connections) {
      ::close(fd);
      ++*rejected;
      continue;
    }
    Conn& c = conns[fd];
    c.fd = Fd(fd);
    c.accepted = absl::Now();
    c.nonce.resize(kStoreNonceBytes);
    if (::getrandom(&c.nonce[0], kStoreNonceBytes, 0) != ssize_t(kStoreNonceBytes)) {
      // getrandom on Linux does not fail for 32 bytes once booted; fall back to the clock anyway.
      int64_t t = absl::ToUnixNanos(absl::Now());
      std::memcpy(&c.nonce[0], &t, sizeof(t));
    }
    c.authed = opt->secret.empty();
    WireWriter hello;
    hello.Raw(kStoreMagic, 4);
    hello.U8(kStoreProtocolVersion);
    hello.U8(opt->secret.empty() ? 0 : 1);
    hello.Raw(c.nonce.data(), c.nonce.size());
    c.out += hello.Frame();
  }
}

bool StoreServer::State::Receive(int fd, Conn& c, std::vector<char>& buf) {
  ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
  if (n < 0) return true;
  c.in.append(buf.data(), size_t(n));
  // Handle every complete frame in the buffer.
  size_t pos = 0;
  while (!c.closing && c.in.size() - pos >= 4) {
    uint32_t len;
    std::memcpy(&len, c.in.data() + pos, 4);
    if (len > opt->max_message_bytes) {
      Reject(c, StoreReply::kBadRequest,
             absl::StrCat("store message of ", len, " bytes exceeds the limit of ", opt->max_message_bytes, " bytes"));
      break;
    }
    if (c.in.size() - pos - 4 < len) break;
    Handle(fd, c, absl::string_view(c.in).substr(pos + 4, len));
    pos += 4 + size_t(len);
  }
  if (!c.closing) c.in.erase(0, pos);
  return true;
}

void StoreServer::Serve() {
  State& st = *state_;
  const StoreServerOptions& opt = options_;
  st.opt = &opt;
  st.rejected = &rejected_;
  std::vector<pollfd> pfds;
  std::vector<char> buf(1 << 16);
  while (!st.stop) {
    pfds.clear();
    pfds.push_back({wake_read_.get(), POLLIN, 0});
    pfds.push_back({listen_fd_.get(), POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (auto& [fd, c] : st.conns) {
      short events = c.closing ? 0 : POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      pfds.push_back({fd, events, 0});
      if (!c.authed) next = std::min(next, c.accepted + opt.auth_timeout);
    }
    for (const auto& w : st.waiters) next = std::min(next, w.deadline);
    ::poll(pfds.data(), pfds.size(), PollTimeoutMs(next));
    if (st.stop) break;
    if (pfds[1].revents & POLLIN) st.Accept(listen_fd_.get());
    absl::Time now = absl::Now();
    for (size_t i = 2; i < pfds.size(); ++i) {
      int fd = pfds[i].fd;
      State::Conn& c = st.conns[fd];
      bool dead = (pfds[i].revents & (POLLERR | POLLNVAL)) != 0;
      if (!dead && (pfds[i].revents & (POLLIN | POLLHUP)) && !c.closing) dead = !st.Receive(fd, c, buf);
      if (!dead && !c.authed && !c.closing && now >= c.accepted + opt.auth_timeout) {
        st.Reject(c, StoreReply::kDenied, "store authentication timed out");
      }
      if (!dead && !c.out.empty()) {
        ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.out.erase(0, size_t(n));
        if (n < 0 && errno != EAGAIN && errno != EINTR) dead = true;
        // A client that never reads its replies cannot make the server hold unbounded memory.
        if (c.out.size() > 2 * opt.max_message_bytes) dead = true;
      }
      if (dead || (c.closing && c.out.empty())) st.conns.erase(fd);  // waiters dropped below
    }
    st.ServeWaiters(now);
  }
}

// ---------------------------------------------------------------------------------------------
// Client

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(std::string host, int port,
                                                                  std::string secret,
                                                                  absl::Time deadline) {
  std::unique_ptr<StoreClient> c(new StoreClient(std::move(host), port, std::move(secret)));
  absl::MutexLock lock(&c->mu_);
  SG_RETURN_IF_ERROR(c->EnsureConnected(deadline));
  return c;
}

namespace {

absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline, absl::string_view what) {
  uint32_t len = 0;
  SG_RETURN_IF_ERROR(ReadAll(fd, &len, 4, deadline, what));
  if (len > (1u << 31)) {
    return absl::DataLossError(absl::StrCat(what, ": reply of ", len, " bytes is not a store reply"));
  }
  std::string payload(len, '\0');
  SG_RETURN_IF_ERROR(ReadAll(fd, payload.data(), len, deadline, what));
  return payload;
}

absl::Status ErrorReply(StoreReply code, WireReader& r, absl::string_view what,
                        const std::string& address) {
  std::string msg;
  r.Str(&msg);
  if (code == StoreReply::kDenied) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": store ", address, " refused: ", msg));
  }
  if (code == StoreReply::kError) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", msg));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": store ", address, " rejected: ", msg));
}

}  // namespace

absl::Status StoreClient::EnsureConnected(absl::Time deadline) {
  if (fd_.valid()) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(host_, port_, deadline));
  std::string what = absl::StrCat("store handshake with ", address_);
  SG_ASSIGN_OR_RETURN(std::string hello, ReadFrame(fd.get(), deadline, what));
  WireReader r(hello);
  char magic[4];
  uint8_t version = 0, auth = 0;
  std::string nonce(kStoreNonceBytes, '\0');
  if (!r.Raw(magic, 4) || std::memcmp(magic, kStoreMagic, 4) != 0 || !r.U8(&version) ||
      !r.U8(&auth) || !r.Raw(&nonce[0], kStoreNonceBytes)) {
    return absl::DataLossError(absl::StrCat(what, ": the server is not an sgtrain store"));
  }
  if (version != kStoreProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": expected protocol version ",
                                                      int(kStoreProtocolVersion), ", found ",
                                                      int(version)));
  }
  if (auth && secret_.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": the store requires a shared secret; set SG_STORE_SECRET"));
  }
  if (!auth && !secret_.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": SG_STORE_SECRET is set but the store does not authenticate; refusing to talk to "
              "a store that was started without the secret"));
  }
  if (auth) {
    WireWriter w;
    w.U8(uint8_t(StoreOp::kAuth));
    w.Str(HmacSha256(secret_, nonce + kAuthContext));
    std::string frame = w.Frame();
    SG_RETURN_IF_ERROR(WriteAll(fd.get(), frame.data(), frame.size(), deadline, what));
    SG_ASSIGN_OR_RETURN(std::string reply, ReadFrame(fd.get(), deadline, what));
    WireReader rr(reply);
    uint8_t code = 255;
    rr.U8(&code);
    if (StoreReply(code) != StoreReply::kOk) return ErrorReply(StoreReply(code), rr, what, address_);
  }
  fd_ = std::move(fd);
  return absl::OkStatus();
}

absl::StatusOr<std::string> StoreClient::Call(const std::string& payload, absl::Time deadline,
                                              absl::string_view what) {
  SG_RETURN_IF_ERROR(EnsureConnected(deadline));
  WireWriter frame_writer;
  frame_writer.Raw(payload.data(), payload.size());
  std::string frame = frame_writer.Frame();
  absl::Time reply_deadline =
      deadline == absl::InfiniteFuture() ? deadline : deadline + kReplyGrace;
  absl::Status s = WriteAll(fd_.get(), frame.data(), frame.size(), deadline, what);
  absl::StatusOr<std::string> reply = s.ok() ? ReadFrame(fd_.get(), reply_deadline, what)
                                             : absl::StatusOr<std::string>(s);
  if (!reply.ok()) {
    fd_.reset();  // the stream is out of step; reconnect next time
    return absl::Status(reply.status().code(),
                        absl::StrCat(reply.status().message(), " (store ", address_, ")"));
  }
  // The server closes the connection after these replies; reconnect next time.
  if (!reply->empty() && (StoreReply((*reply)[0]) == StoreReply::kBadRequest ||
                          StoreReply((*reply)[0]) == StoreReply::kDenied)) {
    fd_.reset();
  }
  return reply;
}

absl::Status StoreClient::Set(const std::string& key, const std::string& value, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kSet));
  w.Str(key);
  w.Str(value);
  std::string what = absl::StrCat("store set '", key, "'");
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, what));
  WireReader r(reply);
  uint8_t code = 255;
  r.U8(&code);
  if (StoreReply(code) != StoreReply::kOk) return ErrorReply(StoreReply(code), r, what, address_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key, absl::Time deadline) {
  return GetKey(key, std::max<int64_t>(1, WaitMs(deadline)), deadline);
}

absl::StatusOr<std::string> StoreClient::TryGet(const std::string& key, absl::Time deadline) {
  return GetKey(key, 0, deadline);
}

absl::StatusOr<std::string> StoreClient::GetKey(const std::string& key, int64_t wait_ms, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kGet));
  w.Str(key);
  w.I64(wait_ms);
  std::string what = absl::StrCat("store get '", key, "'");
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, what));
  WireReader r(reply);
  uint8_t code = 255;
  std::string value;
  r.U8(&code);
  if (StoreReply(code) == StoreReply::kOk && r.Str(&value)) return value;
  if (StoreReply(code) == StoreReply::kTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": key did not appear before the deadline (store ", address_, ")"));
  }
  if (StoreReply(code) == StoreReply::kNotFound) return absl::NotFoundError(absl::StrCat(what, ": no such key"));
  return ErrorReply(StoreReply(code), r, what, address_);
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kAdd));
  w.Str(key);
  w.I64(delta);
  std::string what = absl::StrCat("store add '", key, "'");
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, what));
  WireReader r(reply);
  uint8_t code = 255;
  int64_t value = 0;
  r.U8(&code);
  if (StoreReply(code) == StoreReply::kOk && r.I64(&value)) return value;
  return ErrorReply(StoreReply(code), r, what, address_);
}

absl::StatusOr<std::string> StoreClient::CompareAndSet(const std::string& key,
                                                       const std::string& expected,
                                                       const std::string& desired,
                                                       absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kCompareSet));
  w.Str(key);
  w.Str(expected);
  w.Str(desired);
  std::string what = absl::StrCat("store compare_and_set '", key, "'");
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, what));
  WireReader r(reply);
  uint8_t code = 255;
  std::string value;
  r.U8(&code);
  if (StoreReply(code) == StoreReply::kOk && r.Str(&value)) return value;
  return ErrorReply(StoreReply(code), r, what, address_);
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys, absl::Time deadline) {
  SG_CHECK_ARG(!keys.empty(), "store wait: expected at least one key, found none");
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kWait));
  w.U32(uint32_t(keys.size()));
  for (const auto& k : keys) w.Str(k);
  w.I64(std::max<int64_t>(1, WaitMs(deadline)));
  std::string what = absl::StrCat("store wait for ", keys.size(), " key(s)");
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, what));
  WireReader r(reply);
  uint8_t code = 255;
  r.U8(&code);
  if (StoreReply(code) == StoreReply::kOk) return absl::OkStatus();
  if (StoreReply(code) == StoreReply::kTimeout) {
    uint32_t n = 0;
    std::vector<std::string> missing;
    if (r.U32(&n)) {
      for (uint32_t i = 0; i < n && i < 16; ++i) {
        std::string k;
        if (r.Str(&k)) missing.push_back("'" + k + "'");
      }
    }
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": still missing ", n, " key(s) at the deadline: ",
                     absl::StrJoin(missing, ", "), n > 16 ? ", ..." : "", " (store ", address_, ")"));
  }
  return ErrorReply(StoreReply(code), r, what, address_);
}

absl::StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys, absl::Time deadline) {
  SG_CHECK_ARG(!keys.empty(), "store check: expected at least one key, found none");
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kCheck));
  w.U32(uint32_t(keys.size()));
  for (const auto& k : keys) w.Str(k);
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, "store check"));
  WireReader r(reply);
  uint8_t code = 255, present = 0;
  r.U8(&code);
  if (StoreReply(code) == StoreReply::kOk && r.U8(&present)) return present != 0;
  return ErrorReply(StoreReply(code), r, "store check", address_);
}

absl::StatusOr<bool> StoreClient::Delete(const std::string& key, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  WireWriter w;
  w.U8(uint8_t(StoreOp::kDelete));
  w.Str(key);
  std::string what = absl::StrCat("store delete '", key, "'");
  SG_ASSIGN_OR_RETURN(std::string reply, Call(w.payload(), deadline, what));
  WireReader r(reply);
  uint8_t code = 255, existed = 0;
  r.U8(&code);
  if (StoreReply(code) == StoreReply::kOk && r.U8(&existed)) return existed != 0;
  return ErrorReply(StoreReply(code), r, what, address_);
}

// ---------------------------------------------------------------------------------------------
// Rendezvous

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Create(const RankInfo& info,
                                                               absl::Time deadline) {
  auto r = std::make_unique<Rendezvous>();
  r->info_ = info;
  if (info.rank == 0 && !info.external_store) {
    StoreServerOptions opt;
    opt.host = info.bind_addr;
    opt.port = info.master_port;
    opt.secret = info.secret;
    absl::StatusOr<std::unique_ptr<StoreServer>> server = StoreServer::Start(opt);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("rank 0 could not host the store on ", info.bind_addr, ":",
                                       info.master_port, ": ", server.status().message()));
    }
    r->server_ = std::move(server).value();
  }
  SG_ASSIGN_OR_RETURN(r->client_,
                      StoreClient::Connect(info.master_addr, info.master_port, info.secret, deadline));
  return r;
}

absl::Status Rendezvous::Finalize(absl::Time deadline) {
  SG_ASSIGN_OR_RETURN(int64_t arrived, client_->Add("rdzv/finalize/count", 1, deadline));
  if (arrived == info_.world_size) SG_RETURN_IF_ERROR(client_->Set("rdzv/finalize/done", "1", deadline));
  if (info_.rank == 0) {
    absl::Status s = client_->Wait({"rdzv/finalize/done"}, deadline);
    if (!s.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous finalize: only ", arrived, " of ", info_.world_size,
          " ranks had arrived when rank 0 started waiting, and not all arrived by the deadline: ",
          s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace sg::comm
