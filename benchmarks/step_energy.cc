#include "benchmarks/step_energy.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "kernels/core/allocator.h"
#include "kernels/core/cuda_graph.h"
#include "kernels/core/status.h"
#include "sharding/cost_model.h"

namespace sg::benchmarks {
namespace {

// "matmul @layers.12.attention.wq" -> "matmul @layers.#.attention.wq".
std::string WithoutLayer(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    if (name.compare(i, 7, "layers.") == 0) {
      out += "layers.#";
      i += 7;
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    } else {
      out += name[i++];
    }
  }
  return out;
}

// The matmul FLOPs of a step's node as the sharding cost model counts them (0 for other nodes;
// the lowered program's binding covers every symbol).
double MatmulFlops(const compiler::Program& p, int node) {
  if (node < 0 || node >= int(p.graph.nodes().size())) return 0;
  const graph::Node& n = p.graph.nodes()[node];
  if (n.op != graph::OpKind::kMatmul) return 0;
  const absl::StatusOr<double> f = sharding::NodeFlops(p.graph, n, p.binding);
  return f.ok() ? *f : 0;
}

}  // namespace

std::vector<StepGroup> GroupSteps(const compiler::Program& program, std::vector<int>* skipped) {
  const std::vector<compiler::Step>& steps = program.schedule.steps;
  std::vector<StepGroup> groups;
  absl::flat_hash_map<std::string, int> group_of;  // key -> index in groups
  absl::flat_hash_map<std::string, int> seen;      // exact name and phase -> occurrences so far
  for (int i = 0; i < int(steps.size()); ++i) {
    const compiler::Step& s = steps[i];
    if (s.stream != 0 || s.kind == compiler::Step::Kind::kCollective) {
      if (skipped != nullptr) skipped->push_back(i);
      continue;
    }
    const std::string phase(graph::PhaseName(s.phase));
    const int occurrence = seen[absl::StrCat(s.name, " ", phase)]++;
    const std::string key = absl::StrCat(WithoutLayer(s.name), " ", phase, " ", occurrence);
    auto [it, inserted] = group_of.try_emplace(key, int(groups.size()));
    if (inserted) groups.push_back(StepGroup{key, {}, 0});
    StepGroup& g = groups[it->second];
    g.steps.push_back(i);
    g.flops += MatmulFlops(program, s.node);
  }
  return groups;
}

StepGroup WholeStep(const std::vector<StepGroup>& groups, const StepGroup* left_out) {
  StepGroup all{left_out == nullptr ? std::string("whole step") : absl::StrCat("whole step without ", left_out->key),
                {}, 0};
  for (const StepGroup& g : groups) {
    if (left_out != nullptr && g.key == left_out->key) continue;
    all.steps.insert(all.steps.end(), g.steps.begin(), g.steps.end());
    all.flops += g.flops;
  }
  std::sort(all.steps.begin(), all.steps.end());
  return all;
}

std::vector<KindEnergy> SumByKind(const std::vector<StepGroup>& groups, const std::vector<GroupEnergy>& rows) {
  static constexpr const char* kKinds[] = {"matmul", "attention", "optimizer", "other"};
  auto kind_of = [](const std::string& key) {
    if (absl::StartsWith(key, "matmul")) return 0;
    if (absl::StartsWith(key, "attention")) return 1;
    if (absl::StartsWith(key, "adamw") || absl::StartsWith(key, "grad_norm") ||
        absl::StartsWith(key, "advance step counter")) {
      return 2;
    }
    return 3;
  };
  KindEnergy sums[4];
  double flop_joules[4] = {0, 0, 0, 0};  // joules of the groups with FLOPs
  for (size_t i = 0; i < groups.size() && i < rows.size(); ++i) {
    const int k = kind_of(groups[i].key);
    KindEnergy& e = sums[k];
    ++e.groups;
    e.joules_per_step += rows[i].joules_per_step;
    e.ms_per_step += rows[i].ms_per_step;
    e.flops += groups[i].flops;
    if (groups[i].flops > 0) flop_joules[k] += rows[i].joules_per_step;
  }
  std::vector<KindEnergy> out;
  for (int k = 0; k < 4; ++k) {
    if (sums[k].groups == 0) continue;
    sums[k].kind = kKinds[k];
    sums[k].joules_per_tflop = sums[k].flops > 0 ? flop_joules[k] / (sums[k].flops / 1e12) : 0;
    out.push_back(sums[k]);
  }
  return out;
}

absl::StatusOr<ProgramSnapshot> ProgramSnapshot::Take(const compiler::Program& program, const Stream& stream) {
  if (!program.device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a program snapshot copies device memory: expected a CUDA program, found ", program.device.ToString()));
  }
  ProgramSnapshot snap;
  for (const compiler::DeviceMemory* m :
       {&program.state, &program.arena, &program.adamw_counter, &program.loss_scaler_state}) {
    if (m->bytes() == 0) continue;
    Region r;
    r.live = m->data();
    SG_ASSIGN_OR_RETURN(r.saved, compiler::DeviceMemory::Allocate(program.device, m->bytes()));
    SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.saved.data(), r.live, size_t(m->bytes()), cudaMemcpyDeviceToDevice,
                                            static_cast<cudaStream_t>(stream.native())));
    snap.regions_.push_back(std::move(r));
  }
  SG_RETURN_IF_ERROR(stream.Synchronize());
  return snap;
}

