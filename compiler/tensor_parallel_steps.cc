// The steps the tensor-parallel runtimes put into a lowered per-rank program: the tp all-reduces
// of partial sums, and the vocabulary-parallel launches (compiler/tensor_parallel_graph.h's
// vocab_ops): the lowered program's steps for those nodes run the full-vocabulary kernels, which
// are not valid on a shard; they are replaced with kernels/vocab_parallel and the tp all-gather
// of the cross-entropy's per-token statistics. Per softmax_cross_entropy node:
//   stats     kernel   local max, sum-exp and target logit per token: f32 [3, tokens]
//   gather    comm     all-gather(tp) of the stats into f32 [T, 3, tokens] (comm stream)
//   wait      compute  waits for the gather
//   finish    kernel   the loss (and in the backward dlogits, scaled by the loss cotangent)
// The backward of a cross-entropy over the same logits and targets reuses the forward's gathered
// statistics (the logits are unchanged in between): one finish kernel, no second collective.
#include "compiler/tensor_parallel_steps.h"

#include <algorithm>
#include <climits>
#include <map>

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "kernels/core/status.h"
#include "kernels/vocab_parallel/vocab_parallel.h"

namespace sg::compiler {
namespace {

using graph::OpKind;

TensorView Matrix(const TensorView& t) {
  const int64_t cols = t.rank() == 0 ? 1 : t.dim(t.rank() - 1);
  return TensorView(t.raw(), t.dtype(), {cols == 0 ? 0 : t.numel() / cols, cols}, t.device());
}
TensorView Flat(const TensorView& t) { return TensorView(t.raw(), t.dtype(), {t.numel()}, t.device()); }

Step Kernel(std::string name, int node, graph::Phase phase, std::function<absl::Status(const Stream&)> f) {
  Step st;
  st.name = std::move(name);
  st.node = node;
  st.phase = phase;
  st.impl = "kernel";
  st.launch = std::move(f);
  return st;
}

// A step that makes its stream wait for `done` (as CompiledStep::WaitStep).
Step Wait(std::string name, graph::Phase phase, const Event* done) {
  Step st;
  st.name = std::move(name);
  st.phase = phase;
  st.impl = "wait";
  st.launch = [done](const Stream& s) { return done->Block(s); };
  return st;
}

// The statistics buffers: per cross-entropy forward (and unmatched backward) 3 * tokens floats
// of this rank's and 3 * tokens * T gathered, plus one scratch loss.
int64_t VocabScratchBytes(const Program& program, const TensorParallelGraph& tp_, int tp_size) {
  const graph::Graph& g = program.graph;
  auto view = [&](int v) { return program.values[size_t(v)]; };
  int64_t bytes = AlignUp(4);
  for (const TpVocabOp& op : tp_.vocab_ops) {
    if (op.op != OpKind::kSoftmaxCrossEntropy && op.op != OpKind::kSoftmaxCrossEntropyBackward) continue;
    const graph::Node& n = g.nodes()[size_t(op.node)];
    const int64_t tokens = view(n.inputs[op.op == OpKind::kSoftmaxCrossEntropy ? 1 : 2]).numel();
    bytes += AlignUp(3 * tokens * 4) + AlignUp(3 * tokens * 4 * tp_size);
  }
  return bytes;
}

// Lowers the vocab ops one at a time into their replacement steps, handing out the statistics
// buffers from owned->vocab_scratch (allocated by the caller) in order; a cross-entropy backward
// reuses the statistics its forward gathered.
class VocabLowering {
 public:
  VocabLowering(const Program& program, int tp_size, comm::ProcessGroup* group, const TpCommStep& comm_step,
                TpStepResources* owned)
      : program_(program), tp_size_(tp_size), group_(group), comm_step_(comm_step), owned_(owned) {
    scratch_loss_ = Take({});
  }

  absl::Status Lower(const TpVocabOp& op);
  // Node -> its new steps, in order.
  std::multimap<int, Step>& replacement() { return replacement_; }

 private:
  struct Gathered {
    int logits = -1, targets = -1;
    TensorView stats;
  };

  TensorView View(int v) const { return program_.values[size_t(v)]; }
  TensorView Take(Shape s) {
    TensorView v(owned_->vocab_scratch.data() + at_, DType::kF32, s, program_.device);
    at_ += AlignUp(std::max<int64_t>(v.numel() * 4, 4));
    return v;
  }
  absl::Status LowerEmbedding(const TpVocabOp& op, const graph::Node& n, const std::string& where);
  absl::Status LowerEmbeddingBackward(const TpVocabOp& op, const graph::Node& n, const std::string& where);
  absl::Status LowerCrossEntropy(const TpVocabOp& op, const graph::Node& n, const std::string& where);
  // The stats kernel, the all-gather(tp) of its output and the wait for it; returns the gathered
  // statistics.
  absl::StatusOr<TensorView> GatherStats(const TpVocabOp& op, const graph::Node& n, const std::string& where,
                                         const TensorView& logits, const TensorView& targets,
                                         const kernels::VocabParallelCrossEntropyOptions& o);

