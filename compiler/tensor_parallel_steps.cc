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

}  // namespace

absl::Status ReplaceVocabSteps(Program& program, const TensorParallelGraph& tp_, comm::ProcessGroup* group,
                               const TpCommStep& comm_step, TpStepResources* owned) {
  if (tp_.vocab_ops.empty()) return absl::OkStatus();
  const graph::Graph& g = program.graph;
  const Device d = program.device;
  const int tp_size = group != nullptr ? group->size() : 1;
  auto view = [&](int v) { return program.values[size_t(v)]; };
  // The statistics buffers: per cross-entropy forward (and unmatched backward) 3 * tokens floats
  // of this rank's and 3 * tokens * T gathered, plus one scratch loss.
  std::vector<int> ce_nodes;
  int64_t bytes = AlignUp(4);
  for (const TpVocabOp& op : tp_.vocab_ops) {
    if (op.op != OpKind::kSoftmaxCrossEntropy && op.op != OpKind::kSoftmaxCrossEntropyBackward) continue;
    const graph::Node& n = g.nodes()[size_t(op.node)];
    const int64_t tokens = view(n.inputs[op.op == OpKind::kSoftmaxCrossEntropy ? 1 : 2]).numel();
    bytes += AlignUp(3 * tokens * 4) + AlignUp(3 * tokens * 4 * tp_size);
  }
  SG_ASSIGN_OR_RETURN(owned->vocab_scratch, DeviceMemory::Allocate(d, bytes));
  int64_t at = 0;
  auto take = [&](Shape s) {
    TensorView v(owned->vocab_scratch.data() + at, DType::kF32, s, d);
    at += AlignUp(std::max<int64_t>(v.numel() * 4, 4));
    return v;
  };
  const TensorView scratch_loss = take({});

  struct Gathered {
    int logits = -1, targets = -1;
    TensorView stats;
  };
  std::vector<Gathered> forward_stats;
  std::multimap<int, Step> replacement;  // node -> its new steps, in order
  for (const TpVocabOp& op : tp_.vocab_ops) {
    const graph::Node& n = g.nodes()[size_t(op.node)];
    const std::string where = absl::StrCat(graph::OpName(n.op), n.scope.empty() ? "" : " @", n.scope);
    const int64_t start = op.start;
    const graph::Phase phase = n.phase;
    switch (op.op) {
      case OpKind::kEmbedding: {
        const TensorView table = view(n.inputs[0]), ids = view(n.inputs[1]), out = view(n.outputs[0]);
        replacement.emplace(op.node, Kernel(absl::StrCat("vocab_parallel ", where), op.node, phase, [=](const Stream& s) {
          return kernels::VocabParallelEmbeddingForward(ids, table, start, out, s);
        }));
        break;
      }
      case OpKind::kEmbeddingBackward: {
        const TensorView dy = view(n.inputs[0]), ids = view(n.inputs[1]), dtable = view(n.outputs[0]);
        if (dtable.dtype() != DType::kF32) {
          return absl::UnimplementedError(absl::StrCat("tensor parallel: ", where, " writes its vocabulary shard's "
                                                       "gradient as ", DTypeName(dtable.dtype()),
                                                       ", expected f32 (a folded cast)"));
        }
        replacement.emplace(op.node, Kernel(absl::StrCat("vocab_parallel ", where), op.node, phase, [=](const Stream& s) {
          return kernels::VocabParallelEmbeddingBackward(dy, ids, start, dtable, s);
        }));
        break;
      }
      case OpKind::kSoftmaxCrossEntropy:
      case OpKind::kSoftmaxCrossEntropyBackward: {
        const bool backward = op.op == OpKind::kSoftmaxCrossEntropyBackward;
        const int lv = n.inputs[backward ? 1 : 0], tv = n.inputs[backward ? 2 : 1];
        const TensorView logits = Matrix(view(lv)), targets = Flat(view(tv));
        kernels::VocabParallelCrossEntropyOptions o;
        o.vocab = op.vocab;
        o.ignore_index = graph::AttrInt(n, "ignore_index");
        TensorView gathered;
        for (const Gathered& f : forward_stats) {
          if (backward && f.logits == lv && f.targets == tv) gathered = f.stats;
        }
        if (gathered.raw() == nullptr) {
          const TensorView stats = take({3, logits.dim(0)});
          gathered = take({tp_size, 3, logits.dim(0)});
          replacement.emplace(op.node, Kernel(absl::StrCat("vocab_parallel stats ", where), op.node, phase,
                                              [=](const Stream& s) {
                                                return kernels::VocabParallelCrossEntropyStats(logits, targets, start,
                                                                                               o, stats, s);
                                              }));
          SG_ASSIGN_OR_RETURN(Event ev, Event::Create(d));
          owned->events.push_back(std::make_unique<Event>(std::move(ev)));
          Event* done = owned->events.back().get();
          comm::ProcessGroup* tp = group;
          Step gather = comm_step(absl::StrCat("all-gather(tp) vocab_parallel stats ", where), phase,
                                 [tp, stats, gathered](const Stream& s) -> absl::Status {
                                   if (tp == nullptr) return CopyTensor(stats, Flat(gathered), s);
                                   return tp->AllGather(Flat(stats), Flat(gathered), s);
                                 },
                                 done);
          gather.node = op.node;
          replacement.emplace(op.node, std::move(gather));
          Step wait = Wait(absl::StrCat("wait all-gather(tp) vocab_parallel stats ", where), phase, done);
          wait.node = op.node;
          replacement.emplace(op.node, std::move(wait));
          if (!backward) forward_stats.push_back({lv, tv, gathered});
        }
        const TensorView loss = backward ? scratch_loss : view(n.outputs[0]);
        const TensorView dloss = backward ? view(n.inputs[0]) : TensorView();
        const TensorView dlogits = backward ? Matrix(view(n.outputs[0])) : TensorView();
        replacement.emplace(op.node, Kernel(absl::StrCat("vocab_parallel ", backward ? "dlogits " : "loss ", where),
                                            op.node, phase, [=](const Stream& s) {
                                              return kernels::VocabParallelCrossEntropyFinish(
                                                  logits, targets, start, gathered, dloss, o, loss, dlogits, s);
                                            }));
        break;
      }
      default:
        return absl::InternalError(absl::StrCat("tensor parallel: no vocabulary-parallel lowering of ", where));
    }
  }
  // Each replaced node must have had exactly one step (a fused cross-entropy pair has one step for
  // two nodes: its backward's dlogits would go missing).
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
