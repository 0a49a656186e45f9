#include "compiler/lowering.h"

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "compiler/lowering_fusion.h"
#include "compiler/offload.h"
#include "compiler/wgrad_stream.h"
#include "compiler/op_lowering.h"
#include "compiler/training_graph.h"
#include "graph/ops.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

namespace sg::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;

namespace {

// LowerOptions::wgrad_stream: compute joins a weight-gradient matmul at the latest before the
// WgradJoinMatmuls()-th matmul after it (each join extends its inputs' lives that far): 2, or
// SG_WGRAD_JOIN_MATMULS (1-16) in the environment, for measuring the trade on a GPU.
int WgradJoinMatmuls() {
  const char* v = std::getenv("SG_WGRAD_JOIN_MATMULS");
  const int k = v == nullptr ? 2 : std::atoi(v);
  return k >= 1 && k <= 16 ? k : 2;
}

// ... and their GEMMs planned for SG_WGRAD_SMS SMs (kernels::GemmArgs::sm_count), leaving the rest
// to the compute stream's kernels; unset or 0: all SMs.
int WgradSms() {
  const char* v = std::getenv("SG_WGRAD_SMS");
  return v == nullptr ? 0 : std::max(0, std::atoi(v));
}

// LowerOptions::swiglu_backward_gemm, unless SG_FUSE_SWIGLU_BWD in the environment says otherwise
// (0: off, 1: on; measuring the fused and unfused steps in one binary).
bool SwiGluBackwardGemm(bool option) {
  const char* v = std::getenv("SG_FUSE_SWIGLU_BWD");
  if (v != nullptr && std::string(v) == "0") return false;
  if (v != nullptr && std::string(v) == "1") return true;
  return option;
}

bool IsSource(OpKind op) { return op == OpKind::kParameter || op == OpKind::kInput; }

// Elementwise producers may write their output over an input of the same shape.
bool InPlaceSafe(OpKind op) {
  return op == OpKind::kAdamW || graph::Schema(op).is_elementwise;
}

// Which input of `n` an in-place output `k` would overwrite, given the source value `src`.
bool ReadsOnlyAt(const Node& n, int k, int src) {
  if (n.op == OpKind::kAdamW) {
    static constexpr int kInputOf[3] = {0, 2, 3};  // p' over p, m' over m, v' over v
    return n.inputs[kInputOf[k]] == src;
  }
  return std::find(n.inputs.begin(), n.inputs.end(), src) != n.inputs.end();
}

class Lowerer {
 public:
  Lowerer(Program* p, const LowerOptions& o) : p_(p), g_(p->graph), o_(o) {}

  absl::Status Run() {
    SG_RETURN_IF_ERROR(graph::Verify(g_));
    SG_RETURN_IF_ERROR(graph::CheckBinding(g_, p_->binding));
    SG_RETURN_IF_ERROR(Shapes());
    // Device-seeded cross-entropy backwards fuse with their forward (one kernel, no scratch of
    // its own: what a CUDA graph capture needs), unless fuse_device_scalars is off (the
    // tensor-parallel runtimes replace the unfused pair by vocabulary-parallel steps).
    std::set<std::string> device_seeds;
    if (o_.fuse_device_scalars) device_seeds = o_.device_scalars;
    if (o_.loss_scaler) device_seeds.insert(kLossScaleName);
    if (o_.lm_head_chunks > 1 && o_.wgrad_stream) {
      return absl::InvalidArgumentError("Lower: lm_head_chunks > 1 with wgrad_stream (the weight gradient of the "
                                        "LM head is computed inside the head's launch, not by a matmul step)");
    }
    fusions_ = FindLoweringFusions(g_, device_seeds, o_.lm_head_chunks, SwiGluBackwardGemm(o_.swiglu_backward_gemm),
                                   o_.bf16_gradients);
    KeepRunnableSwiGluBackwardGemms();
    HostScalarSeeds();
    Roots();
    SG_RETURN_IF_ERROR(Updates());
    WgradJoins();
    InPlace();
    Offloads();
    Slots();
    SG_RETURN_IF_ERROR(Allocate());
    SG_RETURN_IF_ERROR(BatchAdamW());
    return Steps();
  }

  void set_allocate(bool a) { allocate_ = a; }

 private:
  // softmax_cross_entropy_backward nodes seeded by an input the runtime mirrors on the host, or one
  // the kernel reads from the device (LowerOptions::device_scalars; those under dynamic loss scaling
  // were found, and fused, by FindLoweringFusions).
  void HostScalarSeeds() {
    const auto& nodes = g_.nodes();
    for (int j = 0; j < int(nodes.size()); ++j) {
      const Node& b = nodes[j];
      if (b.op != OpKind::kSoftmaxCrossEntropyBackward || fusions_.cross_entropy_scale.count(j) ||
          fusions_.cross_entropy_device_scale.count(j)) {
        continue;
      }
      const Node& seed = nodes[g_.value(b.inputs[0]).producer];
      if (seed.op != OpKind::kInput || g_.type(b.inputs[0]).dtype != DType::kF32 || g_.type(b.inputs[0]).rank() != 0) {
        continue;
      }
      const std::string name = graph::AttrString(seed, "name");
      if (o_.device_scalars.count(name)) {
        fusions_.cross_entropy_device_scale[j] = b.inputs[0];
        continue;
      }
      auto it = o_.host_scalars.find(name);
      if (it == o_.host_scalars.end() || it->second == nullptr) continue;
      fusions_.cross_entropy_host_scale[j] = it->second;
      p_->capturable = false;
    }
  }

