// Lowering: a verified training graph, bound to concrete sizes, becomes a Program: one arena whose
// offsets come from the memory plan, persistent state buffers for the graph's sources, and a
// Schedule of steps with every TensorView fixed. Executing the schedule is calling each step's
// launch on its stream in order; nothing is allocated or synchronized while it runs, so a CUDA
// stream can capture the whole schedule into a CUDA graph.
//
//   SG_ASSIGN_OR_RETURN(std::unique_ptr<Program> p, Lower(train_graph, {{"batch", 4}, {"seq", 256}}, device));
//   for (const Step& s : p->schedule.steps) SG_RETURN_IF_ERROR(s.launch(stream));
//
// Buffers:
//  - sources (parameters, optimizer state, inputs) live in the state allocation, named;
//  - every other value has a slot in the arena, live from its producer to its last reader (graph
//    outputs to the end of the step); `reshape` outputs alias their input (no step);
//  - an "update:<source>" output is written in place into the source when its producer is an
//    elementwise op (AdamW, add) and the source's last reader; otherwise a copy step at the end
//    writes it back;
//  - saved statistics a kernel needs (RMSNorm rstd, attention lse) are side slots owned by the
//    forward node's lowering and found by the backward node that reads the same values; a
//    backward without its forward (e.g. after recompute rewiring) recomputes them into scratch.
//  - all AdamW nodes (when each updates its parameter and moments in place) become one
//    multi-tensor kernels/adamw launch at the first AdamW node, and grad_norm over the same
//    gradients becomes kernels/adamw's GradNorm on the same tensor list;
//  - cross-node fusions (compiler/lowering_fusion.h): cross-entropy loss + dlogits in one launch
//    (dlogits over the logits), weight gradients written in f32 by their producers (no bf16 copy
//    and cast), bf16 weight copies kept in the state and rewritten by the AdamW pass, and outputs
//    overwriting a dead input in place (residual stream, residual gradient, adds).
#ifndef SGTRAIN_COMPILER_LOWERING_H_
#define SGTRAIN_COMPILER_LOWERING_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/memory_plan.h"
#include "graph/ir.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

struct Step {
  enum class Kind : uint8_t { kKernel, kCopy, kCollective };
  Kind kind = Kind::kKernel;
  std::string name;   // "rmsnorm @layers.0.attention_norm"
  int node = -1;      // graph node index; -1 for runtime steps (write-backs)
  graph::Phase phase = graph::Phase::kForward;
  int stream = 0;     // 0: compute, 1: communication, 2: copy (offloading), 3: weight gradients
  std::string impl;   // "kernel", "reference" (CPU interpreter fallback), "copy"
  std::function<absl::Status(const Stream&)> launch;
};

struct Schedule {
  std::vector<Step> steps;
};

// Memory from a device's allocator, returned on destruction.
class DeviceMemory {
 public:
  static absl::StatusOr<DeviceMemory> Allocate(Device device, int64_t bytes);
  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& o) noexcept { *this = std::move(o); }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  ~DeviceMemory();
  char* data() const { return static_cast<char*>(ptr_); }
  int64_t bytes() const { return bytes_; }

 private:
  Device device_;
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

struct Program {
  graph::Graph graph;
  graph::Binding binding;
  Device device;
  std::vector<TensorView> values;             // per value id; default view for undefined ids
  std::map<std::string, TensorView> sources;  // parameters, optimizer state and inputs by name
  std::map<std::string, TensorView> outputs;  // graph outputs by name
  std::vector<std::string> input_names;       // the kInput sources (fed by each Run)
  Schedule schedule;
  MemoryPlan plan;
  // Per arena buffer (plan's Add order): the value id it holds, or -1 for a kernel's side buffer.
  std::vector<int> slot_values;
  int64_t state_bytes = 0;
  DeviceMemory state;
  DeviceMemory arena;
  // The multi-tensor AdamW's completed-step counter (i64, one element), when the AdamW nodes are
  // batched into one kernels/adamw launch; kept equal to the "step" source by the runtime.
  DeviceMemory adamw_counter;
  std::shared_ptr<void> adamw_list;  // kernels::AdamWTensorList, alive as long as the schedule
  // (f32 master, bf16 copy) pairs: the copy is persistent state, written by the AdamW pass (or by
  // the cast step when the AdamW nodes are not batched); refresh it after writing the master.
  std::vector<std::pair<TensorView, TensorView>> weight_copies;
  // LowerOptions::loss_scaler: the count of good steps and the skipped flag (f32[] each), also in
  // `sources` ("loss_scale.good_steps") and `outputs` ("loss_scale.skipped").
  DeviceMemory loss_scaler_state;
  // LowerOptions::offload_activations: the host copies of the offloaded activations (pinned on a
  // CUDA device), their total bytes, and the events ordering the copies against compute.
  std::shared_ptr<void> offload_host;
  int64_t offload_host_bytes = 0;
  std::vector<std::unique_ptr<Event>> offload_events;
  // LowerOptions::wgrad_stream: per weight-gradient matmul moved to stream 3, its fork and join
  // events.
  std::vector<std::unique_ptr<Event>> wgrad_events;
  // False when a step reads a host value at launch (LowerOptions::host_scalars): the executor then
  // never captures the schedule into a CUDA graph, whose replays would keep the captured value.
  bool capturable = true;
};

