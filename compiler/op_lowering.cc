#include "compiler/op_lowering.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "compiler/reference_kernel.h"
#include "graph/ops.h"
#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/attention/attention.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

namespace sg::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;

namespace {

int64_t Rows(const Shape& s) { return s.empty() ? 1 : NumElements(s) / std::max<int64_t>(s.back(), 1); }

// The attention statistics' shape [batch, heads, seq] for q [batch, seq, heads, head_dim].
Shape LseShape(const Shape& q) { return {q[0], q[2], q[1]}; }

// A contiguous view as a matrix [rows, last dim].
TensorView AsMatrix(const TensorView& t) {
  return TensorView(t.raw(), t.dtype(), {Rows(t.shape()), t.shape().empty() ? 1 : t.shape().back()}, t.device());
}

// matmul {trans_a, trans_b, epilogue, prologue} onto kernels/gemm. The prologue="rmsnorm" marker
// is deliberately ignored (kernels/gemm_rmsnorm is not used): in Llama every norm output feeds two
// or three GEMMs (wq/wk/wv, w1/w3), so the fused form would fold each weight every step, recompute
// rstd per consumer, write xhat once per consumer in the backward and need a sum of the per-GEMM
// dx; that is more traffic than writing the norm output once, and the memory it would save (the
// stored norm output) the selective recompute policy saves too. (Measured alone on the H200,
// 2026-11-30, the fused forward with our wgmma GEMM now beats the add+RMSNorm + cuBLAS pair by
// 2.5-6% for one consumer GEMM; using it here would first need wq/wk/wv and w1/w3 merged into one
// GEMM per norm, so the norm has one consumer, and the fused backward measured in the step.)
LoweredOp Matmul(const Node& n, const NodeViews& v) {
  kernels::GemmArgs g;
  g.trans_a = graph::AttrBool(n, "trans_a");
  g.trans_b = graph::AttrBool(n, "trans_b");
  g.a = AsMatrix(v.in[0]);
  g.b = g.trans_a ? AsMatrix(v.in[1]) : v.in[1];
  g.d = AsMatrix(v.out[0]);
  const std::string& epi = graph::AttrString(n, "epilogue");
  size_t next = 2;
  if (epi == "bias" || epi == "bias_residual") g.bias = v.in[next++];
  if (epi == "residual" || epi == "bias_residual") {
    g.c = AsMatrix(v.in[next]);
    g.beta = 1.0f;
  }
  g.sm_count = v.sm_count;
  return {"kernel", [g](const Stream& s) { return kernels::Gemm(g, s); }};
}

kernels::AttentionOptions AttnOptions(const Node& n) {
  kernels::AttentionOptions o;
  o.causal = graph::AttrBool(n, "causal");
  const double scale = graph::AttrFloat(n, "scale");
  if (scale > 0) o.scale = scale;
  return o;
}

absl::StatusOr<LoweredOp> Reference(const Node& n, const NodeViews& v, Device device) {
  if (!device.is_cpu()) return LoweredOp{};
  std::vector<std::pair<DType, Shape>> ins;
  for (const TensorView& t : v.in) ins.push_back({t.dtype(), t.shape()});
  SG_ASSIGN_OR_RETURN(ReferenceKernel k, ReferenceKernel::Create(n, ins));
  std::vector<TensorView> in = v.in, out = v.out;
  return LoweredOp{"reference", [k, in, out](const Stream&) { return k.Run(in, out); }};
}

LoweredOp RmsNorm(const Node& n, const NodeViews& v) {
  const float eps = float(graph::AttrFloat(n, "eps"));
  TensorView x = v.in[0], w = v.in[1], y = v.out[0];
  TensorView rstd(v.side[0], DType::kF32, {Rows(x.shape())}, x.device());
  return {"kernel", [=](const Stream& s) { return kernels::RmsNormForward(x, w, eps, y, rstd, s); }};
}

absl::StatusOr<LoweredOp> RmsNormBackward(const Node& n, const NodeViews& v, bool matched) {
  const float eps = float(graph::AttrFloat(n, "eps"));
  TensorView dy = v.in[0], x = v.in[1], w = v.in[2], dx = v.out[0], dw = v.out[1];
  const Device d = x.device();
  TensorView rstd(v.side[0], DType::kF32, {Rows(x.shape())}, d);
  size_t next = 1;
  TensorView y_scratch;
  if (!matched) y_scratch = TensorView(v.side[next++], x.dtype(), x.shape(), d);
  const bool cast_dw = dw.dtype() != DType::kF32;
  TensorView dw_f32 = cast_dw ? TensorView(v.side[next], DType::kF32, w.shape(), d) : dw;
  return LoweredOp{"kernel", [=](const Stream& s) -> absl::Status {
                     if (!matched) SG_RETURN_IF_ERROR(kernels::RmsNormForward(x, w, eps, y_scratch, rstd, s));
                     SG_RETURN_IF_ERROR(kernels::RmsNormBackward(dy, x, w, rstd, dx, dw_f32, s));
                     if (cast_dw) return kernels::Cast(dw_f32, dw, s);
                     return absl::OkStatus();
                   }};
}

// add_rmsnorm(x, residual, w) -> (y, h = x + residual) onto kernels/add_rmsnorm.
LoweredOp AddRmsNorm(const Node& n, const NodeViews& v) {
  const float eps = float(graph::AttrFloat(n, "eps"));
  TensorView x = v.in[0], res = v.in[1], w = v.in[2], y = v.out[0], h = v.out[1];
  TensorView rstd(v.side[0], DType::kF32, {Rows(x.shape())}, x.device());
  return {"kernel", [=](const Stream& s) { return kernels::AddRmsNormForward(x, res, w, eps, h, y, rstd, s); }};
}

// add_rmsnorm_backward(dy, dh, h, w) -> (dx = dh + RMSNormBackward(dy), dw). Without the
// forward's rstd (recompute rewired the backward) it is recomputed from h first.
LoweredOp AddRmsNormBackward(const Node& n, const NodeViews& v, bool matched) {
  const float eps = float(graph::AttrFloat(n, "eps"));
  TensorView dy = v.in[0], dh = v.in[1], h = v.in[2], w = v.in[3], dx = v.out[0], dw = v.out[1];
  const Device d = h.device();
  TensorView rstd(v.side[0], DType::kF32, {Rows(h.shape())}, d);
  size_t next = 1;
  TensorView y_scratch;
  if (!matched) y_scratch = TensorView(v.side[next++], h.dtype(), h.shape(), d);
  const bool cast_dw = dw.dtype() != DType::kF32;
  TensorView dw_f32 = cast_dw ? TensorView(v.side[next], DType::kF32, w.shape(), d) : dw;
  return {"kernel", [=](const Stream& s) -> absl::Status {
            if (!matched) SG_RETURN_IF_ERROR(kernels::RmsNormForward(h, w, eps, y_scratch, rstd, s));
            SG_RETURN_IF_ERROR(kernels::AddRmsNormBackward(dy, dh, h, w, rstd, dx, dw_f32, s));
            if (cast_dw) return kernels::Cast(dw_f32, dw, s);
            return absl::OkStatus();
          }};
}

// Targets flattened to one row per token, logits to [tokens, vocab].
TensorView Flat(const TensorView& t) { return TensorView(t.raw(), t.dtype(), {t.numel()}, t.device()); }

// The options of softmax_cross_entropy node `n` fused with its backward node `bwd`: the constant
// loss cotangent, or the seed read from the device.
kernels::CrossEntropyOptions FusedCrossEntropyOptions(const Node& n, int bwd, const TensorView& device_seed,
                                                      const LoweringFusions& f) {
  kernels::CrossEntropyOptions o;
  o.ignore_index = graph::AttrInt(n, "ignore_index");
  if (auto c = f.cross_entropy_scale.find(bwd); c != f.cross_entropy_scale.end()) o.grad_scale = c->second;
  if (device_seed.raw() != nullptr) o.grad_scale_from = static_cast<const float*>(device_seed.raw());
  return o;
}

// softmax_cross_entropy onto kernels/cross_entropy: the loss only, or (fused with its backward)
// the loss and dlogits in one pass. The loss stays on the device: no host sync.
LoweredOp CrossEntropy(const Node& n, const NodeViews& v, const LoweringFusions& f, int index) {
  kernels::CrossEntropyOptions o;
  o.ignore_index = graph::AttrInt(n, "ignore_index");
  TensorView logits = AsMatrix(v.in[0]), targets = Flat(v.in[1]), loss = v.out[0];
  TensorView valid(v.side[0], DType::kI32, {}, logits.device());
  auto pair = f.cross_entropy.find(index);
  if (pair == f.cross_entropy.end()) {
    return {"kernel", [=](const Stream& s) {
              return kernels::CrossEntropyForward(logits, targets, loss, valid, o, s);
            }};
  }
  o = FusedCrossEntropyOptions(n, pair->second, v.device_seed, f);
  TensorView dlogits = AsMatrix(v.fused_out[0]);
  return {"kernel", [=](const Stream& s) {
            return kernels::CrossEntropyForwardBackward(logits, targets, loss, valid, dlogits, o, s);
          }};
}

}  // namespace