  // The swiglu_backward + dh matmul pairs the kernel runs: bf16 throughout, its shapes, and (when
  // allocating) this process's GPU; the others stay two steps.
  void KeepRunnableSwiGluBackwardGemms() {
    const auto& nodes = g_.nodes();
    for (auto it = fusions_.swiglu_backward_gemm.begin(); it != fusions_.swiglu_backward_gemm.end();) {
      const Node& s = nodes[it->first];
      const Node& m = nodes[it->second];
      const int dy = m.inputs[0], w = m.inputs[1];
      bool bf16 = true;
      for (int v : {dy, w, s.inputs[0], s.inputs[1], s.inputs[2], s.outputs[0], s.outputs[1]}) {
        bf16 = bf16 && g_.type(v).dtype == DType::kBF16;
      }
      const Shape& dys = shape_[dy];
      const int64_t k = dys.empty() ? 1 : dys.back(), rows = NumElements(dys) / std::max<int64_t>(k, 1);
      const bool runs = bf16 && shape_[w].size() == 2 && shape_[w][0] == k &&
                        kernels::WgmmaGemmSwiGluBackwardSupports(rows, k, shape_[w][1], DType::kBF16, p_->device,
                                                                 /*query_gpu=*/allocate_)
                            .ok();
      if (runs) {
        ++it;
        continue;
      }
      fusions_.fused_away.erase(it->second);
      it = fusions_.swiglu_backward_gemm.erase(it);
    }
  }

  int64_t Bytes(int v) const { return NumElements(shape_[v]) * SizeOf(g_.type(v).dtype); }

  absl::Status Shapes() {
    shape_.resize(g_.num_value_ids());
    for (int v = 0; v < g_.num_value_ids(); ++v) {
      if (!g_.has_value(v)) continue;
      SG_ASSIGN_OR_RETURN(shape_[v], graph::Evaluate(g_.type(v).shape, p_->binding));
    }
    return absl::OkStatus();
  }

  // Values with a buffer outside the arena: sources (except transient ones) and the bf16 weight
  // copies.
  bool Persistent(int v) const {
    const Node& n = g_.nodes()[g_.value(v).producer];
    return (IsSource(n.op) && TransientFrom(n) < 0) || fusions_.weight_copy.count(v) > 0;
  }

  // Alias roots (reshape shares its input's buffer; a folded cast's input is its f32 output; a
  // bf16 gradient's f32 cast output is the bf16 value) and
  // last readers per root.
  void Roots() {
    const int nv = g_.num_value_ids();
    root_.resize(nv);
    std::iota(root_.begin(), root_.end(), 0);
    const auto& nodes = g_.nodes();
    for (const auto& [v, f32] : fusions_.folded_cast) root_[v] = f32;
    for (const auto& [f32, half] : fusions_.bf16_gradient) root_[f32] = half;
    for (const auto& [dup, copy] : fusions_.duplicate_copy) root_[dup] = copy;
    for (int i = 0; i < int(nodes.size()); ++i) {
      if (nodes[i].op == OpKind::kReshape) root_[nodes[i].outputs[0]] = root_[nodes[i].inputs[0]];
    }
    last_use_.assign(nv, -1);
    for (int i = 0; i < int(nodes.size()); ++i) {
      for (int v : nodes[i].inputs) last_use_[root_[v]] = std::max(last_use_[root_[v]], i);
    }
    // The chunked LM head's launch at the cross-entropy node reads the logits matmul's x and W.
    if (const auto& h = fusions_.lm_head) {
      for (int v : nodes[h->matmul].inputs) last_use_[root_[v]] = std::max(last_use_[root_[v]], h->cross_entropy);
    }
    // The fused SwiGLU backward's launch reads its dh matmul's dy and W2.
    for (const auto& [s, m] : fusions_.swiglu_backward_gemm) {
      for (int v : nodes[m].inputs) last_use_[root_[v]] = std::max(last_use_[root_[v]], s);
    }
    for (const graph::GraphOutput& o : g_.outputs()) {
      auto until = o_.output_live_until.find(o.name);
      const int last = until == o_.output_live_until.end() ? int(nodes.size()) : until->second;
      last_use_[root_[o.value]] = std::max(last_use_[root_[o.value]], last);
    }
  }

  // The node index from which a transient source must be live, or -1 for a state source.
  int TransientFrom(const Node& n) const {
    if (n.op != OpKind::kParameter && n.op != OpKind::kInput) return -1;
    auto it = o_.transient_sources.find(graph::AttrString(n, "name"));
    return it == o_.transient_sources.end() ? -1 : it->second;
  }

