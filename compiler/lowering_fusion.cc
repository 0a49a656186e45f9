#include "compiler/lowering_fusion.h"

#include <algorithm>
#include <functional>

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
    }
  }
  return f;
}

namespace {

bool IsMatmul(const Node& n, bool trans_a, bool trans_b) {
  return n.op == OpKind::kMatmul && graph::AttrBool(n, "trans_a") == trans_a &&
         graph::AttrBool(n, "trans_b") == trans_b;
}

// Fills the backward half of `m` from the swiglu_backward node `sb`; false when its outputs feed
// anything but the two dx and two dW matmuls of the pattern.
bool MatchMlpBackward(const Graph& g, const std::vector<std::vector<int>>& users, const std::vector<bool>& is_output,
                      const std::function<int(int)>& canon, int sb, MlpGroup* m) {
  const Node& b = g.nodes()[sb];
  int dx[2] = {-1, -1}, dw[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    const int d = b.outputs[k], w = k == 0 ? m->w1 : m->w3;
    if (is_output[d] || users[d].size() != 2) return false;
    for (int u : users[d]) {
      const Node& n = g.nodes()[u];
      if (n.inputs[0] != d) return false;
      const std::string& epi = graph::AttrString(n, "epilogue");
      if (IsMatmul(n, true, false) && epi == "none" && dw[k] < 0) {
        dw[k] = u;
      } else if (IsMatmul(n, false, false) && (epi == "none" || epi == "residual") && canon(n.inputs[1]) == w &&
                 dx[k] < 0) {
        dx[k] = u;
      } else {
        return false;
      }
    }
    if (dx[k] < 0 || dw[k] < 0) return false;
  }
  // One dx matmul adds the other's output (its only reader) as the residual.
  for (int k = 0; k < 2; ++k) {
    const Node& sum = g.nodes()[dx[k]];
    const int partial = g.nodes()[dx[1 - k]].outputs[0];
    if (graph::AttrString(sum, "epilogue") != "residual" || sum.inputs.size() != 3 || sum.inputs[2] != partial ||
        graph::AttrString(g.nodes()[dx[1 - k]], "epilogue") != "none" || is_output[partial] ||
        users[partial].size() != 1) {
      continue;
    }
    m->dx = dx[k];
    m->dx_partial = dx[1 - k];
  }
  if (m->dx < 0) return false;
  const Node &w1g = g.nodes()[dw[0]], &w3g = g.nodes()[dw[1]];
  if (w1g.inputs[1] != w3g.inputs[1] || g.type(w1g.inputs[1]) != g.type(m->x) ||
      g.type(w1g.outputs[0]) != g.type(w3g.outputs[0])) {
    return false;
  }
  m->swiglu_backward = sb;
  m->x_backward = w1g.inputs[1];
  m->dw = std::max(dw[0], dw[1]);
  m->dw_other = std::min(dw[0], dw[1]);
  m->dw1 = w1g.outputs[0];
  m->dw3 = w3g.outputs[0];
  return true;
}

}  // namespace

std::vector<MlpGroup> FindMlpGroups(const Graph& g, const LoweringFusions& f) {
  const auto& nodes = g.nodes();
  const std::vector<std::vector<int>> users = g.Users();
  std::vector<bool> is_output(g.num_value_ids(), false);
  for (const graph::GraphOutput& o : g.outputs()) is_output[o.value] = true;
  const std::function<int(int)> canon = [&](int v) {
    auto it = f.duplicate_copy.find(v);
    return it == f.duplicate_copy.end() ? v : it->second;
  };
  // matmul(x, w^T) with no epilogue, or -1.
  auto projection = [&](int v) {
    const int p = g.value(v).producer;
    const Node& n = nodes[p];
    return IsMatmul(n, false, true) && graph::AttrString(n, "epilogue") == "none" && n.inputs.size() == 2 &&
                   g.type(n.inputs[1]).rank() == 2 && !is_output[v]
               ? p
               : -1;
  };
  std::vector<MlpGroup> groups;
  std::set<int> seen;  // gate values: a later swiglu of the same gate, up is a recomputed one
  for (int s = 0; s < int(nodes.size()); ++s) {
    const Node& sw = nodes[s];
    if (sw.op != OpKind::kSwiGLU || !seen.insert(sw.inputs[0]).second) continue;
    MlpGroup m;
    m.gate = sw.inputs[0];
    m.up = sw.inputs[1];
    m.gate_mm = projection(m.gate);
    m.up_mm = projection(m.up);
    if (m.gate == m.up || m.gate_mm < 0 || m.up_mm < 0 || nodes[m.gate_mm].inputs[0] != nodes[m.up_mm].inputs[0]) {
      continue;
    }
    m.swiglu = s;
    m.x = nodes[m.gate_mm].inputs[0];
    m.w1 = canon(nodes[m.gate_mm].inputs[1]);
    m.w3 = canon(nodes[m.up_mm].inputs[1]);
    m.h = sw.outputs[0];
    if (m.w1 == m.w3 || g.type(m.w1) != g.type(m.w3) || g.type(m.x).dtype != g.type(m.w1).dtype) continue;
    bool ok = true;
    std::set<int> readers;
    for (int v : {m.gate, m.up}) readers.insert(users[v].begin(), users[v].end());
    for (int r : readers) {
      const Node& n = nodes[r];
      if (r == s) continue;
      if (n.op == OpKind::kSwiGLU && n.inputs[0] == m.gate && n.inputs[1] == m.up) {
        m.packed_swiglu.push_back(r);
      } else if (n.op == OpKind::kSwiGLUBackward && n.inputs[1] == m.gate && n.inputs[2] == m.up &&
                 m.swiglu_backward < 0) {
        ok = MatchMlpBackward(g, users, is_output, canon, r, &m);
      } else {
        ok = false;
      }
      if (!ok) break;
    }
    if (ok) groups.push_back(std::move(m));
  }
  return groups;
}

}  // namespace sg::compiler
