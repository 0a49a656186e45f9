#include "compiler/offload.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "compiler/memory_plan.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::compiler {
namespace {

// Nodes a copy of `bytes` is modeled to take at `per_node` bytes a node (at least one).
int64_t CopyNodes(int64_t bytes, int64_t per_node) { return std::max<int64_t>(1, (bytes + per_node - 1) / per_node); }

}  // namespace

std::vector<ActivationOffload> ChooseOffloads(const graph::Graph& g, const std::vector<int>& root,
                                              const std::function<int64_t(int)>& bytes,
                                              const std::function<bool(int)>& offloadable, int count, int lead) {
  std::vector<ActivationOffload> chosen;
  if (count <= 0) return chosen;
  const auto& nodes = g.nodes();
  const int nv = g.num_value_ids();
  std::vector<int> fwd_last(nv, -1), bwd_first(nv, INT_MAX), bad(nv, 0), written(nv, -1);
  for (int i = 0; i < int(nodes.size()); ++i) {
    const graph::Node& n = nodes[i];
    const bool fwd = n.phase == graph::Phase::kForward;
    for (int v : n.inputs) {
      const int r = root[size_t(v)];
      if (fwd) {
        fwd_last[r] = std::max(fwd_last[r], i);
        if (bwd_first[r] != INT_MAX) bad[r] = 1;  // a forward reader after a backward one
      } else {
        bwd_first[r] = std::min(bwd_first[r], i);
      }
    }
    for (int v : n.outputs) {
      const int r = root[size_t(v)];
      if (r == v) continue;  // its own buffer
      if (fwd) {
        written[r] = std::max(written[r], i);  // written in place (e.g. the residual add over its input)
      } else {
        bwd_first[r] = std::min(bwd_first[r], i);
      }
    }
  }
  // Candidates in producer order; only the large ones (at least a quarter of the largest) are
  // worth a copy and its events.
  std::vector<std::pair<int, int>> candidates;  // (last forward writer, value)
  int64_t largest = 0;
  for (int i = 0; i < int(nodes.size()); ++i) {
    if (nodes[i].phase != graph::Phase::kForward) continue;
    for (int v : nodes[i].outputs) {
      if (root[size_t(v)] != v || bad[v] || !offloadable(v) || fwd_last[v] < 0 || bwd_first[v] == INT_MAX) continue;
      if (bwd_first[v] - fwd_last[v] < 2 * lead + 2) continue;
      candidates.push_back({std::max(i, written[v]), v});
      largest = std::max(largest, bytes(v));
    }
  }
  for (const auto& [producer, v] : candidates) {
    if (int(chosen.size()) == count) break;
    if (4 * bytes(v) < largest) continue;
    ActivationOffload o;
    o.root = v;
    o.producer = producer;
    o.fwd_last = fwd_last[v];
    o.bwd_first = bwd_first[v];
    o.bytes = bytes(v);
    o.host_offset = chosen.empty() ? 0 : chosen.back().host_offset + AlignUp(chosen.back().bytes);
    chosen.push_back(o);
  }
  // The copy stream is one queue: a copy starts once the one issued before it is done. Compute
  // waits for a copy to the host `lead` nodes after its producer, or later when the queue ahead of
  // it (at kOffloadForwardBytesPerNode) is not through by then.
  int64_t queue_done = 0;  // the node by which the copies issued so far are modeled done
  for (ActivationOffload& o : chosen) {
    queue_done = std::max<int64_t>(o.producer + 1, queue_done) + CopyNodes(o.bytes, kOffloadForwardBytesPerNode);
    o.wait_at = int(std::max<int64_t>(o.fwd_last, std::min<int64_t>(std::max<int64_t>(o.producer + lead, queue_done),
                                                                     o.bwd_first - lead - 2)));
  }
  // The copies back, planned from the last backward reader to the first: each is issued `lead`
  // nodes before its reader, or earlier so that it and the copies after it in the queue (at
  // kOffloadBackwardBytesPerNode) are through before their readers; never before its forward slot
  // is released.
  std::vector<ActivationOffload*> by_reader;
  for (ActivationOffload& o : chosen) by_reader.push_back(&o);
  std::stable_sort(by_reader.begin(), by_reader.end(),
                   [](const ActivationOffload* a, const ActivationOffload* b) { return a->bwd_first > b->bwd_first; });
  int64_t next_start = INT_MAX;  // where the copy back after this one in the queue is issued
  for (ActivationOffload* o : by_reader) {
    const int64_t nodes = CopyNodes(o->bytes, kOffloadBackwardBytesPerNode);
    const int64_t start = std::min<int64_t>(o->bwd_first - std::max<int64_t>(lead, nodes), next_start - nodes);
    o->reload_at = int(std::max<int64_t>(start, o->wait_at + 1));
    next_start = o->reload_at;
  }
  return chosen;
}

absl::StatusOr<std::shared_ptr<void>> AllocateOffloadHost(Device device, int64_t bytes) {
  const size_t n = size_t(std::max<int64_t>(bytes, 1));
#ifdef SG_WITH_CUDA
  if (device.is_cuda()) {
    void* p = nullptr;
    SG_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, n, cudaHostAllocDefault));
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }
#endif
  if (!device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat("activation offloading: no host memory for ", device.ToString()));
  }
  void* p = std::aligned_alloc(kArenaAlignment, AlignUp(int64_t(n)));
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("activation offloading: ", n, " host bytes"));
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace sg::compiler