  // "update:<source>" outputs: in place when safe, else a write-back copy at the end.
  absl::Status Updates() {
    for (const Node& n : g_.nodes()) {
      if (IsSource(n.op)) source_of_name_[graph::AttrString(n, "name")] = n.outputs[0];
    }
    for (const graph::GraphOutput& o : g_.outputs()) {
      if (!absl::StartsWith(o.name, "update:")) continue;
      const std::string name = o.name.substr(7);
      auto it = source_of_name_.find(name);
      if (it == source_of_name_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("graph output '", o.name, "' names no source '", name, "'"));
      }
      const int src = it->second, v = o.value;
      if (g_.type(src) != g_.type(v)) {
        return absl::InvalidArgumentError(absl::StrCat("graph output '", o.name, "': expected the source's type ",
                                                       g_.type(src).ToString(), ", found ", g_.type(v).ToString()));
      }
      const int producer = g_.value(v).producer;
      const Node& n = g_.nodes()[producer];
      const int k = g_.value(v).output_index;
      const bool in_place = root_[v] == v && !IsSource(n.op) && InPlaceSafe(n.op) &&
                            last_use_[root_[src]] == producer && ReadsOnlyAt(n, k, src) &&
                            std::count_if(g_.outputs().begin(), g_.outputs().end(),
                                          [&](const graph::GraphOutput& x) { return x.value == v; }) == 1;
      if (in_place) {
        root_[v] = root_[src];
      } else {
        writebacks_.push_back({v, src});
      }
    }
    return absl::OkStatus();
  }

  // LowerOptions::wgrad_stream: the weight-gradient matmuls and their joins (compiler/wgrad_stream.h);
  // their inputs live until the joins.
  void WgradJoins() {
    if (!o_.wgrad_stream) return;
    for (const WgradJoin& j : ChooseWgradJoins(g_, root_, o_.gradient_read_at, WgradJoinMatmuls())) {
      wgrad_of_[j.node] = int(wgrads_.size());
      wgrads_.push_back({j.node, j.join});
      for (int v : g_.nodes()[j.node].inputs) last_use_[root_[v]] = std::max(last_use_[root_[v]], j.join);
    }
  }

  // The weight-gradient stream's steps before node i: compute waiting for the splits joined there.
  void WgradWaits(int i) {
    for (size_t k = 0; k < wgrads_.size(); ++k) {
      if (wgrads_[k].join != i || !wgrads_[k].split) continue;
      Event* done = allocate_ ? p_->wgrad_events[2 * k + 1].get() : nullptr;
      Step st;
      st.name = absl::StrCat("wait weight gradient ", StepName(g_.nodes()[wgrads_[k].node]));
      st.node = i;
      st.phase = g_.nodes()[i].phase;
      st.impl = "wait";
      st.launch = [done](const Stream& s) { return done->Block(s); };
      p_->schedule.steps.push_back(std::move(st));
    }
  }

  // Moves node i's lowered step (the last one scheduled) to the weight-gradient stream: a fork
  // recorded on compute before it, the kernel after the stream waits for the fork, then its done.
  void SplitWgrad(int i) {
    auto it = wgrad_of_.find(i);
    if (it == wgrad_of_.end()) return;
    WgradSplit& w = wgrads_[size_t(it->second)];
    w.split = true;
    Event* fork = allocate_ ? p_->wgrad_events[2 * size_t(it->second)].get() : nullptr;
    Event* done = allocate_ ? p_->wgrad_events[2 * size_t(it->second) + 1].get() : nullptr;
    Step kernel = std::move(p_->schedule.steps.back());
    p_->schedule.steps.pop_back();
    Step record;
    record.name = absl::StrCat("fork ", kernel.name);
    record.node = i;
    record.phase = kernel.phase;
    record.impl = "wait";
    record.launch = [fork](const Stream& s) { return fork->Record(s); };
    p_->schedule.steps.push_back(std::move(record));
    kernel.stream = 3;
    kernel.launch = [fork, done, inner = std::move(kernel.launch)](const Stream& s) -> absl::Status {
      SG_RETURN_IF_ERROR(fork->Block(s));
      SG_RETURN_IF_ERROR(inner(s));
      return done->Record(s);
    };
    p_->schedule.steps.push_back(std::move(kernel));
  }

  static std::string StepName(const Node& n) {
    return n.scope.empty() ? std::string(graph::OpName(n.op)) : absl::StrCat(graph::OpName(n.op), " @", n.scope);
  }

  // An output overwrites an input (lowering_fusion.h lists the kernels that allow it) when its
  // producer is the input buffer's last reader and the buffer is an arena value.
  void InPlace() {
    for (const auto& [out, in] : fusions_.in_place) {
      const int r = root_[in], producer = g_.value(out).producer;
      if (root_[out] != out || Persistent(r) || last_use_[r] != producer || Bytes(out) != Bytes(r)) continue;
      root_[out] = r;
      last_use_[r] = std::max(last_use_[r], last_use_[out]);
    }
  }

