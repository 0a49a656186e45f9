#include "compiler/pipeline/pipeline.h"

#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

// The interpreter's values are doubles; they cross a stage boundary as their raw 8 bytes (an i64
// view), so the pipeline reproduces the single-process result bit for bit up to summation order.
TensorView Wire(graph::HostTensor& t) {
  return TensorView(t.data.data(), DType::kI64, {int64_t(t.data.size())}, Device::Cpu());
}

struct PendingSend {
  std::unique_ptr<graph::HostTensor> buffer;
  comm::Request request;
  std::string what;
};

}  // namespace

absl::StatusOr<PipelineStepResult> RunPipelineStep(StageExecutor& stage, comm::ProcessGroup& pg,
                                                   const std::vector<graph::Feeds>& micro_batches,
                                                   const PipelineOptions& options) {
  const StageSpec& spec = stage.spec();
  const int m = int(micro_batches.size());
  SG_CHECK_ARG(m >= 1, "pipeline step: expected at least one micro-batch");
  SG_CHECK_ARG(pg.size() == spec.num_stages && pg.rank() == spec.stage, "pipeline step: rank ", pg.rank(),
               " of a group of ", pg.size(), " cannot run stage ", spec.stage, " of ", spec.num_stages);
  SG_CHECK_ARG(options.activation_shape.size() == 3, "pipeline step: activation_shape must be [micro_batch, seq, dim], found ",
               ShapeToString(options.activation_shape));
  const int me = spec.stage;
  stage.ZeroGrads();
  PipelineStepResult result;
  std::map<int, graph::Feeds> stash;  // stage inputs of micro-batches in flight
  std::deque<PendingSend> sends;
  double loss_sum = 0;

  auto receive = [&](int peer, uint64_t tag, const std::string& what) -> absl::StatusOr<graph::HostTensor> {
    graph::HostTensor t = graph::HostTensor::Zeros(options.activation_shape, DType::kF32);
    SG_ASSIGN_OR_RETURN(comm::Request r, pg.Recv(Wire(t), peer, tag));
    absl::Status s = r.Wait(absl::Now() + options.timeout);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(pg.name(), " pipeline stage ", me, ": receiving ", what,
                                                 " from stage ", peer, ": ", s.message()));
    }
    return t;
  };
  auto send = [&](graph::HostTensor t, int peer, uint64_t tag, const std::string& what) -> absl::Status {
    SG_CHECK_ARG(NumElements(t.shape) == NumElements(options.activation_shape), "pipeline stage ", me, ": ", what,
                 " has shape ", ShapeToString(t.shape), ", the boundary carries ",
                 ShapeToString(options.activation_shape));
    PendingSend p;
    p.buffer = std::make_unique<graph::HostTensor>(std::move(t));
    p.what = absl::StrCat(what, " to stage ", peer);
    SG_ASSIGN_OR_RETURN(p.request, pg.Send(Wire(*p.buffer), peer, tag));
    sends.push_back(std::move(p));
    return absl::OkStatus();
  };

  SG_RETURN_IF_ERROR(pg.Barrier());
  const absl::Time t0 = absl::Now();
  auto since = [&](absl::Time t) { return absl::ToDoubleSeconds(t - t0); };
  for (const PipelineAction& a : OneFOneBSchedule(spec.num_stages, me, m)) {
    const int i = a.micro;
    const uint64_t act_tag = options.tag + 2 * uint64_t(i), grad_tag = act_tag + 1;
    Interval busy;
    if (a.kind == PipelineAction::Kind::kForward) {
      graph::Feeds in = micro_batches[size_t(i)];
      if (!spec.first()) {
        SG_ASSIGN_OR_RETURN(in["h_in"], receive(me - 1, act_tag, absl::StrCat("activation of micro-batch ", i)));
      }
      busy.start = since(absl::Now());
      SG_ASSIGN_OR_RETURN(graph::HostTensor out, stage.Forward(in));
      busy.end = since(absl::Now());
      if (spec.last()) {
        loss_sum += out.data.at(0);
      } else {
        SG_RETURN_IF_ERROR(send(std::move(out), me + 1, act_tag, absl::StrCat("activation of micro-batch ", i)));
      }
      stash[i] = std::move(in);
    } else {
      graph::HostTensor cot;
      if (!spec.last()) {
        SG_ASSIGN_OR_RETURN(cot, receive(me + 1, grad_tag, absl::StrCat("gradient of micro-batch ", i)));
      }
      busy.start = since(absl::Now());
      SG_ASSIGN_OR_RETURN(graph::HostTensor g, stage.Backward(stash.at(i), spec.last() ? nullptr : &cot));
      busy.end = since(absl::Now());
      stash.erase(i);
      if (!spec.first()) {
        SG_RETURN_IF_ERROR(send(std::move(g), me - 1, grad_tag, absl::StrCat("gradient of micro-batch ", i)));
      }
    }
    result.actions.push_back(a);
    result.times.push_back(busy);
    // Retire finished sends so their buffers do not pile up.
    while (!sends.empty()) {
      SG_ASSIGN_OR_RETURN(bool done, sends.front().request.Test());
      if (!done) break;
      sends.pop_front();
    }
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  for (PendingSend& p : sends) {
    absl::Status s = p.request.Wait(deadline);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(pg.name(), " pipeline stage ", me, ": sending ", p.what, ": ",
                                                 s.message()));
    }
  }
  result.grads = stage.grads();
  for (auto& [name, g] : result.grads) {
    for (double& x : g.data) x /= m;
  }
  result.loss = loss_sum / m;
  return result;
}

}  // namespace sg::compiler
