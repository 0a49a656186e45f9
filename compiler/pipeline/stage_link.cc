#include "compiler/pipeline/stage_link.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::compiler {

absl::StatusOr<std::unique_ptr<StageLink>> StageLink::Create(comm::ProcessGroup* pp, const StageSpec& spec, int micro,
                                                             const Shape& shape, DType dtype, const Stream& compute,
                                                             const Options& options) {
  SG_CHECK_ARG(pp != nullptr && pp->size() == spec.num_stages && pp->rank() == spec.stage,
               "stage link: the pipeline group must have one rank per stage (", spec.num_stages,
               ") with stage ", spec.stage, " as its rank ", spec.stage);
  SG_CHECK_ARG(micro >= 1, "stage link: micro-batches must be >= 1, found ", micro);
  std::unique_ptr<StageLink> l(new StageLink());
  l->pp_ = pp;
  l->spec_ = spec;
  l->micro_ = micro;
  l->shape_ = shape;
  l->compute_ = &compute;
  l->options_ = options;
#ifdef SG_WITH_NCCL
  l->device_ = options.device_transfers && compute.device().is_cuda();
#endif
  const Device where = l->device_ ? compute.device() : Device::Cpu();
  l->views_.resize(size_t(4 * micro));
  l->recv_index_.assign(size_t(2 * micro), -1);
  for (Kind kind : {kActivation, kGradient}) {
    for (bool send : {false, true}) {
      // Activations come from s-1 and go to s+1; gradients the other way.
      if (l->Peer(kind, send) < 0) continue;
      for (int i = 0; i < micro; ++i) {
        SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, dtype, where));
        l->Buffer(kind, send, i) = t.view();
        l->buffers_.push_back(std::move(t));
      }
    }
  }
  return l;
}

int StageLink::Peer(Kind kind, bool send) const {
  const bool forward = (kind == kActivation) == send;  // towards s+1
  const int peer = spec_.stage + (forward ? 1 : -1);
  return peer >= 0 && peer < spec_.num_stages ? peer : -1;
}

std::string StageLink::What(Kind kind, int i, bool send) const {
  return absl::StrCat(kind == kActivation ? "activation" : "gradient", " of micro-batch ", i, send ? " to" : " from",
                      " stage ", Peer(kind, send));
}

absl::Status StageLink::PostRecv(Kind kind, int i) {
  SG_CHECK_ARG(Peer(kind, false) >= 0 && i >= 0 && i < micro_, "pipeline stage ", spec_.stage, ": no ",
               kind == kActivation ? "activation" : "gradient", " of micro-batch ", i, " to receive");
  int& at = recv_index_[size_t(int(kind) * micro_ + i)];
  if (at >= 0) return absl::OkStatus();
  Pending p;
  p.what = What(kind, i, false);
  SG_ASSIGN_OR_RETURN(p.request, pp_->Recv(Buffer(kind, false, i), Peer(kind, false),
                                           options_.tag_base + 2 * uint64_t(i) + uint64_t(kind)));
  at = int(recvs_.size());
  recvs_.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status StageLink::PostSend(Kind kind, int i, const TensorView& value) {
  SG_CHECK_ARG(Peer(kind, true) >= 0 && i >= 0 && i < micro_, "pipeline stage ", spec_.stage, ": no ",
               kind == kActivation ? "activation" : "gradient", " of micro-batch ", i, " to send");
  const TensorView& buffer = Buffer(kind, true, i);
  SG_ASSIGN_OR_RETURN(TensorView v, value.Reshape(shape_));
  SG_RETURN_IF_ERROR(CopyTensor(v, buffer, *compute_));
  if (device_) {
    SG_RETURN_IF_ERROR(pp_->OrderBeforeP2P(*compute_));
  } else {
    SG_RETURN_IF_ERROR(compute_->Synchronize());
  }
  Pending p;
  p.what = What(kind, i, true);
  SG_ASSIGN_OR_RETURN(p.request, pp_->Send(buffer, Peer(kind, true), options_.tag_base + 2 * uint64_t(i) + uint64_t(kind)));
  sends_.push_back(std::move(p));
  return absl::OkStatus();
}

absl::StatusOr<TensorView> StageLink::Received(Kind kind, int i) {
  SG_RETURN_IF_ERROR(PostRecv(kind, i));
  Pending& p = recvs_[size_t(recv_index_[size_t(int(kind) * micro_ + i)])];
  if (device_) {
    SG_RETURN_IF_ERROR(pp_->OrderAfterP2P(*compute_));
  } else {
    absl::Status s = p.request.Wait(absl::Now() + options_.timeout);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(pp_->name(), " pipeline stage ", spec_.stage, ": receiving ", p.what,
                                                 ": ", s.message()));
    }
  }
  return Buffer(kind, false, i);
}

absl::Status StageLink::Finish() {
  if (device_) SG_RETURN_IF_ERROR(pp_->OrderAfterP2P(*compute_));
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (std::vector<Pending>* list : {&recvs_, &sends_}) {
    for (Pending& p : *list) {
      absl::Status s = p.request.Wait(deadline);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(pp_->name(), " pipeline stage ", spec_.stage, ": ",
                                                    list == &sends_ ? "sending " : "receiving ", p.what, ": ",
                                                    s.message()));
      }
    }
    list->clear();
  }
  recv_index_.assign(recv_index_.size(), -1);
  return absl::OkStatus();
}

}  // namespace sg::compiler
