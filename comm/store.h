// The rendezvous store: a small TCP key-value server (hosted by rank 0) and its client, used to
// exchange transport addresses, NCCL ids, progress counters and abort flags. Like torchrun's
// TCPStore, with every call bounded by a deadline and an optional shared secret.
//
//   SG_ASSIGN_OR_RETURN(auto rdzv, sg::comm::Rendezvous::Create(info, absl::Now() + absl::Seconds(30)));
//   SG_RETURN_IF_ERROR(rdzv->store().Set("addr/0", my_address, deadline));
//   SG_ASSIGN_OR_RETURN(std::string a1, rdzv->store().Get("addr/1", deadline));  // waits for the key
//
// Protocol: see store_wire.h. The server is one thread polling every connection; a malformed,
// oversized or unauthenticated message gets an error reply and that connection is closed, while
// other clients keep being served. With a secret, the server sends a random nonce on accept and the
// client must answer HMAC-SHA-256(secret, nonce) before any command; the secret never travels.
#ifndef SGTRAIN_COMM_STORE_H_
#define SGTRAIN_COMM_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/env.h"
#include "comm/socket.h"

namespace sg::comm {

struct StoreServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;               // 0 picks a free port; see StoreServer::port()
  std::string secret;         // empty: no authentication
  size_t max_message_bytes = 64 << 20;  // larger frames are rejected
  size_t max_key_bytes = 4096;
  size_t max_total_bytes = size_t(1) << 30;  // keys + values held; a Set beyond it is refused
  int max_connections = 4096;
  absl::Duration auth_timeout = absl::Seconds(10);  // an unauthenticated connection is dropped after
};

class StoreServer {
 public:
  // Binds and starts serving on a background thread.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(StoreServerOptions options);
  ~StoreServer();  // stops the thread and closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Connections closed for a protocol violation (malformed, oversized, failed authentication).
  int64_t rejected_connections() const { return rejected_.load(); }

 private:
  StoreServer() = default;
  void Serve();
  struct State;
  std::unique_ptr<State> state_;
  StoreServerOptions options_;
  Fd listen_fd_;
  Fd wake_read_, wake_write_;
  int port_ = 0;
  std::atomic<int64_t> rejected_{0};
  std::thread thread_;
};

// A connection to a StoreServer. Thread-safe (one request at a time). After an I/O error the next
// call reconnects, so a timed-out wait does not poison the client.
class StoreClient {
 public:
  // Connects (retrying until `deadline` while the server is not up yet) and authenticates.
  static absl::StatusOr<std::unique_ptr<StoreClient>> Connect(std::string host, int port,
                                                              std::string secret, absl::Time deadline);

  absl::Status Set(const std::string& key, const std::string& value, absl::Time deadline);
  // Waits until `key` exists, then returns its value; DeadlineExceeded naming the key otherwise.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline);
  // The value if `key` exists now, NotFound otherwise; does not wait.
  absl::StatusOr<std::string> TryGet(const std::string& key, absl::Time deadline);
  // Adds `delta` to the integer stored at `key` (absent counts as 0) and returns the new value.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta, absl::Time deadline);
  // Sets `key` to `desired` if its value is `expected` ("" matches an absent key); returns the value
  // after the operation either way.
  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired, absl::Time deadline);
  // Waits until every key exists. DeadlineExceeded lists the keys still missing.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Time deadline);
  // Whether every key exists now.
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys, absl::Time deadline);
  // Deletes `key`; returns whether it existed.
  absl::StatusOr<bool> Delete(const std::string& key, absl::Time deadline);

  const std::string& address() const { return address_; }

 private:
  StoreClient(std::string host, int port, std::string secret)
      : host_(std::move(host)), port_(port), secret_(std::move(secret)),
        address_(host_ + ":" + std::to_string(port_)) {}
  absl::Status EnsureConnected(absl::Time deadline);
  // Get and TryGet: a get that the server holds up to wait_ms for the key (0: answers at once).
  absl::StatusOr<std::string> GetKey(const std::string& key, int64_t wait_ms, absl::Time deadline);
  // Sends one request payload, reads the reply payload. Server-side waits get `wait_ms`; the
  // client allows that plus a grace period for the reply to arrive.
  absl::StatusOr<std::string> Call(const std::string& payload, absl::Time deadline,
                                   absl::string_view what);

  absl::Mutex mu_;  // one request at a time on the connection
  std::string host_;
  int port_;
  std::string secret_;
  std::string address_;
  Fd fd_;
};

// Rank 0 hosts the server (on info.bind_addr:info.master_port) unless info.external_store (the
// launcher serves it); every rank, rank 0 included, holds a client to info.master_addr:info.master_port.
class Rendezvous {
 public:
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Create(const RankInfo& info, absl::Time deadline);
  const RankInfo& info() const { return info_; }
  StoreClient& store() { return *client_; }
  // Every rank calls this before exiting: rank 0 waits until all ranks have arrived before its
  // server goes away, so late ranks do not lose the store under their feet.
  absl::Status Finalize(absl::Time deadline);

 private:
  RankInfo info_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_STORE_H_
