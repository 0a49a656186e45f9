#include "compiler/context_parallel/cp_step.h"

#include <iostream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/context_parallel/cp_layout.h"
#include "compiler/context_parallel/ring_attention.h"
#include "compiler/dist_context.h"
#include "compiler/distributed.h"
#include "compiler/fsdp.h"
#include "graph/ops.h"
#include "kernels/core/status.h"
#include "kernels/rope/rope.h"

namespace sg::compiler {
namespace {

using graph::Node;
using graph::OpKind;

// Ring attention point-to-point tags: one pair per attention forward node, above the pipeline's
// and the collectives' ranges (tags stay below 2^40).
constexpr uint64_t kRingTagBase = uint64_t(1) << 36;

// What the program rewrite and the batch hook share; owned by the step's hooks.
struct CpRuntime {
  CpLayout layout = *CpLayout::Create(1, 1);
  int cp_rank = 0;
  comm::ProcessGroup* cp = nullptr;  // null when the cp dim has one rank
  absl::Duration timeout;
  Device device;
  Tensor positions;                       // i32 [local_seq]: global positions of the local rows
  std::map<int, Tensor> lse;              // attention forward node -> its log-sum-exp
  std::vector<Tensor> scratch;            // recompute buffers of unmatched backwards
  std::map<std::string, Tensor> local;    // per batch input: this rank's rows

  int64_t local_seq() const { return layout.LocalSeq(cp_rank); }

  RingAttentionOptions Options(const Node& n, int forward_node) const {
    RingAttentionOptions o;
    o.causal = graph::AttrBool(n, "causal");
    const double scale = graph::AttrFloat(n, "scale");
    if (scale > 0) o.scale = scale;
    o.seq = layout.seq();
    o.tag = kRingTagBase + 2 * uint64_t(forward_node);
    o.timeout = timeout;
    return o;
  }

