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

// The chunked LM head (lowering_fusion.h) around the fused cross-entropy `ce` -> `bwd`, if the
// graph has exactly its pattern.
std::optional<LoweringFusions::LmHead> FindLmHead(const Graph& g, const LoweringFusions& f, int ce, int bwd,
                                                  const std::vector<std::vector<int>>& users,
                                                  const std::vector<bool>& is_output, int chunks) {
  const auto& nodes = g.nodes();
  const int logits = nodes[ce].inputs[0], dlogits = nodes[bwd].outputs[0];
  auto plain_matmul = [&](int k, bool trans_a, bool trans_b) {
    const Node& n = nodes[k];
    return n.op == OpKind::kMatmul && graph::AttrString(n, "epilogue") == "none" &&
           graph::AttrBool(n, "trans_a") == trans_a && graph::AttrBool(n, "trans_b") == trans_b &&
           n.inputs.size() == 2;
  };
  auto producer = [&](int v) -> const Node& { return nodes[g.value(v).producer]; };
  // The same weight: one value, or two casts of one parameter (recompute clones the cast into the
  // backward; both read the same weight copy).
  auto same_weight = [&](int a, int b) {
    return a == b || (producer(a).op == OpKind::kCast && producer(b).op == OpKind::kCast &&
                      producer(a).inputs[0] == producer(b).inputs[0]);
  };
  // The same activation: one value, or the backward's rebuilt norm output (selective recompute:
  // rmsnorm of the kept sum h with the same weight and eps) of the forward's (add_)rmsnorm output.
  auto same_activation = [&](int fwd, int bwd_value) {
    if (fwd == bwd_value) return true;
    const Node& norm = producer(fwd);
    const Node& r = producer(bwd_value);
    if (r.op != OpKind::kRmsNorm || graph::AttrFloat(r, "eps") != graph::AttrFloat(norm, "eps")) return false;
    if (norm.op == OpKind::kAddRmsNorm) {
      return norm.outputs[0] == fwd && r.inputs[0] == norm.outputs[1] && same_weight(r.inputs[1], norm.inputs[2]);
    }
    return norm.op == OpKind::kRmsNorm && r.inputs[0] == norm.inputs[0] && same_weight(r.inputs[1], norm.inputs[1]);
  };
  LoweringFusions::LmHead h;
  h.chunks = chunks;
  h.cross_entropy = ce;
  h.matmul = g.value(logits).producer;
  if (!plain_matmul(h.matmul, false, true) || is_output[logits] || is_output[dlogits]) return std::nullopt;
  const int x = nodes[h.matmul].inputs[0], w = nodes[h.matmul].inputs[1];
  if (g.type(w).rank() != 2 || users[dlogits].size() != 2) return std::nullopt;
  for (int k : users[logits]) {
    if (k != ce && k != bwd) return std::nullopt;
  }
  for (int k : users[dlogits]) {
    const Node& n = nodes[k];
    if (plain_matmul(k, false, false) && n.inputs[0] == dlogits && same_weight(n.inputs[1], w)) {
      h.dx = k;
    } else if (plain_matmul(k, true, false) && n.inputs[0] == dlogits && same_activation(x, n.inputs[1])) {
      h.dw = k;
    }
  }
  if (h.dx < 0 || h.dw < 0) return std::nullopt;
  // dW accumulates over the blocks: in f32 (natively or through a folded cast), never in bf16.
  const int dw = nodes[h.dw].outputs[0];
  if (g.type(dw).dtype != DType::kF32 && !f.folded_cast.count(dw)) return std::nullopt;
  return h;
}

}  // namespace

LoweringFusions FindLoweringFusions(const Graph& g, const std::set<std::string>& device_seeds, int lm_head_chunks,
                                    bool swiglu_backward_gemm, bool bf16_gradients) {
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

  // After the folded casts (dW must be written in f32), before the in-place list is final (the
  // logits and dlogits share one block-sized buffer anyway).
  if (lm_head_chunks > 1 && f.cross_entropy.size() == 1) {
    const auto [ce, bwd] = *f.cross_entropy.begin();
    f.lm_head = FindLmHead(g, f, ce, bwd, users, is_output, lm_head_chunks);
    if (f.lm_head) {
      f.fused_away.insert(f.lm_head->matmul);
      f.fused_away.insert(f.lm_head->dx);
      f.fused_away.insert(f.lm_head->dw);
    }
  }

  // After the LM head, whose dW sums its blocks in f32. A weight gradient the optimizer alone reads
  // (and the "grad:" output) stays bf16: at least one adamw reads it as its gradient, and nothing
  // but adamw (as the gradient) and grad_norm does. In a graph without the optimizer (a
  // data-parallel runtime's: FSDP reduce-scatters the "grad:" outputs) an output no node reads.
  if (bf16_gradients) {
    const int head_dw = f.lm_head ? nodes[f.lm_head->dw].outputs[0] : -1;
    for (auto it = f.folded_cast.begin(); it != f.folded_cast.end();) {
      const auto [half, f32] = *it;
      const Node& producer = nodes[g.value(half).producer];
      bool optimizer_only = !users[f32].empty();
      bool updates = false;
      for (int k : users[f32]) {
        const Node& u = nodes[k];
        const bool grad_in = u.op == OpKind::kAdamW && u.inputs[1] == f32 &&
                             std::count(u.inputs.begin(), u.inputs.end(), f32) == 1;
        updates = updates || grad_in;
        optimizer_only = optimizer_only && (grad_in || u.op == OpKind::kGradNorm);
      }
      const bool runtime_reads = users[f32].empty() && is_output[f32];
      if (g.type(half).dtype == DType::kBF16 && producer.op == OpKind::kMatmul && half != head_dw &&
          ((optimizer_only && updates) || runtime_reads)) {
        f.bf16_gradient[f32] = half;
        it = f.folded_cast.erase(it);  // the cast stays fused away: it has no step either way
      } else {
        ++it;
      }
    }
  }

  // After the LM head (its dh matmul is taken there, and never feeds a swiglu_backward anyway).
  if (swiglu_backward_gemm) {
    for (int j = 0; j < nn; ++j) {
      const Node& s = nodes[j];
      if (s.op != OpKind::kSwiGLUBackward) continue;
      const int dh = s.inputs[0];
      const int k = g.value(dh).producer;
      const Node& m = nodes[k];
      if (m.op != OpKind::kMatmul || graph::AttrString(m, "epilogue") != "none" || graph::AttrBool(m, "trans_a") ||
          graph::AttrBool(m, "trans_b") || m.inputs.size() != 2 || g.type(m.inputs[1]).rank() != 2 ||
          f.fused_away.count(k) || is_output[dh] || users[dh].size() != 1 || s.inputs[1] == dh || s.inputs[2] == dh) {
        continue;
      }
      f.swiglu_backward_gemm[j] = k;
      f.fused_away.insert(k);
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
