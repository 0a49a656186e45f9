// Autotuning persisted in the compile cache: a step compiled with CompileOptions::autotune on a
// CUDA device enables the process's kernel Tuner (kernels/autotune), installs the choices the
// compile cache holds for this device model, then the choices shipped with the code
// (CompileOptions::shipped_tuning, kernels/gemm/shipped_tuning.h; the cache's win, and a saved
// table includes the shipped choices it used), lets the warm-up step time whatever is new (the
// GEMMs' cuBLASLt algorithms, kernels/gemm), and stores the grown table back before the step is
// captured. A second process start on the same device model finds every choice and times nothing.
//
//   SG_ASSIGN_OR_RETURN(std::function<absl::Status()> save, StartAutotune(options));
//   ExecutorOptions eo; eo.after_warmup = save;   // the executor calls it after the first eager run
//
// One table per device model (the cache entry is keyed by the model name, e.g. "NVIDIA H200"),
// shared by every graph and binding; each choice also carries the library version it was measured
// with, so a table from another cuBLASLt version simply misses. Ranks of one job on one machine
// may store concurrently: each write is whole, the last wins, and a lost choice is timed again on
// a later start.
#ifndef SGTRAIN_COMPILER_AUTOTUNE_H_
#define SGTRAIN_COMPILER_AUTOTUNE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "compiler/compile.h"
#include "graph/cache.h"
#include "kernels/autotune/tuning_table.h"

namespace sg::compiler {

// Whether a step compiled with `o` autotunes: o.autotune, a CUDA device, and the environment
// variable SG_AUTOTUNE not "0"/"false"/"off".
bool AutotuneEnabled(const CompileOptions& o);

// The stored tuning table of one device model in a compile-cache directory.
class TuningStore {
 public:
  // `cache_dir` "" persists nothing (Load finds nothing, Save keeps nothing).
  static absl::StatusOr<TuningStore> Open(const std::string& cache_dir, std::string device_name);

  // Installs the stored choices into `tuner`; returns how many the table held. A corrupt entry is
  // reported by the cache as a warning and treated as empty.
  absl::StatusOr<size_t> Load(kernels::autotune::Tuner& tuner);
  // Stores `tuner`'s choices for this device model, merged with the stored ones, when the tuner
  // gained any since the last Load or Save.
  absl::Status Save(const kernels::autotune::Tuner& tuner);

 private:
  TuningStore(std::string dir, std::string device) : dir_(std::move(dir)), device_(std::move(device)) {}
  graph::CacheRequest Request() const;
  // The stored table, read from disk (a fresh cache object: what other processes stored counts).
  absl::StatusOr<std::shared_ptr<const graph::Artifact>> Stored() const;

  std::string dir_;
  std::string device_;
  int64_t saved_generation_ = -1;
};

// For a step compiled with `o`: nothing when !AutotuneEnabled(o); otherwise enables
// Tuner::Global(), loads the stored table for o.device's model from o.cache_dir and returns the
// function that saves it after the warm-up step (ExecutorOptions::after_warmup). Errors only for
// an unusable device or cache directory.
absl::StatusOr<std::function<absl::Status()>> StartAutotune(const CompileOptions& o);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_AUTOTUNE_H_