// The chunked LM head: per block of rows [r0, r1): logits = x[r0:r1] @ w^T into the block buffer,
// the cross-entropy rows over it (dlogits in place, scaled by the count of all rows), dx[r0:r1] =
// dlogits @ w, dw (+)= dlogits^T @ x[r0:r1] (overwritten by the first block); the count before
// and the mean after (kernels/cross_entropy's Count / Rows / Finish: the unchunked loss bitwise).
LoweredOp LmHead(const Node& n, const LmHeadViews& v, const LoweringFusions& f) {
  const LoweringFusions::LmHead& h = *f.lm_head;
  const kernels::CrossEntropyOptions o =
      FusedCrossEntropyOptions(n, f.cross_entropy.at(h.cross_entropy), v.device_seed, f);
  const TensorView x = AsMatrix(v.x), w = v.w, targets = Flat(v.targets), loss = v.loss, dx = AsMatrix(v.dx);
  const TensorView dw = v.dw;
  const int64_t rows = x.dim(0), vocab = w.dim(0);
  const int64_t block = (rows + h.chunks - 1) / h.chunks;
  TensorView valid(v.side[0], DType::kI32, {}, x.device()), row_loss(v.side[1], DType::kF32, {rows}, x.device());
  char* base = static_cast<char*>(v.block.raw());
  const DType dtype = v.block.dtype();
  return {"kernel", [=](const Stream& s) -> absl::Status {
            SG_RETURN_IF_ERROR(kernels::CrossEntropyCount(targets, valid, o, s));
            for (int64_t r0 = 0; r0 < rows; r0 += block) {
              const int64_t r1 = std::min(rows, r0 + block);
              const TensorView logits(base, dtype, {r1 - r0, vocab}, x.device());
              SG_ASSIGN_OR_RETURN(const TensorView xb, x.Slice0(r0, r1));
              kernels::GemmArgs forward;
              forward.a = xb;
              forward.b = w;
              forward.trans_b = true;
              forward.d = logits;
              SG_RETURN_IF_ERROR(kernels::Gemm(forward, s));
              SG_ASSIGN_OR_RETURN(const TensorView tb, targets.Slice0(r0, r1));
              SG_ASSIGN_OR_RETURN(const TensorView lb, row_loss.Slice0(r0, r1));
              SG_RETURN_IF_ERROR(kernels::CrossEntropyRows(logits, tb, valid, lb, logits, o, s));
              kernels::GemmArgs data;
              data.a = logits;
              data.b = w;
              SG_ASSIGN_OR_RETURN(data.d, dx.Slice0(r0, r1));
              SG_RETURN_IF_ERROR(kernels::Gemm(data, s));
              kernels::GemmArgs weight;
              weight.a = logits;
              weight.trans_a = true;
              weight.b = xb;
              weight.d = dw;
              weight.beta = r0 == 0 ? 0.f : 1.f;
              SG_RETURN_IF_ERROR(kernels::Gemm(weight, s));
            }
            return kernels::CrossEntropyFinish(row_loss, valid, loss, s);
          }};
}

