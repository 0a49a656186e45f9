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
//    gradients becomes kernels/adamw's GradNorm on the same tensor list.
#ifndef SGTRAIN_COMPILER_LOWERING_H_
#define SGTRAIN_COMPILER_LOWERING_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/memory_plan.h"
#include "graph/ir.h"
#include "kernels/core/stream.h"
#include "kernels/core/tensor.h"

namespace sg::compiler {

struct Step {
  enum class Kind : uint8_t { kKernel, kCopy, kCollective };
  Kind kind = Kind::kKernel;
  std::string name;   // "rmsnorm @layers.0.attention_norm"
  int node = -1;      // graph node index; -1 for runtime steps (write-backs)
  graph::Phase phase = graph::Phase::kForward;
  int stream = 0;     // 0: compute stream, 1: communication stream
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
  int64_t state_bytes = 0;
  DeviceMemory state;
  DeviceMemory arena;
  // The multi-tensor AdamW's completed-step counter (i64, one element), when the AdamW nodes are
  // batched into one kernels/adamw launch; kept equal to the "step" source by the runtime.
  DeviceMemory adamw_counter;
  std::shared_ptr<void> adamw_list;  // kernels::AdamWTensorList, alive as long as the schedule
};

// Lowers `graph` for `device`. InvalidArgument for an unbound symbol or a binding outside the
// symbols' constraints, or an "update:<name>" output naming no source; Unimplemented listing the
// ops that have no kernel on `device` (on the CPU every op has at least the reference fallback).
absl::StatusOr<std::unique_ptr<Program>> Lower(graph::Graph graph, const graph::Binding& binding,
                                               Device device);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_LOWERING_H_
