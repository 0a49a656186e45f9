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
#include <optional>
#include <string>
#include <tuple>

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
  std::string variant;     // opaque bytes the kernel understands
  double microseconds = 0; // the winner's measured time per call
  int candidates = 0;      // how many variants were timed successfully
  friend bool operator==(const Choice& a, const Choice& b) {
    return a.variant == b.variant && a.microseconds == b.microseconds && a.candidates == b.candidates;
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
  // (hex), us, candidates}, ...]}, entries in key order (equal tables give equal text).
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
};

// False when the environment variable SG_AUTOTUNE is "0", "false" or "off": the switch that turns
// autotuning off for a run without recompiling (the compiler checks it next to its option).
bool AutotuneAllowedByEnv();

}  // namespace sg::kernels::autotune

#endif  // SGTRAIN_KERNELS_AUTOTUNE_TUNING_TABLE_H_