  const Program& program_;
  const int tp_size_;
  comm::ProcessGroup* const group_;
  const TpCommStep& comm_step_;
  TpStepResources* const owned_;
  int64_t at_ = 0;
  TensorView scratch_loss_;
  std::vector<Gathered> forward_stats_;
  std::multimap<int, Step> replacement_;
};

absl::Status VocabLowering::Lower(const TpVocabOp& op) {
  const graph::Node& n = program_.graph.nodes()[size_t(op.node)];
  const std::string where = absl::StrCat(graph::OpName(n.op), n.scope.empty() ? "" : " @", n.scope);
  switch (op.op) {
    case OpKind::kEmbedding:
      return LowerEmbedding(op, n, where);
    case OpKind::kEmbeddingBackward:
      return LowerEmbeddingBackward(op, n, where);
    case OpKind::kSoftmaxCrossEntropy:
    case OpKind::kSoftmaxCrossEntropyBackward:
      return LowerCrossEntropy(op, n, where);
    default:
      return absl::InternalError(absl::StrCat("tensor parallel: no vocabulary-parallel lowering of ", where));
  }
}

absl::Status VocabLowering::LowerEmbedding(const TpVocabOp& op, const graph::Node& n, const std::string& where) {
  const int64_t start = op.start;
  const graph::Phase phase = n.phase;
  const TensorView table = View(n.inputs[0]), ids = View(n.inputs[1]), out = View(n.outputs[0]);
  replacement_.emplace(op.node, Kernel(absl::StrCat("vocab_parallel ", where), op.node, phase, [=](const Stream& s) {
    return kernels::VocabParallelEmbeddingForward(ids, table, start, out, s);
  }));
  return absl::OkStatus();
}

absl::Status VocabLowering::LowerEmbeddingBackward(const TpVocabOp& op, const graph::Node& n,
                                                   const std::string& where) {
  const int64_t start = op.start;
  const graph::Phase phase = n.phase;
  const TensorView dy = View(n.inputs[0]), ids = View(n.inputs[1]), dtable = View(n.outputs[0]);
  if (dtable.dtype() != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat("tensor parallel: ", where, " writes its vocabulary shard's "
                                                 "gradient as ", DTypeName(dtable.dtype()),
                                                 ", expected f32 (a folded cast)"));
  }
  replacement_.emplace(op.node, Kernel(absl::StrCat("vocab_parallel ", where), op.node, phase, [=](const Stream& s) {
    return kernels::VocabParallelEmbeddingBackward(dy, ids, start, dtable, s);
  }));
  return absl::OkStatus();
}

absl::Status VocabLowering::LowerCrossEntropy(const TpVocabOp& op, const graph::Node& n, const std::string& where) {
  const int64_t start = op.start;
  const graph::Phase phase = n.phase;
  const bool backward = op.op == OpKind::kSoftmaxCrossEntropyBackward;
  const int lv = n.inputs[backward ? 1 : 0], tv = n.inputs[backward ? 2 : 1];
  const TensorView logits = Matrix(View(lv)), targets = Flat(View(tv));
  kernels::VocabParallelCrossEntropyOptions o;
  o.vocab = op.vocab;
  o.ignore_index = graph::AttrInt(n, "ignore_index");
  TensorView gathered;
  for (const Gathered& f : forward_stats_) {
    if (backward && f.logits == lv && f.targets == tv) gathered = f.stats;
  }
  if (gathered.raw() == nullptr) {
    SG_ASSIGN_OR_RETURN(gathered, GatherStats(op, n, where, logits, targets, o));
    if (!backward) forward_stats_.push_back({lv, tv, gathered});
  }
  const TensorView loss = backward ? scratch_loss_ : View(n.outputs[0]);
  const TensorView dloss = backward ? View(n.inputs[0]) : TensorView();
  const TensorView dlogits = backward ? Matrix(View(n.outputs[0])) : TensorView();
  replacement_.emplace(op.node, Kernel(absl::StrCat("vocab_parallel ", backward ? "dlogits " : "loss ", where),
                                       op.node, phase, [=](const Stream& s) {
                                         return kernels::VocabParallelCrossEntropyFinish(
                                             logits, targets, start, gathered, dloss, o, loss, dlogits, s);
                                       }));
  return absl::OkStatus();
}

absl::StatusOr<TensorView> VocabLowering::GatherStats(const TpVocabOp& op, const graph::Node& n,
                                                      const std::string& where, const TensorView& logits,
                                                      const TensorView& targets,
                                                      const kernels::VocabParallelCrossEntropyOptions& o) {
  const int64_t start = op.start;
  const graph::Phase phase = n.phase;
  const TensorView stats = Take({3, logits.dim(0)});
  const TensorView gathered = Take({tp_size_, 3, logits.dim(0)});
  replacement_.emplace(op.node, Kernel(absl::StrCat("vocab_parallel stats ", where), op.node, phase,
                                       [=](const Stream& s) {
                                         return kernels::VocabParallelCrossEntropyStats(logits, targets, start, o,
                                                                                        stats, s);
                                       }));
  SG_ASSIGN_OR_RETURN(Event ev, Event::Create(program_.device));
  owned_->events.push_back(std::make_unique<Event>(std::move(ev)));
  Event* done = owned_->events.back().get();
  comm::ProcessGroup* tp = group_;
  Step gather = comm_step_(absl::StrCat("all-gather(tp) vocab_parallel stats ", where), phase,
                           [tp, stats, gathered](const Stream& s) -> absl::Status {
                             if (tp == nullptr) return CopyTensor(stats, Flat(gathered), s);
                             return tp->AllGather(Flat(stats), Flat(gathered), s);
                           },
                           done);
  gather.node = op.node;
  replacement_.emplace(op.node, std::move(gather));
  Step wait = Wait(absl::StrCat("wait all-gather(tp) vocab_parallel stats ", where), phase, done);
  wait.node = op.node;
  replacement_.emplace(op.node, std::move(wait));
  return gathered;
}

// Splices `replacement` into the schedule in place of each replaced node's step. Each replaced
// node must have had exactly one step (a fused cross-entropy pair has one step for two nodes: its
// backward's dlogits would go missing).
absl::Status SpliceVocabSteps(Program& program, const TensorParallelGraph& tp_,
                              std::multimap<int, Step>& replacement) {
  std::map<int, int> seen;
  std::vector<Step> steps;
  for (Step& st : program.schedule.steps) {
    auto range = replacement.equal_range(st.node);
    if (st.node < 0 || range.first == range.second) {
      steps.push_back(std::move(st));
      continue;
    }
    if (seen[st.node]++ > 0) {
      return absl::InternalError(absl::StrCat("tensor parallel: node ", st.node, " (", st.name,
                                              ") has more than one lowered step; expected one to replace"));
    }
    for (auto it = range.first; it != range.second; ++it) steps.push_back(std::move(it->second));
  }
  for (const TpVocabOp& op : tp_.vocab_ops) {
    if (!seen.count(op.node)) {
      return absl::UnimplementedError(absl::StrCat(
          "tensor parallel: the vocabulary-parallel ", graph::OpName(op.op), " (node ", op.node,
          ") has no step of its own (fused with another node), which the vocabulary-parallel lowering does not cover"));
    }
  }
  program.schedule.steps = std::move(steps);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReplaceVocabSteps(Program& program, const TensorParallelGraph& tp_, comm::ProcessGroup* group,
                               const TpCommStep& comm_step, TpStepResources* owned) {
  if (tp_.vocab_ops.empty()) return absl::OkStatus();
  const int tp_size = group != nullptr ? group->size() : 1;
  SG_ASSIGN_OR_RETURN(owned->vocab_scratch,
                      DeviceMemory::Allocate(program.device, VocabScratchBytes(program, tp_, tp_size)));
  VocabLowering lowering(program, tp_size, group, comm_step, owned);
  for (const TpVocabOp& op : tp_.vocab_ops) SG_RETURN_IF_ERROR(lowering.Lower(op));
  return SpliceVocabSteps(program, tp_, lowering.replacement());
}

absl::Status InsertTpAllReduces(Program& program, const TensorParallelGraph& tp, comm::ProcessGroup* group,
                                const TpCommStep& comm_step, TpStepResources* owned) {
  if (group == nullptr) return absl::OkStatus();
  const graph::Graph& g = program.graph;
  std::multimap<int, Step> after, before;
  for (const TpAllReduce& a : tp.all_reduces) {
    const TensorView v = program.values[size_t(a.value)];
    if (v.raw() == nullptr && v.numel() > 0) {
      return absl::InternalError(absl::StrCat("tensor parallel: the partial sum of ", a.where, " has no buffer"));
    }
    SG_ASSIGN_OR_RETURN(Event ev, Event::Create(program.device));
    owned->events.push_back(std::make_unique<Event>(std::move(ev)));
    Event* done = owned->events.back().get();
    const graph::Phase phase = g.nodes()[size_t(a.issue_after)].phase;
    after.emplace(a.issue_after, comm_step(absl::StrCat("all-reduce(tp) ", a.where), phase,
                                           [group, v](const Stream& s) {
                                             return group->AllReduce(v, comm::ReduceOp::kSum, s);
                                           },
                                           done));
    before.emplace(a.needed_by, Wait(absl::StrCat("wait all-reduce(tp) ", a.where), phase, done));
  }
  auto flush = [](std::multimap<int, Step>* m, int below, std::vector<Step>* out) {
    while (!m->empty() && m->begin()->first < below) {
      out->push_back(std::move(m->begin()->second));
      m->erase(m->begin());
    }
  };
  std::vector<Step> steps;
  for (Step& st : program.schedule.steps) {
    if (st.node >= 0) {
      flush(&after, st.node, &steps);
      flush(&before, st.node + 1, &steps);
    }
    steps.push_back(std::move(st));
  }
  flush(&after, INT_MAX, &steps);
  flush(&before, INT_MAX, &steps);  // the waits for graph outputs (needed_by INT_MAX)
  while (!before.empty()) {
    steps.push_back(std::move(before.begin()->second));
    before.erase(before.begin());
  }
  program.schedule.steps = std::move(steps);
  return absl::OkStatus();
}

}  // namespace sg::compiler
