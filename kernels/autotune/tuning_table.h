// Autotuning: measure a kernel's variants (a cuBLASLt algorithm, a block size) once per problem
// and device, remember the fastest, and reuse it. A TuningTable is the serializable record of
// those choices; the Tuner is the process-wide table that kernels consult, and that the compiler
// loads from and saves to its compile cache (compiler/autotune.h) so a second process start reuses
// the choices without timing anything.
//
//   TuningKey key{"rmsnorm.block", device_name, "1", "rows=16384,cols=2048"};
//   SG_ASSIGN_OR_RETURN(Choice c, Tuner::Global().GetOrTune(key, [&]() -> absl::StatusOr<Choice> {
//     return PickFastest(3, [&](int i) { return TimeBlockSize(kBlocks[i]); },
//                        [&](int i) { return std::to_string(kBlocks[i]); });
//   }));
//   const int block = std::stoi(c.variant);
//
// A choice is valid only for the exact (kernel, device name, library version, problem) it was
// measured on: a table read on another GPU model or under another library version simply misses,
// and the kernel tunes again. Variants are opaque bytes (e.g. the 64 bytes of a
// cublasLtMatmulAlgo_t); the text form stores them as hex.
#ifndef SGTRAIN_KERNELS_AUTOTUNE_TUNING_TABLE_H_
#define SGTRAIN_KERNELS_AUTOTUNE_TUNING_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace sg::kernels::autotune {

// What a choice was measured for. `problem` is the kernel's own canonical text of everything the
// choice depends on (shapes, dtypes, transposes, strides, alignment, epilogue).
struct TuningKey {
  std::string kernel;   // "gemm.cublaslt", "rmsnorm.block"
  std::string device;   // the device's model name, e.g. "NVIDIA H200"
  std::string library;  // the version of the library whose variants these are, e.g. "cublasLt 130000"
  std::string problem;

  auto Tie() const { return std::tie(kernel, device, library, problem); }
  friend bool operator<(const TuningKey& a, const TuningKey& b) { return a.Tie() < b.Tie(); }
  friend bool operator==(const TuningKey& a, const TuningKey& b) { return a.Tie() == b.Tie(); }
};

// The winning variant and how it was chosen.
struct Choice {
  Choice(std::string variant = "", double microseconds = 0, int candidates = 0, std::string cost_unit = "",
         double cost = 0, double fastest_cost = 0)
      : variant(std::move(variant)), microseconds(microseconds), candidates(candidates),
        cost_unit(std::move(cost_unit)), cost(cost), fastest_cost(fastest_cost) {}
  std::string variant;     // opaque bytes the kernel understands
  double microseconds = 0; // the winner's measured time per call
  int candidates = 0;      // how many variants were timed successfully
  // Set when a CostMeter re-ranked the fastest candidates (PickCheapest): the meter's unit (e.g.
  // "J"), the winner's cost per call and the cost of the fastest candidate by time, for comparison.
  // Empty unit and zeros when the time alone decided.
  std::string cost_unit;
  double cost = 0;
  double fastest_cost = 0;
  friend bool operator==(const Choice& a, const Choice& b) {
    return a.variant == b.variant && a.microseconds == b.microseconds && a.candidates == b.candidates &&
           a.cost_unit == b.cost_unit && a.cost == b.cost && a.fastest_cost == b.fastest_cost;
  }
};

class TuningTable {
 public:
  std::optional<Choice> Find(const TuningKey& key) const;
  void Put(const TuningKey& key, Choice choice);
  // Adds `other`'s entries, keeping this table's where both have one.
  void Merge(const TuningTable& other);
  size_t size() const { return entries_.size(); }
  const std::map<TuningKey, Choice>& entries() const { return entries_; }

  // JSON text: {"format": "sg-tuning-1", "entries": [{kernel, device, library, problem, variant
  // (hex), us, candidates, and cost_unit, cost, fastest_cost when a meter ranked them}, ...]},
  // entries in key order (equal tables give equal text).
  std::string Serialize() const;
  // InvalidArgument naming what is wrong (not JSON, wrong format tag, a field missing or of the
  // wrong type, a variant that is not hex).
  static absl::StatusOr<TuningTable> Parse(absl::string_view text);

 private:
  std::map<TuningKey, Choice> entries_;
};

// Times `n` candidates with `measure(i)` (microseconds per call; an error skips that candidate:
// e.g. a cuBLASLt algorithm that fails on this problem) and returns the fastest, its variant bytes
// from `variant(i)`. Ties go to the lower index (the heuristic's own order). NotFound when every
// candidate failed, with the first error; InvalidArgument when n < 1.
absl::StatusOr<Choice> PickFastest(int n, const std::function<absl::StatusOr<double>(int)>& measure,
                                   const std::function<std::string(int)>& variant);