absl::Status ProgramSnapshot::Restore(const Stream& stream) const {
  for (const Region& r : regions_) {
    SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.live, r.saved.data(), size_t(r.saved.bytes()), cudaMemcpyDeviceToDevice,
                                            static_cast<cudaStream_t>(stream.native())));
  }
  return absl::OkStatus();
}

int64_t ProgramSnapshot::bytes() const {
  int64_t b = 0;
  for (const Region& r : regions_) b += r.saved.bytes();
  return b;
}

absl::StatusOr<std::vector<GroupEnergy>> ProfileGroups(const compiler::Program& program,
                                                       const std::vector<StepGroup>& groups, const Stream& stream,
                                                       GpuEnergyMeter& meter, absl::Duration window,
                                                       const ProgramSnapshot* start) {
  if (!program.device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the energy profile replays CUDA graphs: expected a CUDA program, found ", program.device.ToString()));
  }
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(program.device));
  const double window_ms = absl::ToDoubleMilliseconds(window);
  std::vector<GroupEnergy> rows;
  for (const StepGroup& g : groups) {
    auto in_group = [&](absl::Status st) {
      return st.ok() ? st : absl::Status(st.code(), absl::StrCat("energy profile, group '", g.key, "': ", st.message()));
    };
    auto launch_group = [&]() -> absl::Status {
      for (int i : g.steps) SG_RETURN_IF_ERROR(program.schedule.steps[i].launch(stream));
      return absl::OkStatus();
    };
    if (start != nullptr) SG_RETURN_IF_ERROR(in_group(start->Restore(stream)));
    // One eager run first: the scratch a step takes from the caching allocator is cached before
    // the capture, which cannot allocate (the step's own graph holds the blocks of its capture).
    SG_RETURN_IF_ERROR(in_group(launch_group()));
    SG_RETURN_IF_ERROR(in_group(stream.Synchronize()));
    alloc->BeginHoldingFrees();
    absl::StatusOr<CudaGraph> graph = CudaGraph::Capture(stream, launch_group);
    const std::vector<void*> held = alloc->EndHoldingFrees();
    absl::Status st = [&]() -> absl::Status {
      SG_RETURN_IF_ERROR(graph.status());
      SG_ASSIGN_OR_RETURN(Event a, Event::Create(program.device, /*timing=*/true));
      SG_ASSIGN_OR_RETURN(Event b, Event::Create(program.device, /*timing=*/true));
      // One untimed replay, then batches of back-to-back replays (doubling) until one lasts a
      // quarter of the window: a single replay's time includes its launch latency, which back-to-
      // back replays hide, so it would undersize the window of a short group.
      SG_RETURN_IF_ERROR(graph->Launch(stream));
      auto timed_batch = [&](int n) -> absl::StatusOr<double> {
        SG_RETURN_IF_ERROR(a.Record(stream));
        for (int r = 0; r < n; ++r) SG_RETURN_IF_ERROR(graph->Launch(stream));
        SG_RETURN_IF_ERROR(b.Record(stream));
        SG_RETURN_IF_ERROR(stream.Synchronize());
        SG_ASSIGN_OR_RETURN(float ms, b.ElapsedMsSince(a));
        return double(ms);
      };
      int batch = 1;
      SG_ASSIGN_OR_RETURN(double batch_ms, timed_batch(batch));
      while (batch_ms < window_ms / 4 && batch < (1 << 22)) {
        batch *= 2;
        SG_ASSIGN_OR_RETURN(batch_ms, timed_batch(batch));
      }
      int replays = std::max(3, int(std::ceil(window_ms * batch / std::max(1e-3, batch_ms))));
      // A launch-bound group can replay faster in the window than in the sizing batches (seen
      // 2026-12-04 on the tiny step's first group: 105.8 ms for a 250 ms window, the host's launch
      // rate still rising). Then the window is measured again with the replays scaled to it, once.
      GpuEnergyReading e;
      float total_ms = 0;
      for (int attempt = 0; attempt < 2; ++attempt) {
        SG_RETURN_IF_ERROR(meter.Start());
        SG_RETURN_IF_ERROR(a.Record(stream));
        for (int r = 0; r < replays; ++r) SG_RETURN_IF_ERROR(graph->Launch(stream));
        SG_RETURN_IF_ERROR(b.Record(stream));
        SG_RETURN_IF_ERROR(stream.Synchronize());
        SG_ASSIGN_OR_RETURN(e, meter.Stop());
        SG_ASSIGN_OR_RETURN(total_ms, b.ElapsedMsSince(a));
        if (total_ms >= window_ms / 2 || replays >= (1 << 24)) break;
        replays = std::min(1 << 24, int(std::ceil(replays * window_ms / std::max(1e-3, double(total_ms)))));
      }
      GroupEnergy row;
      row.key = g.key;
      row.steps = int(g.steps.size());
      row.replays = replays;
      row.window_ms = total_ms;
      row.ms_per_step = total_ms / replays;
      row.joules_per_step = e.joules / replays;
      row.mean_watts = e.mean_watts;
      row.sm_clock_median_mhz = e.sm_clock_median_mhz;
      row.temperature_max_c = e.temperature_max_c;
      row.tflops = g.flops > 0 ? g.flops / (row.ms_per_step * 1e-3) / 1e12 : 0;
      rows.push_back(std::move(row));
      return absl::OkStatus();
    }();
    if (graph.ok()) *graph = CudaGraph();  // destroyed before its held scratch is given back
    alloc->ReleaseHeld(held);
    SG_RETURN_IF_ERROR(in_group(st));
  }
  return rows;
}

}  // namespace sg::benchmarks