  // LowerOptions::offload_activations: which values leave the arena between forward and backward.
  void Offloads() {
    if (o_.offload_activations <= 0) return;
    std::set<int> outputs;
    for (const graph::GraphOutput& o : g_.outputs()) outputs.insert(root_[o.value]);
    std::set<int> cross_entropy;
    for (const auto& [fwd, bwd] : fusions_.cross_entropy) cross_entropy.insert(root_[g_.nodes()[bwd].outputs[0]]);
    offloads_ = ChooseOffloads(
        g_, root_, [this](int v) { return Bytes(v); },
        [&](int v) { return !Persistent(v) && !outputs.count(v) && !cross_entropy.count(v); },
        o_.offload_activations, kOffloadLead);
    for (size_t k = 0; k < offloads_.size(); ++k) offload_of_[offloads_[k].root] = int(k);
    if (!offloads_.empty()) p_->offload_host_bytes = offloads_.back().host_offset + AlignUp(offloads_.back().bytes);
  }

  // Arena slots: one per non-persistent root, live from its first writer (a fused cross-entropy
  // writes dlogits at the forward node) to its last reader; plus side buffers.
  void Slots() {
    const auto& nodes = g_.nodes();
    const int nv = g_.num_value_ids();
    std::vector<int> first(nv, INT32_MAX);
    for (int i = 0; i < int(nodes.size()); ++i) {
      if (const int from = TransientFrom(nodes[i]); from >= 0) {  // an arena source (fsdp.h)
        first[nodes[i].outputs[0]] = from;
        continue;
      }
      if (IsSource(nodes[i].op)) continue;
      for (int v : nodes[i].outputs) first[root_[v]] = std::min(first[root_[v]], i);
    }
    for (const auto& [fwd, bwd] : fusions_.cross_entropy) {
      const int d = root_[nodes[bwd].outputs[0]];
      first[d] = std::min(first[d], fwd);
    }
    // The chunked LM head writes dh and dW in its launch; its logits buffer is one block of rows,
    // used only during that launch.
    int head_logits = -1;
    int64_t head_block_bytes = 0;
    if (const auto& h = fusions_.lm_head) {
      for (int k : {h->dx, h->dw}) first[root_[nodes[k].outputs[0]]] = std::min(first[root_[nodes[k].outputs[0]]], h->cross_entropy);
      const int logits = nodes[h->cross_entropy].inputs[0];
      head_logits = root_[logits];
      const int64_t vocab = shape_[logits].back(), rows = NumElements(shape_[logits]) / std::max<int64_t>(vocab, 1);
      head_block_bytes = (rows + h->chunks - 1) / h->chunks * vocab * SizeOf(g_.type(logits).dtype);
    }
    // The fused SwiGLU backward's dh is never written: no buffer.
    for (const auto& [s, m] : fusions_.swiglu_backward_gemm) first[root_[nodes[s].inputs[0]]] = INT32_MAX;
    slot_.assign(nv, -1);
    for (int v = 0; v < nv; ++v) {
      if (first[v] == INT32_MAX || root_[v] != v || Persistent(v)) continue;
      if (v == head_logits) {
        slot_[v] = planner_.Add(head_block_bytes, fusions_.lm_head->cross_entropy, fusions_.lm_head->cross_entropy);
        continue;
      }
      auto off = offload_of_.find(v);
      if (off == offload_of_.end()) {
        slot_[v] = planner_.Add(Bytes(v), first[v], std::max(first[v], last_use_[v]));
        continue;
      }
      // Offloaded: one slot for the forward, until compute has waited for the copy to the host,
      // and one for the reloaded copy, from its issue to the last reader.
      const ActivationOffload& o = offloads_[size_t(off->second)];
      slot_[v] = planner_.Add(Bytes(v), first[v], o.wait_at);
      reload_slot_[v] = planner_.Add(Bytes(v), o.reload_at, std::max(o.reload_at, last_use_[v]));
    }
    side_ = PlanSideBuffers(g_, shape_, fusions_, &planner_);
    p_->slot_values.assign(size_t(planner_.size()), -1);
    for (int v = 0; v < nv; ++v) {
      if (slot_[v] >= 0) p_->slot_values[size_t(slot_[v])] = v;
    }
    for (const auto& [v, slot] : reload_slot_) p_->slot_values[size_t(slot)] = v;
  }

  // State: sources then weight copies, each aligned, in graph order.
  int64_t StateBytes(std::vector<int64_t>* offsets) const {
    int64_t bytes = 0;
    for (const Node& n : g_.nodes()) {
      for (int v : n.outputs) {
        if (!Persistent(v)) continue;
        if (offsets != nullptr) (*offsets)[v] = bytes;
        bytes += AlignUp(std::max<int64_t>(Bytes(v), 1));
      }
    }
    return bytes;
  }

