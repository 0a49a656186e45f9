// A pipeline stage's messages to its neighbours: micro-batch i's activation to stage s+1 and its
// gradient to stage s-1 (and the same from them), one buffer per micro-batch and direction, kept
// for the step's length (a received activation is also the input of the recomputing backward).
//
//   SG_ASSIGN_OR_RETURN(auto link, StageLink::Create(pp, spec, micro, act_shape, act_dtype, compute, opt));
//   SG_RETURN_IF_ERROR(link->PostRecv(StageLink::kActivation, 0));
//   SG_ASSIGN_OR_RETURN(TensorView h_in, link->Received(StageLink::kActivation, 0));   // F(0)'s input
//   ... compute on `compute` ...
//   SG_RETURN_IF_ERROR(link->PostSend(StageLink::kActivation, 0, h_out));
//   SG_RETURN_IF_ERROR(link->Finish());   // every send done (end of the step)
//
// Two paths, chosen at Create:
//  - device (CUDA with the NCCL transport): buffers on the device; a send copies the value on the
//    compute stream, orders the communication stream after it (ProcessGroup::OrderBeforeP2P) and
//    posts the Send; receives are posted as they are known; Received makes the compute stream wait
//    for the transfers posted so far (OrderAfterP2P). Nothing blocks the host until Finish. The
//    sends and receives posted between two Received calls start together as one NCCL group, so
//    the caller posts, after each action, its send together with the next action's receive (the
//    Megatron pairing: send-forward with receive-backward and so on), which cannot deadlock the
//    in-order communication streams of two neighbours: NCCL progresses the operations of one
//    group independently. A value sent while the next action needs no receive (stage 0's warm-up
//    forwards, the last stage's backward slots) is not waited for: it overlaps the next compute.
//  - host (the CPU, or CUDA without NCCL): buffers in host memory over UCX; a send copies to the
//    host and synchronizes the compute stream first; Received waits with the deadline.
// Messages of micro-batch i: tag base + 2i (activation), base + 2i + 1 (gradient). Errors name the
// stage, the micro-batch, the direction and the peer; waits end at the step's deadline.
#ifndef SGTRAIN_COMPILER_PIPELINE_STAGE_LINK_H_
#define SGTRAIN_COMPILER_PIPELINE_STAGE_LINK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "compiler/pipeline/stage.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

class StageLink {
 public:
  enum Kind { kActivation = 0, kGradient = 1 };
  struct Options {
    uint64_t tag_base = uint64_t(1) << 34;
    absl::Duration timeout = absl::Seconds(300);
    bool device_transfers = true;  // use the device path when the device and build allow it
  };

  // `pp`: the pipeline group (stage s is rank s). The compute stream must outlive the link.
  static absl::StatusOr<std::unique_ptr<StageLink>> Create(comm::ProcessGroup* pp, const StageSpec& spec, int micro,
                                                           const Shape& shape, DType dtype, const Stream& compute,
                                                           const Options& options);

  bool device_path() const { return device_; }
  // Posts the receive of micro-batch i's activation (from s-1) or gradient (from s+1).
  absl::Status PostRecv(Kind kind, int i);
  // Sends `value` (on the compute stream's device, shape's element count) as micro-batch i's
  // activation (to s+1) or gradient (to s-1).
  absl::Status PostSend(Kind kind, int i, const TensorView& value);
  // Micro-batch i's received value, usable by work queued on the compute stream from now on
  // (device: the stream waits for it; host: the host waited). Valid until the next step.
  absl::StatusOr<TensorView> Received(Kind kind, int i);
  // Waits (host, deadline) for every send and receive of the step.
  absl::Status Finish();

 private:
  struct Pending {
    comm::Request request;
    std::string what;
  };
  StageLink() = default;
  int Peer(Kind kind, bool send) const;
  std::string What(Kind kind, int i, bool send) const;
  TensorView& Buffer(Kind kind, bool send, int i) { return views_[size_t(((int(kind) * 2 + int(send)) * micro_) + i)]; }

  comm::ProcessGroup* pp_ = nullptr;
  StageSpec spec_;
  int micro_ = 1;
  Shape shape_;
  const Stream* compute_ = nullptr;
  Options options_;
  bool device_ = false;
  std::vector<Tensor> buffers_;
  std::vector<TensorView> views_;  // [kind][send][micro]
  std::vector<Pending> sends_, recvs_;
  std::vector<int> recv_index_;  // [kind * micro + i] -> index in recvs_, or -1
};

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_PIPELINE_STAGE_LINK_H_