namespace {

// An unfused softmax_cross_entropy_backward: the fused kernel with the loss written to scratch,
// scaled by a constant loss cotangent, or by one the runtime keeps at a host address and sets
// before each step (read at launch: eager execution only, Program::capturable is false then), or
// read from the seed input's device buffer by the kernel (capturable: the data-parallel token
// share, or the dynamic loss scale of Precision::kF16Mixed). A
// cotangent computed on the device has no kernel (the CE kernel takes its scale from the host):
// the reference runs it on the CPU.
LoweredOp CrossEntropyBackward(const Node& n, const NodeViews& v, const LoweringFusions& f, int index) {
  auto scale = f.cross_entropy_scale.find(index);
  auto host_scale = f.cross_entropy_host_scale.find(index);
  const bool device_scale = f.cross_entropy_device_scale.count(index) > 0;
  if (scale == f.cross_entropy_scale.end() && host_scale == f.cross_entropy_host_scale.end() && !device_scale) {
    return {};
  }
  kernels::CrossEntropyOptions o;
  o.ignore_index = graph::AttrInt(n, "ignore_index");
  const float* seed = nullptr;
  if (scale != f.cross_entropy_scale.end()) {
    o.grad_scale = scale->second;
  } else if (device_scale) {
    o.grad_scale_from = static_cast<const float*>(v.in[0].raw());
  } else {
    seed = host_scale->second;
  }
  TensorView logits = AsMatrix(v.in[1]), targets = Flat(v.in[2]), dlogits = AsMatrix(v.out[0]);
  TensorView loss(v.side[0], DType::kF32, {}, logits.device()), valid(v.side[1], DType::kI32, {}, logits.device());
  return {"kernel", [=](const Stream& s) {
            kernels::CrossEntropyOptions launch = o;
            if (seed != nullptr) launch.grad_scale = *seed;
            return kernels::CrossEntropyForwardBackward(logits, targets, loss, valid, dlogits, launch, s);
          }};
}

LoweredOp Attention(const Node& n, const NodeViews& v) {
  const kernels::AttentionOptions o = AttnOptions(n);
  TensorView q = v.in[0], k = v.in[1], val = v.in[2], out = v.out[0];
  TensorView lse(v.side[0], DType::kF32, LseShape(q.shape()), q.device());
  return {"kernel", [=](const Stream& s) { return kernels::AttentionForward(q, k, val, o, out, lse, s); }};
}

// The CUDA attention kernels' dtypes and head dims, for q ([batch, seq, heads, head_dim]).
// OK when the CUDA attention kernels take q's head (any dtype up to kAttentionMaxHeadDim); else
// Unimplemented, naming the head size and the limit.
absl::Status CheckCudaAttentionHead(const TensorView& q) {
  if (q.dim(3) <= kernels::kAttentionMaxHeadDim) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("attention on ", q.device().ToString(), ": head_dim ", q.dim(3),
                                               " is wider than the CUDA kernels take (", kernels::kAttentionMaxHeadDim,
                                               ")"));
}

