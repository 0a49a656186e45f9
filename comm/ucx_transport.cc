#include "comm/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/status.h"

// Turns a failed UCX call into a status with the call, file:line and UCX's own error string.
#define SG_UCX_RETURN_IF_ERROR(call)                                                          \
  do {                                                                                        \
    ucs_status_t sg_ucx_status_ = (call);                                                     \
    if (sg_ucx_status_ != UCS_OK)                                                             \
      return ::sg::LibraryError(absl::StatusCode::kInternal, "UCX", int(sg_ucx_status_),      \
                                ucs_status_string(sg_ucx_status_), #call, __FILE__, __LINE__); \
  } while (0)

namespace sg::comm {
namespace {

// The UCX tag carries the sender's rank in its top bits, so a receive can name its source.
constexpr int kRankShift = kTransportTagBits;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t(0);

ucp_tag_t WireTag(int sender, uint64_t tag) { return (ucp_tag_t(sender) << kRankShift) | tag; }

// RAII owners of the ucp handles. Destruction order in Impl: endpoints, worker, context.
struct ContextDeleter {
  void operator()(ucp_context* c) const { ucp_cleanup(c); }
};
struct WorkerDeleter {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
using UcpContext = std::unique_ptr<ucp_context, ContextDeleter>;
using UcpWorker = std::unique_ptr<ucp_worker, WorkerDeleter>;

}  // namespace

struct UcxTransport::Impl {
  UcpContext context;
  UcpWorker worker;
  std::vector<ucp_ep_h> endpoints;  // by peer rank
  // Set by the endpoint error callback: a peer's connection failed.
  std::vector<ucs_status_t> peer_error;
  int rank = 0;

  ~Impl() {
    // Force-close endpoints (no flush: peers may be gone), progressing until each close completes
    // or a short grace period passes.
    for (ucp_ep_h& ep : endpoints) {
      if (ep == nullptr) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
      if (req != nullptr && UCS_PTR_IS_PTR(req)) {
        absl::Time deadline = absl::Now() + absl::Seconds(1);
        while (ucp_request_check_status(req) == UCS_INPROGRESS && absl::Now() < deadline) {
          ucp_worker_progress(worker.get());
        }
        ucp_request_free(req);
      }
      ep = nullptr;
    }
  }
};

namespace {

void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* impl = static_cast<UcxTransport::Impl*>(arg);
  for (size_t peer = 0; peer < impl->endpoints.size(); ++peer) {
    if (impl->endpoints[peer] == ep) impl->peer_error[peer] = status;
  }
}

// One UCX send or receive. The progress-loop helper: Test() progresses the worker, then classifies
// the request as pending, done (checking the received length), or failed.
class UcxRequest : public TransportRequest {
 public:
  UcxRequest(UcxTransport::Impl* impl, ucs_status_ptr_t req, bool is_send, int peer, uint64_t tag,
             size_t bytes)
      : impl_(impl), req_(req), is_send_(is_send), peer_(peer), tag_(tag), bytes_(bytes) {}
  ~UcxRequest() override {
    if (req_ == nullptr) return;
    if (ucp_request_check_status(req_) == UCS_INPROGRESS) {
      ucp_request_cancel(impl_->worker.get(), req_);
      absl::Time deadline = absl::Now() + absl::Seconds(1);
      while (ucp_request_check_status(req_) == UCS_INPROGRESS && absl::Now() < deadline) {
        ucp_worker_progress(impl_->worker.get());
      }
    }
    ucp_request_free(req_);
  }

  // Completed immediately (no request object), with the received length when it is a receive.
  void SetImmediate(ucs_status_t status, size_t received) {
    immediate_ = true;
    final_ = status;
    received_ = received;
  }

  absl::StatusOr<bool> Test() override {
    if (!immediate_) {
      ucp_worker_progress(impl_->worker.get());
      ucs_status_t s;
      if (is_send_) {
        s = ucp_request_check_status(req_);
      } else {
        ucp_tag_recv_info_t info{};
        s = ucp_tag_recv_request_test(req_, &info);
        received_ = info.length;
      }
      if (s == UCS_INPROGRESS) {
        if (impl_->peer_error[peer_] != UCS_OK) {
          return absl::UnavailableError(absl::StrCat(Describe(), ": connection to rank ", peer_,
                                                     " failed (",
                                                     ucs_status_string(impl_->peer_error[peer_]),
                                                     ")"));
        }
        return false;
      }
      final_ = s;
      immediate_ = true;
      ucp_request_free(req_);
      req_ = nullptr;
    }
    if (final_ != UCS_OK) {
      return absl::UnavailableError(
          absl::StrCat(Describe(), " failed: UCX error ", int(final_), " (", ucs_status_string(final_),
                       ")", final_ == UCS_ERR_MESSAGE_TRUNCATED ? ": the sender's message is larger"
                                                                : ""));
    }
    if (!is_send_ && received_ != bytes_) {
      return absl::DataLossError(absl::StrCat(Describe(), ": expected ", bytes_,
                                              " bytes, received ", received_));
    }
    return true;
  }

  std::string Describe() const override {
    return absl::StrFormat("ucx %s %d B %s rank %d tag 0x%x", is_send_ ? "send" : "recv", bytes_,
                           is_send_ ? "to" : "from", peer_, tag_);
  }

 private:
  UcxTransport::Impl* impl_;
  ucs_status_ptr_t req_;
  bool is_send_;
  int peer_;
  uint64_t tag_;
  size_t bytes_;
  bool immediate_ = false;
  ucs_status_t final_ = UCS_OK;
  size_t received_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(StoreClient& store,
                                                                   const std::string& prefix,
                                                                   int rank, int world_size,
                                                                   absl::Time deadline) {
  SG_CHECK_ARG(world_size >= 1 && world_size < (1 << (64 - kRankShift)),
               "ucx transport: world size must be in [1, 65536), found ", world_size);
  SG_CHECK_ARG(rank >= 0 && rank < world_size, "ucx transport: rank must be in [0, ", world_size,
               "), found ", rank);
  std::unique_ptr<UcxTransport> t(new UcxTransport());
  t->rank_ = rank;
  t->world_size_ = world_size;
  t->impl_ = std::make_unique<Impl>();
  Impl& impl = *t->impl_;
  impl.rank = rank;

  ucp_config_t* raw_config = nullptr;
  SG_UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &raw_config));
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw_config);
  // SG_UCX_TLS picks transports without touching UCX_TLS for other UCX users in the process.
  if (const char* tls = std::getenv("SG_UCX_TLS"); tls != nullptr && *tls != '\0') {
    SG_UCX_RETURN_IF_ERROR(ucp_config_modify(config.get(), "TLS", tls));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h context = nullptr;
  SG_UCX_RETURN_IF_ERROR(ucp_init(&params, config.get(), &context));
  impl.context.reset(context);

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  SG_UCX_RETURN_IF_ERROR(ucp_worker_create(context, &wparams, &worker));
  impl.worker.reset(worker);

  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  SG_UCX_RETURN_IF_ERROR(ucp_worker_get_address(worker, &address, &address_len));
  std::string mine(reinterpret_cast<const char*>(address), address_len);
  ucp_worker_release_address(worker, address);

  auto key = [&](int r) { return absl::StrCat(prefix, "/ucx/", r); };
  SG_RETURN_IF_ERROR(store.Set(key(rank), mine, deadline));
  impl.endpoints.assign(world_size, nullptr);
  impl.peer_error.assign(world_size, UCS_OK);
  for (int peer = 0; peer < world_size; ++peer) {
    std::string theirs = mine;
    if (peer != rank) {
      absl::StatusOr<std::string> got = store.Get(key(peer), deadline);
      if (!got.ok()) {
        return absl::Status(got.status().code(),
                            absl::StrCat("ucx transport '", prefix, "': rank ", rank,
                                         " did not receive rank ", peer,
                                         "'s worker address: ", got.status().message()));
      }
      theirs = *std::move(got);
    }
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(theirs.data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = OnEndpointError;
    ep_params.err_handler.arg = &impl;
    SG_UCX_RETURN_IF_ERROR(ucp_ep_create(worker, &ep_params, &impl.endpoints[peer]));
  }
  return t;
}

UcxTransport::~UcxTransport() = default;

absl::StatusOr<std::unique_ptr<TransportRequest>> UcxTransport::ISend(int peer, uint64_t tag,
                                                                      const void* data,
                                                                      size_t bytes) {
  SG_RETURN_IF_ERROR(CheckPeerAndTag(*this, "send", peer, tag));
  ucp_request_param_t param{};
  ucs_status_ptr_t r =
      ucp_tag_send_nbx(impl_->endpoints[peer], data, bytes, WireTag(rank_, tag), &param);
  auto req = std::make_unique<UcxRequest>(impl_.get(), UCS_PTR_IS_PTR(r) ? r : nullptr,
                                          /*is_send=*/true, peer, tag, bytes);
  if (!UCS_PTR_IS_PTR(r)) req->SetImmediate(UCS_PTR_STATUS(r), bytes);
  return std::unique_ptr<TransportRequest>(std::move(req));
}

absl::StatusOr<std::unique_ptr<TransportRequest>> UcxTransport::IRecv(int peer, uint64_t tag,
                                                                      void* data, size_t bytes) {
  SG_RETURN_IF_ERROR(CheckPeerAndTag(*this, "recv", peer, tag));
  // Always get a request object: the received length then comes from one place
  // (ucp_tag_recv_request_test); immediate completion's recv_info proved unreliable in UCX 1.13.
  ucp_tag_recv_info_t info{};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  ucs_status_ptr_t r =
      ucp_tag_recv_nbx(impl_->worker.get(), data, bytes, WireTag(peer, tag), kFullMask, &param);
  auto req = std::make_unique<UcxRequest>(impl_.get(), UCS_PTR_IS_PTR(r) ? r : nullptr,
                                          /*is_send=*/false, peer, tag, bytes);
  if (!UCS_PTR_IS_PTR(r)) req->SetImmediate(UCS_PTR_STATUS(r), info.length);
  return std::unique_ptr<TransportRequest>(std::move(req));
}

absl::Status UcxTransport::Progress() {
  while (ucp_worker_progress(impl_->worker.get()) != 0) {
  }
  return absl::OkStatus();
}

std::string UcxTransport::Describe(int peer) const {
  if (peer < 0 || peer >= world_size_) return "no such peer";
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == nullptr) return "?";
  ucp_ep_print_info(impl_->endpoints[peer], f);
  std::fclose(f);
  std::string out(text, len);
  std::free(text);
  return out;
}

}  // namespace sg::comm
