#include "graph/optimizer.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::graph {

absl::StatusOr<Graph> AppendAdamW(const Graph& g, const AdamWOptions& o) {
  SG_RETURN_IF_ERROR(Verify(g));
  if (g.FindSource("step") >= 0 || g.FindOutput("grad_norm") >= 0) {
    return absl::InvalidArgumentError("AppendAdamW: the graph already has optimizer state");
  }
  struct Item {
    std::string name;
    int param;
    int grad;
  };
  std::vector<Item> items;
  std::vector<GraphOutput> kept;
  for (const GraphOutput& out : g.outputs()) {
    if (!absl::StartsWith(out.name, "grad:")) {
      kept.push_back(out);
      continue;
    }
    const std::string name = out.name.substr(5);
    const int p = g.FindSource(name);
    if (p >= 0 && g.nodes()[g.value(p).producer].op == OpKind::kParameter) {
      items.push_back({name, p, out.value});
    }
    if (o.keep_grad_outputs) kept.push_back(out);
  }
  if (items.empty()) {
    return absl::InvalidArgumentError("AppendAdamW: no \"grad:<parameter>\" outputs; run AppendBackward first");
  }
  Graph base = g;
  base.mutable_outputs() = kept;
  Builder b(std::move(base));
  b.set_phase(Phase::kOptimizer);
  auto scope = b.EnterScope("optimizer");
  Value step = b.Input("step", DType::kF32, {});
  Value lr = b.Input("lr", DType::kF32, {});
  std::vector<Value> grads;
  for (const Item& it : items) grads.push_back(Value{it.grad});
  auto [norm, clip] = b.GradNorm(grads, o.max_grad_norm);
  b.Output("grad_norm", norm);
  for (const Item& it : items) {
    const Type& t = g.type(it.param);
    Value m = b.Parameter("opt.m." + it.name, o.state_dtype, t.shape, /*trainable=*/false);
    Value v = b.Parameter("opt.v." + it.name, o.state_dtype, t.shape, /*trainable=*/false);
    const double wd = t.rank() >= 2 ? o.weight_decay : 0.0;
    auto out = b.Emit(OpKind::kAdamW, {Value{it.param}, Value{it.grad}, m, v, step, lr, clip},
                      {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
                       {"weight_decay", wd}});
    if (out.size() != 3) break;
    b.Output("update:" + it.name, out[0]);
    b.Output("update:opt.m." + it.name, out[1]);
    b.Output("update:opt.v." + it.name, out[2]);
  }
  return b.Finish();
}

absl::StatusOr<Graph> BuildTrainStep(const Graph& forward, const TrainStepOptions& options) {
  SG_ASSIGN_OR_RETURN(BackwardResult r, AppendBackward(forward, {options.loss, {}}));
  return AppendAdamW(r.graph, options.adamw);
}

}  // namespace sg::graph