// A second ranking of a kernel's candidates, by what a call costs besides its few-call time: e.g.
// the joules a call takes over a window at the GPU's power limit (benchmarks/gpu_energy.h,
// EnergyCostMeter), where a training step's speed follows its energy rather than each kernel's time
// at boost clocks. Installed for the process with Tuner::set_meter; kernels that support it
// (kernels/gemm's cuBLASLt algorithms) re-rank their fastest candidates with PickCheapest.
class CostMeter {
 public:
  virtual ~CostMeter() = default;
  // What a cost counts, e.g. "J"; stored with the choice.
  virtual std::string unit() const = 0;
  // The cost of one call of a candidate. `run(calls)` issues `calls` back-to-back calls, waits for
  // them and returns the milliseconds they took on the device; `us_per_call` is the candidate's
  // measured time, to size the windows. An error drops the candidate.
  virtual absl::StatusOr<double> CostPerCall(const std::function<absl::StatusOr<double>(int64_t calls)>& run,
                                             double us_per_call) = 0;
};

// Which candidates a CostMeter re-ranks: only problems whose fastest call takes at least min_us
// (a short kernel's cost is not worth a window), and of those the candidates within `within` times
// the fastest time, at most max_candidates of them, fastest first. A kernel with configurable
// candidates may also time up to `variants` configurations its own list leaves out (the cuBLASLt
// GEMM: its first algorithms with other cluster shapes, tiles and custom options), so that the
// meter sees more than the library's heuristic offers; 0: the list alone.
struct RerankPolicy {
  double min_us = 40;
  double within = 1.3;
  int max_candidates = 8;
  int variants = 0;
};

// PickFastest, then, when `meter` is non-null and the policy admits the problem, the cheapest of
// the admitted candidates by meter->CostPerCall(run(i, calls), us) (ties go to the faster). The
// choice carries the meter's unit, the winner's cost and the fastest's. NotFound as PickFastest;
// when the meter fails on every admitted candidate, its first error.
absl::StatusOr<Choice> PickCheapest(int n, const std::function<absl::StatusOr<double>(int)>& measure,
                                    const std::function<std::string(int)>& variant,
                                    const std::function<absl::StatusOr<double>(int i, int64_t calls)>& run,
                                    CostMeter* meter, const RerankPolicy& policy = {});

// The process-wide table kernels consult. Thread-safe.
class Tuner {
 public:
  using TuneFn = std::function<absl::StatusOr<Choice>()>;
  Tuner() = default;
  static Tuner& Global();

  // The recorded choice for `key`, else runs `tune` (outside the lock; concurrent callers for one
  // key may both tune, the first result is kept) and records its result. `tune`'s error is
  // returned and nothing is recorded.
  absl::StatusOr<Choice> GetOrTune(const TuningKey& key, const TuneFn& tune);
  std::optional<Choice> Find(const TuningKey& key) const;

  // Whether kernels should tune problems they have no choice for (they always use recorded
  // choices). Off until a caller turns it on: the compiler does for a step compiled with
  // CompileOptions::autotune, and it stays on for the process.
  bool enabled() const;
  void set_enabled(bool on);

  // The meter that kernels re-rank their fastest candidates with (null: time alone decides, the
  // default). Applies to problems tuned after it is set; recorded choices stay.
  void set_meter(std::shared_ptr<CostMeter> meter, RerankPolicy policy = {});
  std::shared_ptr<CostMeter> meter() const;
  RerankPolicy rerank_policy() const;

  // Adds a table's choices (e.g. read from the compile cache); recorded choices win.
  void Install(const TuningTable& table);
  TuningTable Snapshot() const;
  // Choices measured by this Tuner (not installed): 0 after a start that found every choice.
  int64_t tunings() const;
  // Bumped on every new choice, so a saver can tell whether anything changed since it last saved.
  int64_t generation() const;
  void Clear();

 private:
  mutable absl::Mutex mu_;
  TuningTable table_ ABSL_GUARDED_BY(mu_);
  bool enabled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t tunings_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<CostMeter> meter_ ABSL_GUARDED_BY(mu_);
  RerankPolicy policy_ ABSL_GUARDED_BY(mu_);
};

// False when the environment variable SG_AUTOTUNE is "0", "false" or "off": the switch that turns
// autotuning off for a run without recompiling (the compiler checks it next to its option).
bool AutotuneAllowedByEnv();

}  // namespace sg::kernels::autotune

#endif  // SGTRAIN_KERNELS_AUTOTUNE_TUNING_TABLE_H_