// What a step needs on the device, from the memory plan, without allocating it.
struct PlannedMemory {
  int64_t arena_bytes = 0;                // activations, gradients, scratch: one arena
  int64_t arena_without_reuse_bytes = 0;  // the same buffers without lifetime-based reuse
  int64_t state_bytes = 0;                // parameters, optimizer state, inputs, weight copies
  std::map<std::string, int> impls;       // schedule steps per Step::impl ("kernel", "reference")
};

// Options for distributed runtimes that own some buffers' lifetimes (compiler/fsdp.h):
//  - transient_sources: sources (by name) that live in the arena instead of the state, from node
//    index `live_from` (e.g. where an all-gather into them is issued) to their last reader;
//  - output_live_until: graph outputs (by name) whose buffer may be reused after node index k
//    instead of living to the end of the step (e.g. a gradient once it is reduce-scattered);
//  - host_scalars: f32 scalar inputs (by name) whose current value the runtime also keeps at a host
//    address, set before each Run: a softmax_cross_entropy_backward seeded by one of them (the
//    data-parallel "loss_scale", compiler/data_parallel_graph.h) lowers onto kernels/cross_entropy
//    with grad_scale read from that address at launch. The program is then not capturable;
//  - device_scalars: the same for f32 scalar inputs the runtime writes on the device before each
//    run (e.g. copied from a per-micro-batch table by a schedule step): the kernel reads the
//    input's buffer when it runs (CrossEntropyOptions::grad_scale_from), so the program stays
//    capturable and a CUDA graph replay uses the value of that replay;
//  - loss_scaler: dynamic loss scaling (Precision::kF16Mixed; the graph's loss backward is seeded
//    by the f32[] input "loss_scale", compiler/training_graph.h's SeedLossWithScale): the seed is
//    read on the device by the fused cross-entropy, and the batched grad_norm step is followed by
//    kernels/adamw's UpdateLossScale (max_norm taken from the grad_norm node), so AdamW sees the
//    unscaled, clipped gradients and skips a non-finite step. Unimplemented unless every adamw
//    node is batched into the multi-tensor launch;
//  - plan_only: run the whole lowering but allocate nothing (as PlanStepMemory): the program's
//    plan and state_bytes are filled in, its views point nowhere and its steps must not run.
struct LowerOptions {
  std::map<std::string, int> transient_sources;
  std::map<std::string, int> output_live_until;
  std::map<std::string, const float*> host_scalars;
  std::set<std::string> device_scalars;
  // device_scalars seeding a softmax_cross_entropy_backward fuse it with its forward (off: the
  // unfused pair, for runtimes that replace those steps).
  bool fuse_device_scalars = true;
  std::optional<kernels::LossScaleConfig> loss_scaler;
  bool plan_only = false;
  // Activation offloading (compiler/offload.h): the first `offload_activations` forward values
  // (producer order) that the backward reads after a long gap (under full recompute, the
  // layer-boundary residual sums of the first layers) leave the arena between the forward's last
  // reader and a reload some nodes before the backward's first reader; copies on the copy stream.
  int offload_activations = 0;
  // Weight-gradient matmuls (backward matmuls writing a "grad:" output) on a stream of their own
  // (Step::stream 3), overlapping the data-gradient chain that continues on the compute stream:
  // each forks from compute (an event) where it was scheduled and compute waits for it at its join
  // -- the first later reader of the gradient, or the 2nd later matmul (SG_WGRAD_JOIN_MATMULS in
  // the environment: another count), or the end of the backward, whichever comes first.
  // SG_WGRAD_SMS: their GEMMs planned for that many SMs (the rest left to compute's kernels). Its inputs stay live in the arena until the join,
  // so nothing compute writes meanwhile reuses them. The same math, in the same order per value;
  // off by default (measured on H200s without gain, compile.h).
  bool wgrad_stream = false;
  // With wgrad_stream, for runtimes that read gradients in steps of their own (FSDP's
  // reduce-scatters): "grad:<param>" -> the node index before whose steps the runtime reads it;
  // the gradient's matmul is joined before the node ahead of it (or stays on compute when that
  // leaves nothing to overlap).
  std::map<std::string, int> gradient_read_at;
  // The LM head in this many blocks of tokens (lowering_fusion.h; CompileOptions::lm_head_chunks):
  // 1 off; > 1 with wgrad_stream is InvalidArgument.
  int lm_head_chunks = 1;
  // The down projection's dh matmul and the swiglu_backward reading it as one launch where the
  // kernel runs (lowering_fusion.h; Hopper, bf16, its shapes): dh is never stored.
  // SG_FUSE_SWIGLU_BWD=0 / =1 in the environment overrides it, for measuring both in one binary.
  // (CompileOptions::swiglu_backward_gemm, on by default, sets it.)
  bool swiglu_backward_gemm = false;
  // Weight gradients that only the optimizer reads stay in bf16 (lowering_fusion.h; the
  // "grad:<param>" outputs of matmul weights are then bf16). CompileOptions::bf16_gradients.
  bool bf16_gradients = false;
};

