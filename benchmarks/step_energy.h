// Where a compiled training step's energy goes: its schedule's steps grouped by what they do (the
// same operation at the same place in every layer), each group captured into a CUDA graph and
// replayed back to back for a window while the GPU's energy counter runs. At the H200's 700 W limit
// the step's time follows its energy (benchmarks/README.md, "Power"), so this table, not the time
// of an eager trace, says which work is worth removing.
//
//   std::vector<StepGroup> groups = GroupSteps(step.program(), &skipped);
//   SG_ASSIGN_OR_RETURN(auto rows, ProfileGroups(step.program(), groups, stream, meter, absl::Seconds(1)));
//
// A group's replays run alone, so it sees the clock its own power draw leaves it, not the one the
// whole step leaves it: a memory-bound group alone runs below the limit at a higher clock than in
// the step. The sum of the groups' joules per step is therefore compared with the step's measured
// joules in the output. The replays change the program's state (AdamW steps the weights, in-place
// accumulations grow): profile after everything that reads it, and start each group from a
// ProgramSnapshot (below) so that no group measures the NaNs an earlier one left.
#ifndef SGTRAIN_BENCHMARKS_STEP_ENERGY_H_
#define SGTRAIN_BENCHMARKS_STEP_ENERGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "benchmarks/gpu_energy.h"
#include "compiler/lowering.h"
#include "kernels/core/stream.h"

namespace sg::benchmarks {

struct StepGroup {
  // The step's name with layer indices as '#', its phase, and which occurrence of that name within
  // its layer and phase it is: "matmul @layers.#.feed_forward.w1 bwd 1" (a matmul's forward, data
  // and weight gradients share the name and differ in the occurrence).
  std::string key;
  std::vector<int> steps;  // schedule indices, in schedule order
  double flops = 0;        // 2 M N K summed over the group's matmul steps (0: none)
};

// The groups of the program's schedule, in the order of their first step. Steps off the compute
// stream (collectives, offload copies, weight-gradient streams) are not grouped: their indices go
// to *skipped (may be null).
std::vector<StepGroup> GroupSteps(const compiler::Program& program, std::vector<int>* skipped);

struct GroupEnergy {
  std::string key;
  int steps = 0;             // schedule steps in the group
  int replays = 0;           // replays in the measured window
  double window_ms = 0;      // GPU time of the measured window
  double ms_per_step = 0;    // GPU time of one replay (the group's share of one training step)
  double joules_per_step = 0;
  double mean_watts = 0;
  double sm_clock_median_mhz = 0;
  int temperature_max_c = 0;
  double tflops = 0;  // the group's matmul FLOPs / ms_per_step (0 without matmuls)
};

// The device memory a program's steps write -- its state (parameters, optimizer state, inputs),
// its arena (activations, gradients), the AdamW step counter and the loss scaler's state -- copied
// aside on the device, so that every measurement window starts from the same numbers. Replays
// without it drift: a group's repeated AdamW updates or in-place accumulations leave the next
// group non-finite inputs, and a GPU multiplying NaNs draws a fraction of the power (gpu_call104:
// the 1b's whole step at 508 W and 1965 MHz on NaNs, 681 W and 1590 MHz on the real numbers).
// Host copies of offloaded activations are not covered.
class ProgramSnapshot {
 public:
  static absl::StatusOr<ProgramSnapshot> Take(const compiler::Program& program, const Stream& stream);
  // Copies the saved bytes back, ordered on `stream`.
  absl::Status Restore(const Stream& stream) const;
  int64_t bytes() const;

 private:
  struct Region {
    char* live = nullptr;
    compiler::DeviceMemory saved;
  };
  std::vector<Region> regions_;
};

// Each group run once eagerly (its scratch cached before the capture), captured, then replayed for
// about `window` (at least 3 replays) after one untimed replay. With a `start`, it is restored
// before each group's eager run. CUDA only; the stream is the executor's compute stream (nothing
// else queued on it). Errors name the group.
absl::StatusOr<std::vector<GroupEnergy>> ProfileGroups(const compiler::Program& program,
                                                       const std::vector<StepGroup>& groups, const Stream& stream,
                                                       GpuEnergyMeter& meter, absl::Duration window,
                                                       const ProgramSnapshot* start = nullptr);

// The groups' rows summed by kind, the ledger issue #10's analysis reads: "matmul" (every group whose
// key starts with matmul, the fused matmul + SwiGLU backward among them), "attention" (forward and
// backward), "optimizer" (adamw, grad_norm, the step counter) and "other", in that order, each
// present kind once. `groups` and `rows` are parallel (ProfileGroups' input and output).
struct KindEnergy {
  std::string kind;
  int groups = 0;
  double joules_per_step = 0, ms_per_step = 0;
  double flops = 0;  // the kind's matmul FLOPs a step (0: none)
  double mean_watts() const { return ms_per_step > 0 ? joules_per_step / ms_per_step * 1e3 : 0; }
  // Joules a TFLOP of the kind's groups that have matmul FLOPs (0 without any).
  double joules_per_tflop = 0;
};
std::vector<KindEnergy> SumByKind(const std::vector<StepGroup>& groups, const std::vector<GroupEnergy>& rows);

// Every grouped step in schedule order, without the steps of `left_out` (null: all of them): the
// whole step as one group, for measuring what a group costs the whole step (its "leave one out"
// energy and time, power-limit coupling included) rather than what it costs alone.
StepGroup WholeStep(const std::vector<StepGroup>& groups, const StepGroup* left_out = nullptr);

}  // namespace sg::benchmarks

#endif  // SGTRAIN_BENCHMARKS_STEP_ENERGY_H_
