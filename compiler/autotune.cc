#include "compiler/autotune.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "kernels/core/sha256.h"
#include "kernels/gemm/shipped_tuning.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sg::compiler {

namespace at = kernels::autotune;

bool AutotuneEnabled(const CompileOptions& o) {
  return o.autotune && o.device.is_cuda() && at::AutotuneAllowedByEnv();
}

absl::StatusOr<TuningStore> TuningStore::Open(const std::string& cache_dir, std::string device_name) {
  graph::CompileCache::Options co;
  co.dir = cache_dir;
  SG_RETURN_IF_ERROR(graph::CompileCache::Open(co).status());  // creates and checks the directory
  return TuningStore(cache_dir, std::move(device_name));
}

absl::StatusOr<std::shared_ptr<const graph::Artifact>> TuningStore::Stored() const {
  if (dir_.empty()) return std::shared_ptr<const graph::Artifact>();
  graph::CompileCache::Options co;
  co.dir = dir_;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<graph::CompileCache> cache, graph::CompileCache::Open(co));
  return cache->Lookup(Request(), {});
}

// One entry per device model: no graph, no symbols; the model name is the entry's device.
graph::CacheRequest TuningStore::Request() const {
  graph::CacheRequest r;
  r.graph_fingerprint = Sha256Hex("sg autotuning table");
  r.device = device_;
  r.arch = "any";
  r.options["artifact"] = "tuning-table";
  r.compiler_version = "sg-tuning-1";
  return r;
}

absl::StatusOr<size_t> TuningStore::Load(at::Tuner& tuner) {
  SG_ASSIGN_OR_RETURN(std::shared_ptr<const graph::Artifact> a, Stored());
  saved_generation_ = tuner.generation();
  if (a == nullptr) return size_t(0);
  absl::StatusOr<at::TuningTable> table = at::TuningTable::Parse(a->plan_blob);
  if (!table.ok()) {
    std::cerr << "warning: autotune: ignoring the stored table for '" << device_ << "': " << table.status() << "\n";
    return size_t(0);
  }
  tuner.Install(*table);
  saved_generation_ = tuner.generation();
  return table->size();
}

absl::Status TuningStore::Save(const at::Tuner& tuner) {
  if (tuner.generation() == saved_generation_) return absl::OkStatus();
  at::TuningTable mine;
  const at::TuningTable all = tuner.Snapshot();
  for (const auto& [k, c] : all.entries()) {
    if (k.device == device_) mine.Put(k, c);
  }
  // Another process may have stored choices since this one loaded: keep them too.
  SG_ASSIGN_OR_RETURN(std::shared_ptr<const graph::Artifact> stored, Stored());
  if (stored != nullptr) {
    if (absl::StatusOr<at::TuningTable> t = at::TuningTable::Parse(stored->plan_blob); t.ok()) mine.Merge(*t);
  }
  saved_generation_ = tuner.generation();
  if (dir_.empty()) return absl::OkStatus();
  graph::CompileCache::Options co;
  co.dir = dir_;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<graph::CompileCache> cache, graph::CompileCache::Open(co));
  return cache->Store(Request(), {}, graph::Artifact{"", mine.Serialize()});
}

namespace {

absl::StatusOr<std::string> DeviceModel(Device d) {
#ifdef SG_WITH_CUDA
  cudaDeviceProp prop;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d.ordinal));
  return std::string(prop.name);
#else
  return absl::FailedPreconditionError(absl::StrCat("autotune: ", d.ToString(), " in a build without CUDA"));
#endif
}

}  // namespace

absl::StatusOr<std::function<absl::Status()>> StartAutotune(const CompileOptions& o) {
  if (!AutotuneEnabled(o)) return std::function<absl::Status()>();
  SG_ASSIGN_OR_RETURN(std::string model, DeviceModel(o.device));
  SG_ASSIGN_OR_RETURN(TuningStore store, TuningStore::Open(o.cache_dir, model));
  at::Tuner& tuner = at::Tuner::Global();
  tuner.set_enabled(true);
  SG_RETURN_IF_ERROR(store.Load(tuner).status());
  if (o.shipped_tuning) {
    SG_ASSIGN_OR_RETURN(at::TuningTable shipped, kernels::ShippedGemmTuning());
    tuner.Install(shipped);
  }
  auto shared = std::make_shared<TuningStore>(std::move(store));
  return std::function<absl::Status()>([shared, &tuner]() { return shared->Save(tuner); });
}

}  // namespace sg::compiler
