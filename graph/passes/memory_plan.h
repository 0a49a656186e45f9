// Static memory planning: liveness over the node order, buffers assigned to offsets in one arena
// with reuse, giving the peak activation memory of a graph for a concrete shape binding.
//
//   SG_ASSIGN_OR_RETURN(MemoryPlan p, PlanMemory(g, {{"batch", 8}, {"seq", 2048}}));
//   std::cout << p.ToString();  // "arena 1.2 GiB (live lower bound 1.1 GiB), persistent 4.5 GiB"
//
// Model: parameters and inputs are persistent (counted apart, not in the arena). Every other
// value gets an arena range from its producing node to its last reader (graph outputs: to the
// end). Views alias their input's buffer instead of allocating: reshape's output, and adamw's
// outputs (updated in place over the parameter and its moments). A node's outputs never share
// memory with its inputs. Offsets are 256-byte aligned, assigned first-fit in node order.
#ifndef SGTRAIN_GRAPH_PASSES_MEMORY_PLAN_H_
#define SGTRAIN_GRAPH_PASSES_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::graph {

struct BufferAssignment {
  int value = -1;          // the value id owning the buffer (aliases point at it)
  int64_t offset = -1;     // in the arena; -1 for persistent or aliased values
  int64_t bytes = 0;
  int first_node = 0, last_node = 0;  // live range, node indices inclusive
};

struct MemoryPlan {
  int64_t arena_bytes = 0;        // planned peak: the arena's size
  int64_t live_lower_bound = 0;   // max over nodes of the bytes live at once (no fragmentation)
  int64_t persistent_bytes = 0;   // parameters + inputs
  std::vector<BufferAssignment> buffers;  // indexed by value id (unused ids have bytes == 0)
  std::string ToString() const;
};

// InvalidArgument when the binding misses a symbol or violates its constraints.
absl::StatusOr<MemoryPlan> PlanMemory(const Graph& g, const Binding& binding);

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_PASSES_MEMORY_PLAN_H_