  absl::Status Allocate() {
    std::vector<int64_t> state_offset(g_.num_value_ids(), -1);
    const int64_t state_bytes = StateBytes(&state_offset);
    p_->plan = planner_.Plan();
    p_->state_bytes = state_bytes;
    char *state = nullptr, *arena = nullptr;
    if (allocate_) {
      SG_ASSIGN_OR_RETURN(p_->state, DeviceMemory::Allocate(p_->device, state_bytes));
      SG_ASSIGN_OR_RETURN(p_->arena, DeviceMemory::Allocate(p_->device, p_->plan.arena_bytes));
      state = p_->state.data();
      arena = p_->arena.data();
    } else {
      // Planning only: views get addresses that are never dereferenced (no launch runs).
      state = reinterpret_cast<char*>(uintptr_t{1} << 40);
      arena = reinterpret_cast<char*>(uintptr_t{1} << 44);
    }
    p_->values.assign(g_.num_value_ids(), TensorView());
    for (int v = 0; v < g_.num_value_ids(); ++v) {
      if (!g_.has_value(v)) continue;
      const int r = root_[v];
      // No buffer (a fused SwiGLU backward's dh): a view of nothing, which no step reads.
      char* base = state_offset[r] >= 0 ? state + state_offset[r]
                   : slot_[r] >= 0      ? arena + p_->plan.offsets[slot_[r]]
                                        : nullptr;
      p_->values[v] = TensorView(base, g_.type(v).dtype, shape_[v], p_->device);
    }
    for (const auto& [v, f32] : fusions_.folded_cast) p_->values[v] = p_->values[f32];
    for (const auto& [f32, half] : fusions_.bf16_gradient) p_->values[f32] = p_->values[half];
    SG_RETURN_IF_ERROR(OffloadBuffers(arena));
    for (size_t k = 0; k < 2 * wgrads_.size() && allocate_; ++k) {
      SG_ASSIGN_OR_RETURN(Event e, Event::Create(p_->device));
      p_->wgrad_events.push_back(std::make_unique<Event>(std::move(e)));
    }
    for (const auto& [copy, param] : fusions_.weight_copy) {
      p_->weight_copies.push_back({p_->values[param], p_->values[copy]});
    }
    for (const Node& n : g_.nodes()) {
      if (!IsSource(n.op)) continue;
      const std::string& name = graph::AttrString(n, "name");
      p_->sources[name] = p_->values[n.outputs[0]];
      if (n.op == OpKind::kInput) p_->input_names.push_back(name);
    }
    for (const graph::GraphOutput& o : g_.outputs()) p_->outputs[o.name] = p_->values[o.value];
    if (o_.loss_scaler) SG_RETURN_IF_ERROR(LossScalerState());
    side_views_.clear();
    for (int s = 0; s < planner_.size(); ++s) side_views_.push_back(arena + p_->plan.offsets[s]);
    return absl::OkStatus();
  }

  // The reloaded views of offloaded values (and their aliases), the host buffer and the events.
  absl::Status OffloadBuffers(char* arena) {
    if (offloads_.empty()) return absl::OkStatus();
    for (int v = 0; v < g_.num_value_ids(); ++v) {
      if (!g_.has_value(v) || !reload_slot_.count(root_[v])) continue;
      reloaded_[v] = TensorView(arena + p_->plan.offsets[reload_slot_.at(root_[v])], g_.type(v).dtype, shape_[v],
                                p_->device);
    }
    if (!allocate_) return absl::OkStatus();
    SG_ASSIGN_OR_RETURN(p_->offload_host, AllocateOffloadHost(p_->device, p_->offload_host_bytes));
    for (size_t k = 0; k < 4 * offloads_.size(); ++k) {
      SG_ASSIGN_OR_RETURN(Event e, Event::Create(p_->device));
      p_->offload_events.push_back(std::make_unique<Event>(std::move(e)));
    }
    return absl::OkStatus();
  }

  // The offload steps issued before node i: copies to and from the host on the copy stream, each
  // after an event recorded on compute there, and compute's waits for them.
  void OffloadSteps(int i) {
    for (size_t k = 0; k < offloads_.size(); ++k) {
      const ActivationOffload& o = offloads_[k];
      if (i != o.producer + 1 && i != o.wait_at + 1 && i != o.reload_at && i != o.bwd_first) continue;
      Event* ev[4] = {nullptr, nullptr, nullptr, nullptr};  // offload ready, done, reload ready, done
      for (int e = 0; e < 4 && allocate_; ++e) ev[e] = p_->offload_events[4 * k + size_t(e)].get();
      const TensorView dev = p_->values[o.root], back = reloaded_.at(o.root);
      const TensorView host(allocate_ ? static_cast<char*>(p_->offload_host.get()) + o.host_offset : nullptr,
                            dev.dtype(), dev.shape(), Device::Cpu());
      const Node& producer = g_.nodes()[o.producer];
      const std::string what = absl::StrCat(graph::OpName(producer.op), " @", producer.scope);
      auto step = [&](std::string name, int stream, std::function<absl::Status(const Stream&)> launch) {
        Step st;
        st.kind = stream == 2 ? Step::Kind::kCopy : Step::Kind::kKernel;
        st.name = absl::StrCat(name, " ", what);
        st.node = i;
        st.phase = g_.nodes()[i].phase;
        st.stream = stream;
        st.impl = stream == 2 ? "copy" : "wait";
        st.launch = std::move(launch);
        p_->schedule.steps.push_back(std::move(st));
      };
      auto copy = [&](std::string name, TensorView from, TensorView to, Event* ready, Event* done) {
        step("record " + name, 0, [ready](const Stream& s) { return ready->Record(s); });
        step(name, 2, [from, to, ready, done](const Stream& s) -> absl::Status {
          SG_RETURN_IF_ERROR(ready->Block(s));
          SG_RETURN_IF_ERROR(CopyTensorAsync(from, to, s));  // pinned: queued, capturable
          return done->Record(s);
        });
      };
      auto wait = [&](std::string name, Event* done) {
        step(name, 0, [done](const Stream& s) { return done->Block(s); });
      };
      if (i == o.producer + 1) copy("offload", dev, host, ev[0], ev[1]);
      if (i == o.wait_at + 1) wait("wait offload", ev[1]);
      if (i == o.reload_at) copy("reload", host, back, ev[2], ev[3]);
      if (i == o.bwd_first) wait("wait reload", ev[3]);
    }
  }