LoweredOp AttentionBackward(const Node& n, const NodeViews& v, bool matched) {
  const kernels::AttentionOptions o = AttnOptions(n);
  TensorView dout = v.in[0], q = v.in[1], k = v.in[2], val = v.in[3], out = v.in[4];
  TensorView dq = v.out[0], dk = v.out[1], dv = v.out[2];
  TensorView lse(v.side[0], DType::kF32, LseShape(q.shape()), q.device());
  TensorView out_scratch = matched ? out : TensorView(v.side[1], out.dtype(), out.shape(), out.device());
  return {"kernel", [=](const Stream& s) -> absl::Status {
            if (!matched) SG_RETURN_IF_ERROR(kernels::AttentionForward(q, k, val, o, out_scratch, lse, s));
            return kernels::AttentionBackward(q, k, val, out, dout, lse, o, dq, dk, dv, s);
          }};
}

}  // namespace

SideBuffers PlanSideBuffers(const Graph& g, const std::vector<Shape>& shapes, const LoweringFusions& fusions,
                            MemoryPlanner* planner) {
  SideBuffers sb;
  const auto& nodes = g.nodes();
  const int nn = int(nodes.size());
  auto bytes = [&](int v) { return NumElements(shapes[v]) * SizeOf(g.type(v).dtype); };
  // Whether output value v is written as f32 (natively or through a folded cast).
  auto f32 = [&](int v) { return g.type(v).dtype == DType::kF32 || fusions.folded_cast.count(v) > 0; };
  auto matches = [&](const Node& f, const Node& b) {
    if (f.op == OpKind::kRmsNorm) {
      // An add_rmsnorm_backward reads rstd of its h; a plain norm of that h (selective recompute's
      // copy of the forward's y) computed it, so the backward need not recompute it again.
      if (b.op == OpKind::kAddRmsNormBackward) {
        return b.inputs[2] == f.inputs[0] && b.inputs[3] == f.inputs[1] &&
               graph::AttrFloat(f, "eps") == graph::AttrFloat(b, "eps");
      }
      return b.op == OpKind::kRmsNormBackward && b.inputs[1] == f.inputs[0] && b.inputs[2] == f.inputs[1];
    }
    if (f.op == OpKind::kAddRmsNorm) {
      return b.op == OpKind::kAddRmsNormBackward && b.inputs[2] == f.outputs[1] && b.inputs[3] == f.inputs[2];
    }
    return f.op == OpKind::kAttention && b.op == OpKind::kAttentionBackward && b.inputs[4] == f.outputs[0] &&
           b.inputs[1] == f.inputs[0] && b.inputs[2] == f.inputs[1] && b.inputs[3] == f.inputs[2];
  };
  // Each backward reads the statistics of the closest forward before it that computed the same
  // values (after recompute that is the recomputed copy, not the original).
  std::map<int, std::vector<int>> readers;  // forward node -> backward nodes
  for (int j = 0; j < nn; ++j) {
    if (nodes[j].op != OpKind::kRmsNormBackward && nodes[j].op != OpKind::kAttentionBackward &&
        nodes[j].op != OpKind::kAddRmsNormBackward) {
      continue;
    }
    for (int i = j - 1; i >= 0; --i) {
      if (matches(nodes[i], nodes[j])) {
        readers[i].push_back(j);
        sb.matched[j] = true;
        break;
      }
    }
  }
  for (int i = 0; i < nn; ++i) {
    const Node& n = nodes[i];
    if (n.op == OpKind::kSoftmaxCrossEntropy) {
      sb.slots[i] = {planner->Add(4, i, i)};
      if (fusions.lm_head && fusions.lm_head->cross_entropy == i) {
        sb.slots[i].push_back(planner->Add(Rows(shapes[n.inputs[0]]) * 4, i, i));
      }
      continue;
    }
    if (n.op != OpKind::kRmsNorm && n.op != OpKind::kAttention && n.op != OpKind::kAddRmsNorm) continue;
    const Shape& xs = shapes[n.inputs[0]];
    const int64_t stat = n.op == OpKind::kAttention ? NumElements(LseShape(xs)) * 4 : Rows(xs) * 4;
    int last = i;
    for (int j : readers[i]) last = std::max(last, j);
    const int slot = planner->Add(stat, i, last);
    sb.slots[i] = {slot};
    for (int j : readers[i]) sb.slots[j] = {slot};
  }
  for (int j = 0; j < nn; ++j) {
    const Node& b = nodes[j];
    const bool matched = sb.matched.count(j) > 0;
    if (b.op == OpKind::kRmsNormBackward || b.op == OpKind::kAddRmsNormBackward) {
      std::vector<int>& s = sb.slots[j];
      const bool add = b.op == OpKind::kAddRmsNormBackward;
      const int x = b.inputs[add ? 2 : 1], w = b.inputs[add ? 3 : 2];
      if (!matched) s = {planner->Add(Rows(shapes[x]) * 4, j, j), planner->Add(bytes(x), j, j)};
      if (!f32(b.outputs[1])) s.push_back(planner->Add(NumElements(shapes[w]) * 4, j, j));
    } else if (b.op == OpKind::kSoftmaxCrossEntropyBackward && !fusions.fused_away.count(j)) {
      sb.slots[j] = {planner->Add(4, j, j), planner->Add(4, j, j)};
    } else if (b.op == OpKind::kEmbeddingBackward && !f32(b.outputs[0])) {
      sb.slots[j] = {planner->Add(NumElements(shapes[b.outputs[0]]) * 4, j, j)};
    } else if (b.op == OpKind::kSwiGLUBackward && fusions.swiglu_backward_gemm.count(j)) {
      const int w2 = nodes[fusions.swiglu_backward_gemm.at(j)].inputs[1];
      sb.slots[j] = {planner->Add(bytes(w2), j, j)};
    } else if (b.op == OpKind::kAttentionBackward && !matched) {
      const int q = b.inputs[1], out = b.inputs[4];
      sb.slots[j] = {planner->Add(NumElements(LseShape(shapes[q])) * 4, j, j), planner->Add(bytes(out), j, j)};
    }
  }
  return sb;
}