// Lowers `graph` for `device`. InvalidArgument for an unbound symbol or a binding outside the
// symbols' constraints, or an "update:<name>" output naming no source; Unimplemented listing the
// ops that have no kernel on `device` (on the CPU every op has at least the reference fallback).
absl::StatusOr<std::unique_ptr<Program>> Lower(graph::Graph graph, const graph::Binding& binding,
                                               Device device, const LowerOptions& options = {});

// Runs the whole lowering for `binding` and `device` (fusions, in-place decisions, memory plan, a
// lowering rule for every node) but allocates and launches nothing: the 1b step's plan, and whether
// every op has a kernel on a CUDA device, can be checked on a machine without that device. The
// same errors as Lower (Unimplemented listing ops without a kernel on `device`).
absl::StatusOr<PlannedMemory> PlanStepMemory(graph::Graph graph, const graph::Binding& binding, Device device,
                                             const LowerOptions& options = {});

// The arena at its busiest node, for memory accounting: what is live there, grouped by what holds
// it (producer op, scope with the layer index as "*", type), largest group first.
//
//   ArenaPeak peak = FindArenaPeak(*program);
//   std::cout << peak.ToString(12);  // "live 5.61 GiB at node 4321 (...): 32 x matmul @layers.*..."
struct ArenaPeak {
  struct Group {
    std::string what;  // "matmul @layers.*.feed_forward.w2 -> bf16[2,4096,4096]", "side buffers"
    int count = 0;
    int64_t bytes = 0;
  };
  int node = -1;           // the graph node index where the live bytes peak
  std::string node_name;   // its op and scope
  int64_t live_bytes = 0;  // the sum of the buffers live there (arena_bytes adds fragmentation)
  std::vector<Group> groups;
  // Live bytes at every node (index: graph node), and each node's op and scope, for profiles.
  std::vector<int64_t> live_by_node;
  std::vector<std::string> node_names;
  // The first `max_groups` groups, one a line, then the rest summed.
  std::string ToString(int max_groups = 16) const;
};
ArenaPeak FindArenaPeak(const Program& program);

// The device view of a program's source or output called `name`; NotFound names `owner` (e.g.
// "compiled step") and `name`.
absl::StatusOr<TensorView> FindSourceOrOutput(const Program& program, const std::string& name,
                                              absl::string_view owner);

// Copies `src` (the source's dtype and element count, any shape) into the program's source `name`
// on `stream`, and refreshes the compute-dtype copy of a master weight written so. NotFound names
// `owner` and `name`; InvalidArgument names what was expected and what was found. Does not wait.
absl::Status WriteSource(const Program& program, const std::string& name, absl::string_view owner,
                         const TensorView& src, const Stream& stream);

// Copies the program's source or output `name` into `dst` (its dtype and element count) on
// `stream`; the errors of FindSourceOrOutput and WriteSource. Does not wait.
absl::Status ReadSourceOrOutput(const Program& program, const std::string& name, absl::string_view owner,
                                const TensorView& dst, const Stream& stream);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_LOWERING_H_