  absl::Status LossScalerState() {
    if (!source_of_name_.count(kLossScaleName)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss scaling needs the f32[] input \"", kLossScaleName, "\" seeding the loss's backward"));
    }
    char* base = reinterpret_cast<char*>(uintptr_t{1} << 40);  // planning only: never dereferenced
    if (allocate_) {
      SG_ASSIGN_OR_RETURN(p_->loss_scaler_state, DeviceMemory::Allocate(p_->device, 8));
      base = p_->loss_scaler_state.data();
    }
    good_steps_ = TensorView(base, DType::kF32, {}, p_->device);
    skipped_ = TensorView(base + 4, DType::kF32, {}, p_->device);
    p_->sources["loss_scale.good_steps"] = good_steps_;
    p_->outputs["loss_scale.skipped"] = skipped_;
    return absl::OkStatus();
  }

  // One multi-tensor launch for every adamw node, when all update in place and share betas/eps,
  // step, lr and gradient scale.
  absl::Status BatchAdamW() {
    std::vector<int> nodes;
    for (int i = 0; i < int(g_.nodes().size()); ++i) {
      if (g_.nodes()[i].op == OpKind::kAdamW) nodes.push_back(i);
    }
    if (nodes.empty()) return absl::OkStatus();
    const Node& first = g_.nodes()[nodes[0]];
    std::vector<kernels::AdamWParam> params;
    // bf16 copies the AdamW pass can write: nothing reads them after the optimizer starts.
    std::map<int, int> copy_of;  // parameter value -> its copy
    for (const auto& [copy, param] : fusions_.weight_copy) {
      if (last_use_[root_[copy]] < nodes[0]) copy_of[param] = copy;
    }
    std::set<int> copies;  // the cast nodes the AdamW pass replaces
    for (int i : nodes) {
      const Node& n = g_.nodes()[i];
      for (int k = 0; k < 3; ++k) {
        static constexpr int kIn[3] = {0, 2, 3};
        if (root_[n.outputs[k]] != root_[n.inputs[kIn[k]]]) return absl::OkStatus();  // not in place
      }
      for (int k = 4; k < 7; ++k) {
        if (n.inputs[k] != first.inputs[k]) return absl::OkStatus();
      }
      for (const char* a : {"beta1", "beta2", "eps"}) {
        if (graph::AttrFloat(n, a) != graph::AttrFloat(first, a)) return absl::OkStatus();
      }
      if (g_.type(n.inputs[0]).dtype != DType::kF32) return absl::OkStatus();
      kernels::AdamWParam p;
      auto copy = copy_of.find(n.inputs[0]);
      if (copy != copy_of.end()) {
        p.param_copy = p_->values[copy->second];
        copies.insert(g_.value(copy->second).producer);
      }
      p.param = p_->values[n.inputs[0]];
      p.grad = p_->values[n.inputs[1]];
      p.m = p_->values[n.inputs[2]];
      p.v = p_->values[n.inputs[3]];
      p.weight_decay = float(graph::AttrFloat(n, "weight_decay"));
      params.push_back(p);
      batch_grads_.insert(n.inputs[1]);
    }
    if (!allocate_) {  // planning only: the batched launch is never run
      copy_casts_ = std::move(copies);
      adamw_first_ = nodes[0];
      adamw_launch_ = [](const Stream&) { return absl::OkStatus(); };
      return absl::OkStatus();
    }
    auto list = kernels::AdamWTensorList::Create(params);
    if (!list.ok()) return absl::OkStatus();  // e.g. mixed devices: per-node lowering reports it
    auto shared = std::make_shared<kernels::AdamWTensorList>(*std::move(list));
    copy_casts_ = std::move(copies);
    p_->adamw_list = shared;
    SG_ASSIGN_OR_RETURN(p_->adamw_counter, DeviceMemory::Allocate(p_->device, 8));
    TensorView counter(p_->adamw_counter.data(), DType::kI64, {}, p_->device);
    kernels::AdamWConfig c;
    c.beta1 = float(graph::AttrFloat(first, "beta1"));
    c.beta2 = float(graph::AttrFloat(first, "beta2"));
    c.eps = float(graph::AttrFloat(first, "eps"));
    TensorView lr = p_->values[first.inputs[5]], scale = p_->values[first.inputs[6]];
    adamw_first_ = nodes[0];
    adamw_launch_ = [shared, c, lr, counter, scale](const Stream& s) {
      return kernels::AdamWStep(*shared, c, lr, counter, scale, s);
    };
    return absl::OkStatus();
  }

  absl::Status Steps() {
    std::map<std::string, int> missing;
    const auto& nodes = g_.nodes();
    for (int i = 0; i < int(nodes.size()); ++i) {
      const Node& n = nodes[i];
      WgradWaits(i);
      OffloadSteps(i);
      if (IsSource(n.op) || n.op == OpKind::kReshape) continue;
      if (fusions_.fused_away.count(i) || copy_casts_.count(i)) continue;
      if (n.op == OpKind::kAdamW && adamw_launch_) {
        if (i == adamw_first_) {
          Step st;
          st.name = absl::StrCat("adamw (multi-tensor, ", batch_grads_.size(), " parameters)");
          st.node = i;
          st.phase = n.phase;
          st.impl = "kernel";
          st.launch = adamw_launch_;
          p_->schedule.steps.push_back(std::move(st));
        }
        continue;
      }
      if (n.op == OpKind::kGradNorm && adamw_launch_ &&
          std::set<int>(n.inputs.begin(), n.inputs.end()) == batch_grads_ && n.inputs.size() == batch_grads_.size()) {
        auto list = std::static_pointer_cast<kernels::AdamWTensorList>(p_->adamw_list);
        if (!list) list = std::make_shared<kernels::AdamWTensorList>();  // planning only
        const float max_norm = float(graph::AttrFloat(n, "max_norm"));
        TensorView norm = p_->values[n.outputs[0]], clip = p_->values[n.outputs[1]];
        Step st;
        st.name = "grad_norm (multi-tensor)";
        st.node = i;
        st.phase = n.phase;
        st.impl = "kernel";
        st.launch = [list, max_norm, norm, clip](const Stream& s) {
          return kernels::GradNorm(*list, max_norm, norm, clip, s);
        };
        if (o_.loss_scaler) {
          // The norm of the scaled gradients, then the scaler turns it (and the clip factor AdamW
          // reads) into the unscaled values, or into the skip signal.
          kernels::LossScaleConfig c = *o_.loss_scaler;
          c.max_norm = max_norm;
          TensorView scale = p_->values[source_of_name_.at(kLossScaleName)], good = good_steps_, skipped = skipped_;
          auto step_it = source_of_name_.find(kStepName);
          TensorView step = step_it == source_of_name_.end() ? TensorView() : p_->values[step_it->second];
          st.name = "grad_norm + loss scale update (multi-tensor)";
          st.launch = [list, c, norm, clip, scale, good, skipped, step](const Stream& s) -> absl::Status {
            SG_RETURN_IF_ERROR(kernels::GradNorm(*list, 0.f, norm, clip, s));
            return kernels::UpdateLossScale(c, norm, clip, scale, good, skipped, step, s);
          };
          scaled_norm_ = true;
        }
        p_->schedule.steps.push_back(std::move(st));
        continue;
      }
      NodeViews nv;
      if (auto ce = fusions_.cross_entropy.find(i); ce != fusions_.cross_entropy.end()) {
        auto seed = fusions_.cross_entropy_device_scale.find(ce->second);
        if (seed != fusions_.cross_entropy_device_scale.end()) nv.device_seed = p_->values[seed->second];
      }
      if (fusions_.lm_head && fusions_.lm_head->cross_entropy == i) {
        p_->schedule.steps.push_back(LmHeadStep(i, nv.device_seed));
        continue;
      }
      if (wgrad_of_.count(i)) nv.sm_count = WgradSms();
      for (int v : n.inputs) nv.in.push_back(View(v, i));
      for (int v : n.outputs) nv.out.push_back(View(v, i));
      for (int s : side_.ForNode(i)) {
        nv.side.push_back(side_views_[s]);
      }
      if (auto ce = fusions_.cross_entropy.find(i); ce != fusions_.cross_entropy.end()) {
        nv.fused_out.push_back(p_->values[nodes[ce->second].outputs[0]]);
      }
      auto dh_matmul = fusions_.swiglu_backward_gemm.find(i);
      if (dh_matmul != fusions_.swiglu_backward_gemm.end()) {
        for (int v : nodes[dh_matmul->second].inputs) nv.fused_in.push_back(View(v, i));
      }
      SG_ASSIGN_OR_RETURN(LoweredOp op, LowerNode(n, nv, side_, fusions_, i, p_->device));
      if (!op.launch) {
        ++missing[graph::OpName(n.op)];
        continue;
      }
      Step st;
      st.name = dh_matmul == fusions_.swiglu_backward_gemm.end() ? StepName(n) : absl::StrCat("matmul + ", StepName(n));
      st.node = i;
      st.phase = n.phase;
      st.impl = op.impl;
      st.launch = std::move(op.launch);
      p_->schedule.steps.push_back(std::move(st));
      SplitWgrad(i);
    }
    if (o_.loss_scaler && !scaled_norm_) {
      return absl::UnimplementedError(
          "loss scaling needs the adamw nodes batched into one multi-tensor launch (each updating its parameter and "
          "moments in place, with shared betas, eps, step, lr and clip) and grad_norm over exactly their gradients");
    }
    if (!missing.empty()) {
      std::vector<std::string> parts;
      for (const auto& [op, count] : missing) parts.push_back(absl::StrCat(op, " (x", count, ")"));
      return absl::UnimplementedError(absl::StrCat("no kernel on ", p_->device.ToString(),
                                                   " yet for: ", absl::StrJoin(parts, ", ")));
    }
    for (const auto& [v, src] : writebacks_) {
      Step st;
      st.kind = Step::Kind::kCopy;
      st.name = absl::StrCat("write back ", graph::AttrString(g_.nodes()[g_.value(src).producer], "name"));
      st.phase = graph::Phase::kOptimizer;
      st.impl = "copy";
      TensorView from = p_->values[v], to = p_->values[src];
      st.launch = [from, to](const Stream& s) { return CopyTensor(from, to, s); };
      p_->schedule.steps.push_back(std::move(st));
    }
    return absl::OkStatus();
  }

  // The chunked LM head's launch at cross-entropy node i (lowering_fusion.h).
  Step LmHeadStep(int i, const TensorView& device_seed) {
    const auto& nodes = g_.nodes();
    const LoweringFusions::LmHead& h = *fusions_.lm_head;
    const Node& matmul = nodes[h.matmul];
    LmHeadViews v;
    v.x = View(matmul.inputs[0], i);
    v.w = View(matmul.inputs[1], i);
    v.targets = View(nodes[i].inputs[1], i);
    v.loss = p_->values[nodes[i].outputs[0]];
    v.block = p_->values[nodes[i].inputs[0]];
    v.dx = p_->values[nodes[h.dx].outputs[0]];
    v.dw = p_->values[nodes[h.dw].outputs[0]];
    v.device_seed = device_seed;
    for (int s : side_.ForNode(i)) v.side.push_back(side_views_[s]);
    Step st;
    st.name = absl::StrCat("lm head in ", h.chunks, " blocks @", matmul.scope);
    st.node = i;
    st.phase = nodes[i].phase;
    st.impl = "kernel";
    st.launch = LmHead(nodes[i], v, fusions_).launch;
    return st;
  }

  // Value v as node i reads or writes it: the reloaded copy of an offloaded value from its reload on.
  TensorView View(int v, int i) const {
    auto it = reloaded_.find(v);
    if (it == reloaded_.end() || i < offloads_[size_t(offload_of_.at(root_[v]))].reload_at) return p_->values[v];
    return it->second;
  }

  Program* p_;
  const Graph& g_;
  const LowerOptions o_;  // a copy: PlanStepMemory passes a temporary
  std::vector<Shape> shape_;
  std::vector<int> root_, last_use_, slot_;
  std::map<std::string, int> source_of_name_;
  std::vector<std::pair<int, int>> writebacks_;
  MemoryPlanner planner_;
  std::vector<ActivationOffload> offloads_;
  struct WgradSplit {
    int node = 0, join = 0;
    bool split = false;  // lowered by the generic path and moved to the stream (else left alone)
  };
  std::vector<WgradSplit> wgrads_;
  std::map<int, int> wgrad_of_;  // node -> index in wgrads_
  std::map<int, int> offload_of_, reload_slot_;  // root -> index in offloads_, its reload slot
  std::map<int, TensorView> reloaded_;           // value -> its view in the reload slot
  SideBuffers side_;
  std::vector<char*> side_views_;
  std::set<int> batch_grads_;
  LoweringFusions fusions_;
  std::set<int> copy_casts_;
  bool allocate_ = true;
  bool scaled_norm_ = false;
  TensorView good_steps_, skipped_;
  int adamw_first_ = -1;
  std::function<absl::Status(const Stream&)> adamw_launch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Program>> Lower(Graph graph, const graph::Binding& binding, Device device,
                                               const LowerOptions& options) {
  auto p = std::make_unique<Program>();
  p->graph = std::move(graph);
  p->binding = binding;
  p->device = device;
  Lowerer l(p.get(), options);
  l.set_allocate(!options.plan_only);
  SG_RETURN_IF_ERROR(l.Run());
  return p;
}

absl::StatusOr<PlannedMemory> PlanStepMemory(Graph graph, const graph::Binding& binding, Device device,
                                             const LowerOptions& options) {
  Program p;
  p.graph = std::move(graph);
  p.binding = binding;
  p.device = device;
  Lowerer l(&p, options);
  l.set_allocate(false);
  SG_RETURN_IF_ERROR(l.Run());
  PlannedMemory m;
  m.arena_bytes = p.plan.arena_bytes;
  m.arena_without_reuse_bytes = p.plan.sum_bytes;
  m.state_bytes = p.state_bytes;
  for (const Step& s : p.schedule.steps) {
    if (s.node >= 0) ++m.impls[s.impl];
  }
  return m;
}

}  // namespace sg::compiler