  absl::Status Rewrite(Program& p);
  absl::Status Shard(const std::map<std::string, TensorView>& batch, const Stream& stream,
                     std::map<std::string, TensorView>* out);
};

// The closest attention node before backward node j that computed the values j differentiates
// (the lowering's own pairing rule: after recompute that is the recomputed copy), or -1.
int PairedForward(const std::vector<Node>& nodes, int j) {
  const Node& b = nodes[j];
  for (int i = j - 1; i >= 0; --i) {
    const Node& f = nodes[i];
    if (f.op == OpKind::kAttention && b.inputs[4] == f.outputs[0] && b.inputs[1] == f.inputs[0] &&
        b.inputs[2] == f.inputs[1] && b.inputs[3] == f.inputs[2]) {
      return i;
    }
  }
  return -1;
}

absl::Status CpRuntime::Rewrite(Program& p) {
  if (cp == nullptr) return absl::OkStatus();  // one cp rank: the lowered program is already right
  const std::vector<Node>& nodes = p.graph.nodes();
  std::map<int, std::vector<Step*>> steps_of;
  for (Step& st : p.schedule.steps) {
    if (st.node >= 0) steps_of[st.node].push_back(&st);
  }
  auto the_step = [&](int i) -> absl::StatusOr<Step*> {
    auto it = steps_of.find(i);
    if (it == steps_of.end() || it->second.size() != 1) {
      return absl::UnimplementedError(absl::StrCat(
          "context parallel: expected one schedule step for node ", i, " (", graph::OpName(nodes[i].op), " @",
          nodes[i].scope, "), found ", it == steps_of.end() ? 0 : it->second.size(),
          " (fused away? the sequence-position-dependent ops must keep their own launch)"));
    }
    return it->second[0];
  };
  // Global positions of the local rows: chunk r, then chunk 2cp-1-r.
  std::vector<int32_t> pos;
  for (int c : layout.Chunks(cp_rank)) {
    for (int64_t k = 0; k < layout.ChunkSize(c); ++k) pos.push_back(int32_t(layout.ChunkBegin(c) + k));
  }
  SG_ASSIGN_OR_RETURN(positions, Tensor::Empty({int64_t(pos.size())}, DType::kI32, device));
  SG_RETURN_IF_ERROR(CopyTensor(TensorView(pos.data(), DType::kI32, {int64_t(pos.size())}, Device::Cpu()),
                                positions.view(), Stream::Cpu()));
  comm::ProcessGroup* group = cp;
  for (int i = 0; i < int(nodes.size()); ++i) {
    const Node& n = nodes[i];
    auto in = [&](int k) { return p.values[size_t(n.inputs[size_t(k)])]; };
    auto out = [&](int k) { return p.values[size_t(n.outputs[size_t(k)])]; };
    switch (n.op) {
      case OpKind::kRope:
      case OpKind::kRopeBackward: {
        SG_ASSIGN_OR_RETURN(Step * st, the_step(i));
        kernels::RopeOptions o;
        o.theta = float(graph::AttrFloat(n, "theta"));
        o.positions = positions.view();
        const TensorView x = in(0), y = out(0);
        if (x.rank() != 4 || x.dim(1) != local_seq()) {
          return absl::InvalidArgumentError(absl::StrCat("context parallel: rope @", n.scope, " expects [batch, ",
                                                         local_seq(), ", heads, head_dim], found ", x.ToString()));
        }
        const bool fwd = n.op == OpKind::kRope;
        st->launch = [x, y, o, fwd](const Stream& s) {
          return fwd ? kernels::RopeForward(x, {}, y, {}, o, s) : kernels::RopeBackward(x, {}, y, {}, o, s);
        };
        st->name = absl::StrCat(st->name, " (cp positions)");
        break;
      }
      case OpKind::kAttention: {
        SG_ASSIGN_OR_RETURN(Step * st, the_step(i));
        const TensorView q = in(0), k = in(1), v = in(2), o = out(0);
        SG_ASSIGN_OR_RETURN(Tensor l, Tensor::Empty({q.dim(0), q.dim(2), q.dim(1)}, DType::kF32, device));
        const TensorView lse_view = l.view();
        lse[i] = std::move(l);
        const RingAttentionOptions ro = Options(n, i);
        st->launch = [=](const Stream& s) { return RingAttentionForward(q, k, v, ro, *group, o, lse_view, s); };
        st->name = absl::StrCat("ring ", st->name);
        st->impl = "ring";
        break;
      }
      case OpKind::kAttentionBackward: {
        SG_ASSIGN_OR_RETURN(Step * st, the_step(i));
        const TensorView dout = in(0), q = in(1), k = in(2), v = in(3), o = in(4);
        const TensorView dq = out(0), dk = out(1), dv = out(2);
        const int f = PairedForward(nodes, i);
        const RingAttentionOptions ro = Options(n, f >= 0 ? f : i);
        if (f >= 0 && lse.count(f)) {
          const TensorView l = lse.at(f).view();
          st->launch = [=](const Stream& s) {
            return RingAttentionBackward(q, k, v, o, dout, l, ro, *group, dq, dk, dv, s);
          };
        } else {
          // No forward to read statistics from: recompute the ring forward into scratch.
          SG_ASSIGN_OR_RETURN(Tensor l, Tensor::Empty({q.dim(0), q.dim(2), q.dim(1)}, DType::kF32, device));
          SG_ASSIGN_OR_RETURN(Tensor o2, Tensor::Empty(o.shape(), o.dtype(), device));
          const TensorView lv = l.view(), ov = o2.view();
          scratch.push_back(std::move(l));
          scratch.push_back(std::move(o2));
          st->launch = [=](const Stream& s) -> absl::Status {
            SG_RETURN_IF_ERROR(RingAttentionForward(q, k, v, ro, *group, ov, lv, s));
            return RingAttentionBackward(q, k, v, ov, dout, lv, ro, *group, dq, dk, dv, s);
          };
        }
        st->name = absl::StrCat("ring ", st->name);
        st->impl = "ring";
        break;
      }
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status CpRuntime::Shard(const std::map<std::string, TensorView>& batch, const Stream& stream,
                              std::map<std::string, TensorView>* out) {
  for (const auto& [name, t] : batch) {
    if (t.rank() < 2 || t.dim(1) != layout.seq()) {
      return absl::InvalidArgumentError(absl::StrCat("context parallel Run: input '", name,
                                                     "' must be [batch, seq = ", layout.seq(),
                                                     ", ...] (the full sequence), found ", t.ToString()));
    }
    Shape s = t.shape();
    s[1] = local_seq();
    Tensor& buf = local[name];
    if (buf.view().raw() == nullptr || buf.shape() != s || buf.dtype() != t.dtype() ||
        !(buf.device() == t.device())) {
      SG_ASSIGN_OR_RETURN(buf, Tensor::Empty(s, t.dtype(), t.device()));
    }
    SG_RETURN_IF_ERROR(ShardSequence(t, layout, cp_rank, /*seq_dim=*/1, buf.view(), stream));
    (*out)[name] = buf.view();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CompiledStep>> CompileContextParallel(const graph::Graph& g, const CompileOptions& o) {
  SG_RETURN_IF_ERROR(graph::Verify(g));
  auto seq = o.binding.find("seq");
  if (seq == o.binding.end()) {
    return absl::InvalidArgumentError("context parallel: the binding must give 'seq' (the global sequence length)");
  }
  comm::ProcessGroupOptions po;
  po.timeout = absl::Seconds(o.comm_timeout_s);
  SG_ASSIGN_OR_RETURN(std::shared_ptr<DistContext> ctx, DistContext::FromEnv(o.device, po));
  std::vector<int64_t> shape = o.mesh.empty() ? std::vector<int64_t>{ctx->world_size()} : o.mesh;
  if (shape.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("context parallel: mesh must be {cp} or {dp, cp}, found ",
                                                   absl::StrJoin(shape, "x")));
  }
  const std::vector<int> sizes(shape.begin(), shape.end());
  SG_ASSIGN_OR_RETURN(sharding::DeviceMesh mesh,
                      shape.size() == 1 ? sharding::DeviceMesh::Create({"cp"}, sizes)
                                        : sharding::DeviceMesh::Create({"dp", "cp"}, sizes));
  if (mesh.size() != ctx->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("context parallel: mesh ", mesh.ToString(), " has ", mesh.size(),
                                                   " ranks, the job has ", ctx->world_size(), " (WORLD_SIZE)"));
  }
  const int cp_dim = int(shape.size()) - 1;
  auto rt = std::make_shared<CpRuntime>();
  SG_ASSIGN_OR_RETURN(rt->layout, CpLayout::Create(seq->second, int(shape.back())));
  SG_ASSIGN_OR_RETURN(rt->cp, ctx->Group(mesh, {cp_dim}));
  rt->cp_rank = rt->cp == nullptr ? 0 : rt->cp->rank();
  rt->timeout = absl::Seconds(o.comm_timeout_s);
  rt->device = o.device;
  if (rt->local_seq() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("context parallel: seq ", seq->second, " over cp = ", shape.back(),
                                                   " leaves rank ", rt->cp_rank, " no rows"));
  }

  SG_ASSIGN_OR_RETURN(graph::Graph train, PrepareTrainingGraph(g, o));
  std::vector<int> all_dims;
  for (int d = 0; d < mesh.ndim(); ++d) all_dims.push_back(d);
  SG_ASSIGN_OR_RETURN(comm::ProcessGroup * everyone, ctx->Group(mesh, all_dims));
  DataParallelLayout layout;
  layout.world = everyone;
  (o.context_parallel_fsdp ? layout.shard : layout.replicate) = everyone;
  layout.rewrite_program = [rt](Program& p) { return rt->Rewrite(p); };
  layout.shard_batch = [rt](const std::map<std::string, TensorView>& b, const Stream& s,
                            std::map<std::string, TensorView>* out) { return rt->Shard(b, s, out); };
  CompileOptions local = o;
  local.binding["seq"] = rt->local_seq();
  const std::string why = absl::StrCat(
      "strategy cp on ", mesh.ToString(), ": seq ", seq->second, " in ", rt->layout.num_chunks(),
      " load-balanced chunks (rank ", rt->cp_rank, " holds chunks ", rt->layout.Chunks(rt->cp_rank)[0], " and ",
      rt->layout.Chunks(rt->cp_rank)[1], ", ", rt->local_seq(), " rows), ring attention over the cp dim, parameters ",
      o.context_parallel_fsdp ? "ZeRO-3 sharded over every rank (FSDP x CP)" : "replicated (gradients all-reduced)");
  SG_ASSIGN_OR_RETURN(std::unique_ptr<ShardedDataParallelStep> step,
                      ShardedDataParallelStep::Create(train, local, layout, ctx, why));
  if (ctx->rank() == 0) std::cerr << "[sg::compiler] " << why << "\n";
  return std::unique_ptr<CompiledStep>(std::move(step));
}

namespace {
const bool kRegistered = RegisterStrategyCompiler(Strategy::kContextParallel, CompileContextParallel);
}  // namespace

}  // namespace sg::compiler
