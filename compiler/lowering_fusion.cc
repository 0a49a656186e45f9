#include "compiler/lowering_fusion.h"

#include <algorithm>

#include "graph/ops.h"

namespace sg::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;

namespace {

bool IsConstantScalarFill(const Graph& g, int v, float* value) {
  const Node& p = g.nodes()[g.value(v).producer];
  if (p.op != OpKind::kFill || g.type(v).rank() != 0) return false;
  *value = float(graph::AttrFloat(p, "value"));
  return true;
}

// Whether the producer of `v` can write output `v` in f32 when its natural dtype is bf16.
bool WritesF32(const Graph& g, int v) {
  const graph::ValueInfo& info = g.value(v);
  const Node& p = g.nodes()[info.producer];
  switch (p.op) {
    case OpKind::kMatmul:
      return graph::AttrString(p, "epilogue") == "none";
    case OpKind::kRmsNormBackward:
    case OpKind::kAddRmsNormBackward:
      return info.output_index == 1;  // the norm weight's gradient (f32 in the kernels)
    case OpKind::kEmbeddingBackward:
      return true;
    default:
      return false;
  }
}

}  // namespace

LoweringFusions FindLoweringFusions(const Graph& g, const std::set<std::string>& device_seeds) {
  LoweringFusions f;
  const auto& nodes = g.nodes();
  const int nn = int(nodes.size());
  const std::vector<std::vector<int>> users = g.Users();
  std::vector<bool> is_output(g.num_value_ids(), false);
  for (const graph::GraphOutput& o : g.outputs()) is_output[o.value] = true;
  std::set<int> updated_params;
  for (const Node& n : nodes) {
    if (n.op == OpKind::kAdamW) updated_params.insert(n.inputs[0]);
  }

  for (int j = 0; j < nn; ++j) {
    const Node& b = nodes[j];
    if (b.op != OpKind::kSoftmaxCrossEntropyBackward) continue;
    float scale = 0;
    if (IsConstantScalarFill(g, b.inputs[0], &scale)) f.cross_entropy_scale[j] = scale;
    const Node& seed = nodes[g.value(b.inputs[0]).producer];
    if (seed.op == OpKind::kInput && device_seeds.count(graph::AttrString(seed, "name")) &&
        g.type(b.inputs[0]).dtype == DType::kF32 && g.type(b.inputs[0]).rank() == 0) {
      f.cross_entropy_device_scale[j] = b.inputs[0];
    }
  }
  for (int i = 0; i < nn; ++i) {
    const Node& fw = nodes[i];
    if (fw.op != OpKind::kSoftmaxCrossEntropy) continue;
    for (int j = i + 1; j < nn; ++j) {
      const Node& b = nodes[j];
      if (b.op != OpKind::kSoftmaxCrossEntropyBackward || f.fused_away.count(j) ||
          (!f.cross_entropy_scale.count(j) && !f.cross_entropy_device_scale.count(j)) || b.inputs[1] != fw.inputs[0] || b.inputs[2] != fw.inputs[1] ||
          graph::AttrInt(b, "ignore_index") != graph::AttrInt(fw, "ignore_index")) {
        continue;
      }
      f.cross_entropy[i] = j;
      f.fused_away.insert(j);
      const int logits = fw.inputs[0];
      const std::vector<int>& u = users[logits];
      const bool only_loss = !is_output[logits] &&
                             std::all_of(u.begin(), u.end(), [&](int k) { return k == i || k == j; });
      if (only_loss) f.in_place.push_back({b.outputs[0], logits});
      break;
    }
  }

  std::map<int, int> copy_of_param;
  for (int i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    if (n.op != OpKind::kCast) continue;
    const int in = n.inputs[0], out = n.outputs[0];
    const DType from = g.type(in).dtype, to = g.type(out).dtype;
    const Node& producer = nodes[g.value(in).producer];
    const bool half = [](DType t) { return t == DType::kBF16 || t == DType::kF16; }(from);
    if (half && to == DType::kF32 && users[in].size() == 1 && !is_output[in] && WritesF32(g, in)) {
      f.folded_cast[in] = out;
      f.fused_away.insert(i);
    } else if (from == DType::kF32 && (to == DType::kBF16 || to == DType::kF16) && producer.op == OpKind::kParameter &&
               graph::AttrBool(producer, "trainable") && updated_params.count(in) && !is_output[out]) {
      auto [it, first] = copy_of_param.insert({in, out});
      if (first) {
        f.weight_copy[out] = in;
      } else {
        f.duplicate_copy[out] = it->second;
        f.fused_away.insert(i);
      }
    }
  }

  for (const Node& n : nodes) {
    if (n.op == OpKind::kAddRmsNorm && n.inputs[0] != n.inputs[1]) {
      f.in_place.push_back({n.outputs[1], n.inputs[0]});
    } else if (n.op == OpKind::kAddRmsNormBackward && n.inputs[1] != n.inputs[0] && n.inputs[1] != n.inputs[2]) {
      f.in_place.push_back({n.outputs[0], n.inputs[1]});
    } else if (n.op == OpKind::kAdd && n.inputs[0] != n.inputs[1] && g.type(n.inputs[0]) == g.type(n.outputs[0])) {
      f.in_place.push_back({n.outputs[0], n.inputs[0]});
    } else if (n.op == OpKind::kSwiGLUBackward && n.inputs[1] != n.inputs[2] && n.inputs[0] != n.inputs[1] &&
               n.inputs[0] != n.inputs[2]) {
      // dgate over gate, dup over up (kernels/swiglu allows it): the backward's widest pair of values
      // (ffn_dim per token) is not held twice.
      f.in_place.push_back({n.outputs[0], n.inputs[1]});
      f.in_place.push_back({n.outputs[1], n.inputs[2]});
    }
  }
  return f;
}

}  // namespace sg::compiler