absl::StatusOr<LoweredOp> LowerNode(const Node& n, const NodeViews& v, const SideBuffers& side,
                                    const LoweringFusions& fusions, int index, Device device) {
  auto matched = [&] {
    auto it = side.matched.find(index);
    return it != side.matched.end() && it->second;
  };
  switch (n.op) {
    case OpKind::kRmsNorm:
      return RmsNorm(n, v);
    case OpKind::kRmsNormBackward:
      return RmsNormBackward(n, v, matched());
    case OpKind::kAddRmsNorm:
      return AddRmsNorm(n, v);
    case OpKind::kAddRmsNormBackward:
      return AddRmsNormBackward(n, v, matched());
    case OpKind::kSoftmaxCrossEntropy:
      return CrossEntropy(n, v, fusions, index);
    case OpKind::kSoftmaxCrossEntropyBackward: {
      LoweredOp op = CrossEntropyBackward(n, v, fusions, index);
      if (!op.launch) return Reference(n, v, device);
      return op;
    }
    case OpKind::kAttention:
      // The CUDA kernels cover every dtype up to head_dim kAttentionMaxHeadDim (flash kernels for bf16
      // and f16 at 64 and 128, plain ones otherwise: kernels/attention/attention.h). On the CPU, f16
      // runs the graph interpreter, as the f16 CPU step always has.
      if (device.is_cpu() && v.in[0].dtype() == DType::kF16) return Reference(n, v, device);
      if (!device.is_cpu()) SG_RETURN_IF_ERROR(CheckCudaAttentionHead(v.in[0]));
      return Attention(n, v);
    case OpKind::kAttentionBackward:
      if (device.is_cpu() && v.in[1].dtype() == DType::kF16) return Reference(n, v, device);
      if (!device.is_cpu()) SG_RETURN_IF_ERROR(CheckCudaAttentionHead(v.in[1]));
      return AttentionBackward(n, v, matched());
    case OpKind::kMatmul:
      return Matmul(n, v);
    case OpKind::kEmbedding: {
      TensorView table = v.in[0], ids = v.in[1], out = v.out[0];
      return LoweredOp{"kernel", [=](const Stream& s) { return kernels::EmbeddingForward(ids, table, out, s); }};
    }
    case OpKind::kEmbeddingBackward: {
      TensorView dy = v.in[0], ids = v.in[1], dtable = v.out[0];
      const bool cast = dtable.dtype() != DType::kF32;
      TensorView f32 = cast ? TensorView(v.side[0], DType::kF32, dtable.shape(), dtable.device()) : dtable;
      return LoweredOp{"kernel", [=](const Stream& s) -> absl::Status {
                         SG_RETURN_IF_ERROR(kernels::EmbeddingBackward(dy, ids, f32, s));
                         return cast ? kernels::Cast(f32, dtable, s) : absl::OkStatus();
                       }};
    }
    case OpKind::kSwiGLU: {
      TensorView gate = v.in[0], up = v.in[1], out = v.out[0];
      return LoweredOp{"kernel", [=](const Stream& s) { return kernels::SwiGluForward(gate, up, out, s); }};
    }
    case OpKind::kSwiGLUBackward: {
      TensorView dy = v.in[0], gate = v.in[1], up = v.in[2], dg = v.out[0], du = v.out[1];
      if (fusions.swiglu_backward_gemm.count(index)) {
        // dh = dy @ W2 computed in the kernel's k-loop, never stored; W2 [D, F] transposed first
        // (the kernel reads K-major operands only).
        const TensorView dy_mlp = v.fused_in[0], w2 = v.fused_in[1];
        const TensorView w2t(v.side[0], w2.dtype(), {w2.dim(1), w2.dim(0)}, w2.device());
        return LoweredOp{"kernel", [=](const Stream& s) -> absl::Status {
                           SG_RETURN_IF_ERROR(kernels::TransposeMatrix(w2, w2t, s));
                           return kernels::WgmmaGemmSwiGluBackward(dy_mlp, w2t, gate, up, dg, du, s);
                         }};
      }
      return LoweredOp{"kernel", [=](const Stream& s) { return kernels::SwiGluBackward(dy, gate, up, dg, du, s); }};
    }
    case OpKind::kRope:
    case OpKind::kRopeBackward: {
      kernels::RopeOptions o;
      o.theta = float(graph::AttrFloat(n, "theta"));
      TensorView x = v.in[0], out = v.out[0];
      if (n.op == OpKind::kRope) {
        return LoweredOp{"kernel", [=](const Stream& s) { return kernels::RopeForward(x, {}, out, {}, o, s); }};
      }
      return LoweredOp{"kernel", [=](const Stream& s) { return kernels::RopeBackward(x, {}, out, {}, o, s); }};
    }
    case OpKind::kAdd:
      if (v.in[0].numel() != v.in[1].numel()) return Reference(n, v, device);  // broadcasting add
      return LoweredOp{"kernel", [a = v.in[0], b = v.in[1], out = v.out[0]](const Stream& s) {
                         return kernels::Add(a, b, out, s);
                       }};
    case OpKind::kScale: {
      const float f = float(graph::AttrFloat(n, "factor"));
      return LoweredOp{"kernel", [x = v.in[0], out = v.out[0], f](const Stream& s) { return kernels::Scale(x, f, out, s); }};
    }
    case OpKind::kCast:
      if (!IsFloating(v.in[0].dtype()) || !IsFloating(v.out[0].dtype())) return Reference(n, v, device);
      return LoweredOp{"kernel", [x = v.in[0], out = v.out[0]](const Stream& s) { return kernels::Cast(x, out, s); }};
    case OpKind::kFill:
      if (!IsFloating(v.out[0].dtype())) return Reference(n, v, device);
      return LoweredOp{"kernel", [out = v.out[0], val = float(graph::AttrFloat(n, "value"))](const Stream& s) {
                         return kernels::Fill(out, val, s);
                       }};
    default:
      return Reference(n, v, device);
  }
}

}  // namespace sg::compiler
