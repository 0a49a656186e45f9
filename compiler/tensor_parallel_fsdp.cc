#include "compiler/tensor_parallel_fsdp.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/data_parallel_graph.h"
#include "compiler/host_tensor_check.h"
#include "compiler/fsdp_internal.h"  // Param and Unit: complete for the base's members
#include "compiler/tensor_parallel_steps.h"
#include "kernels/core/status.h"

namespace sg::compiler {

TensorParallelFsdpStep::~TensorParallelFsdpStep() {
  // The executor's steps point into this object's events and buffers: stop it first.
  if (executor_ != nullptr) (void)Wait();
  executor_.reset();
}

absl::StatusOr<std::unique_ptr<TensorParallelFsdpStep>> TensorParallelFsdpStep::Create(
    const graph::Graph& train, const CompileOptions& o, comm::ProcessGroup* tp, comm::ProcessGroup* dp,
    comm::ProcessGroup* all, std::shared_ptr<DistContext> context, std::string explanation) {
  std::unique_ptr<TensorParallelFsdpStep> s(new TensorParallelFsdpStep());
  TensorParallelFsdpStep* self = s.get();
  s->tp_group_ = tp;
  s->tp_size_ = tp != nullptr ? tp->size() : 1;
  s->tp_rank_ = tp != nullptr ? tp->rank() : 0;
  s->tp_steps_ = std::make_unique<TpStepResources>();
  SG_ASSIGN_OR_RETURN(Event ready, Event::Create(o.device));
  s->tp_ready_ = std::make_unique<Event>(std::move(ready));
  DataParallelLayout layout;
  layout.shard = dp;
  layout.world = dp;  // the ranks with distinct shares of the batch
  layout.norm_group = all;
  layout.counts_in_norm = [self](const std::string& param) { return self->tp_rank_ == 0 || self->split_.count(param) > 0; };
  const bool vocab_parallel = o.tp_vocab_parallel;
  layout.rewrite_graph = [self, vocab_parallel](DataParallelGraph g) -> absl::StatusOr<DataParallelGraph> {
    TensorParallelGraphOptions go;
    go.vocab_parallel = vocab_parallel;
    go.keep_backward_copies = true;  // gathered again for backward, as FSDP does
    SG_ASSIGN_OR_RETURN(self->tp_, BuildTensorParallelGraph(g, self->tp_size_, self->tp_rank_, go));
    for (const TpParam& p : self->tp_.params) {
      if (p.dim >= 0) self->split_.insert(p.name);
    }
    g.graph = self->tp_.graph;
    return g;
  };
  layout.rewrite_program = [self](Program& program) -> absl::Status {
    const TpCommStep comm_step = [self](std::string name, graph::Phase phase,
                                        std::function<absl::Status(const Stream&)> body, Event* done) {
      return self->CompiledStep::CommStep(std::move(name), phase, self->tp_ready_.get(), std::move(body), done);
    };
    SG_RETURN_IF_ERROR(ReplaceVocabSteps(program, self->tp_, self->tp_group_, comm_step, self->tp_steps_.get()));
    return InsertTpAllReduces(program, self->tp_, self->tp_group_, comm_step, self->tp_steps_.get());
  };
  SG_RETURN_IF_ERROR(s->Init(train, o, std::move(layout), std::move(context), std::move(explanation)));
  absl::StrAppend(&s->explanation_, "; tensor parallel: ", s->tp_.Summary());
  return s;
}

const TpParam* TensorParallelFsdpStep::FindTpParam(const std::string& name) const {
  for (const char* prefix : {"opt.m.", "opt.v.", "grad:", ""}) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::string bare = name.substr(std::string(prefix).size());
    for (const TpParam& p : tp_.params) {
      if (p.name == bare) return &p;
    }
  }
  return nullptr;
}

absl::Status TensorParallelFsdpStep::Write(const std::string& name, const TensorView& host) {
  const TpParam* p = FindTpParam(name);
  if (p == nullptr || p->dim < 0 || absl::StartsWith(name, "grad:")) return ShardedDataParallelStep::Write(name, host);
  int64_t global = 1, local = 1;
  for (int64_t d : p->global) global *= d;
  for (int64_t d : p->local) local *= d;
  SG_RETURN_IF_ERROR(CheckFullF32(name, global, host));
  std::vector<float> full(static_cast<size_t>(global)), slice(static_cast<size_t>(local));
  SG_RETURN_IF_ERROR(
      CopyTensor(host, TensorView(full.data(), DType::kF32, host.shape(), Device::Cpu()), executor_->compute_stream()));
  SG_RETURN_IF_ERROR(Wait());
  TpSplit(p->global, p->dim, tp_size_).Copy(full.data(), slice.data(), tp_rank_, /*to_full=*/false);
  return ShardedDataParallelStep::Write(name, TensorView(slice.data(), DType::kF32, {local}, Device::Cpu()));
}

absl::Status TensorParallelFsdpStep::Read(const std::string& name, const TensorView& host) const {
  const TpParam* p = FindTpParam(name);
  if (p == nullptr || p->dim < 0 || tp_group_ == nullptr) return ShardedDataParallelStep::Read(name, host);
  int64_t global = 1, local = 1;
  for (int64_t d : p->global) global *= d;
  for (int64_t d : p->local) local *= d;
  SG_RETURN_IF_ERROR(CheckFullF32(name, global, host));
  // This rank's tp slice (gathered over the dp group), then the slices over the tp group, each
  // padded to the largest (an uneven vocabulary), on the host.
  const TpSplit split(p->global, p->dim, tp_size_);
  const int64_t n = split.MaxNumel();
  std::vector<float> mine(static_cast<size_t>(n), 0.f), gathered(static_cast<size_t>(n * tp_size_)),
      full(static_cast<size_t>(global));
  SG_RETURN_IF_ERROR(
      ShardedDataParallelStep::Read(name, TensorView(mine.data(), DType::kF32, {local}, Device::Cpu())));
  SG_RETURN_IF_ERROR(tp_group_->AllGather(TensorView(mine.data(), DType::kF32, {n}, Device::Cpu()),
                                          TensorView(gathered.data(), DType::kF32, {n * tp_size_}, Device::Cpu())));
  for (int r = 0; r < tp_size_; ++r) split.Copy(full.data(), gathered.data() + r * n, r, /*to_full=*/true);
  SG_RETURN_IF_ERROR(
      CopyTensor(TensorView(full.data(), DType::kF32, host.shape(), Device::Cpu()), host, executor_->compute_stream()));
  return Wait();
}

}  // namespace sg::compiler
