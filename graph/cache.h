// The compile cache: compiled artifacts (optimized graph text + an opaque plan blob) keyed by a
// stable SHA-256 of everything that determines them, kept in memory and in an on-disk directory
// shared by processes.
//
//   SG_ASSIGN_OR_RETURN(auto cache, CompileCache::Open({.dir = "/tmp/sg-cache"}));
//   CacheRequest req = CacheRequest::For(graph);          // fingerprint + symbols, hashed once
//   req.policy["seq"] = DimPolicy::Bucketed(128);        // batch stays symbolic
//   req.target = {"cuda", "sm_90a"}; req.options = {{"recompute", "selective"}};
//   SG_ASSIGN_OR_RETURN(auto art, cache->GetOrCompile(req, {{"batch", 8}, {"seq", 1000}},
//       [&](const Specialization& s) -> absl::StatusOr<Artifact> { return MyCompile(graph, s); }));
//
// Key = SHA-256 over (graph fingerprint = SHA-256 of the canonical text, the specialization, the
// target device and arch, the compile options, the compiler version). The specialization says per
// symbol whether the artifact is concrete (`batch=8`), bucketed (`seq<=1024`: serves any value up
// to the bucket; the caller pads), or symbolic (`seq:sym`: serves every value the symbol's
// constraints allow). Guards (Specialization::Admits) decide whether an artifact applies to a
// binding; bindings violating the graph's symbol constraints are an error, not a miss.
//
// Disk: one file per key, `<dir>/<key>.sgc`, written to a temporary file and renamed into place
// (readers never see half an entry; concurrent writers of one key both write complete, identical
// files and the last rename wins). Each entry carries its key, guard and a SHA-256 of its payload;
// a corrupted, truncated or foreign file is reported as a warning, deleted and rebuilt. When the
// directory grows past max_disk_bytes the least recently used entries (mtime, refreshed on hit)
// are deleted. Safe for threads of one process and for several processes on one directory.
#ifndef SGTRAIN_GRAPH_CACHE_H_
#define SGTRAIN_GRAPH_CACHE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "graph/ir.h"

namespace sg::graph {

// The version of the graph layer's compile pipeline; bump it when passes change their output.
inline constexpr const char* kGraphCompilerVersion = "sg-graph-1";

// What is cached. `graph_text` is typically ToText(optimized graph); `plan_blob` is whatever the
// compiler layer needs to run it (schedule, buffer offsets, kernel choices), opaque here.
struct Artifact {
  std::string graph_text;
  std::string plan_blob;
};

struct DimPolicy {
  enum class Kind : uint8_t { kSymbolic, kConcrete, kBucketed };
  Kind kind = Kind::kSymbolic;
  int64_t min_bucket = 1;  // kBucketed: buckets are powers of two >= min_bucket (and <= max)
  static DimPolicy Symbolic() { return {}; }
  static DimPolicy Concrete() { return {Kind::kConcrete, 1}; }
  static DimPolicy Bucketed(int64_t min_bucket = 1) { return {Kind::kBucketed, min_bucket}; }
};

// How one artifact treats each symbol; the guard that decides whether it serves a binding.
class Specialization {
 public:
  struct Entry {
    SymbolInfo symbol;
    DimPolicy::Kind kind;
    int64_t value;  // concrete: the value; bucketed: the bucket's upper bound; symbolic: max
  };
  // Specializes `symbols` for `binding` under `policy` (symbols not in policy are symbolic).
  // InvalidArgument if a symbol is unbound or the binding violates its constraints.
  static absl::StatusOr<Specialization> Make(const std::vector<SymbolInfo>& symbols,
                                             const std::map<std::string, DimPolicy>& policy,
                                             const Binding& binding);
  // OK when this artifact serves `binding`; else FailedPrecondition saying which guard failed
  // ("seq=600 outside bucket seq<=512").
  absl::Status Admits(const Binding& binding) const;
  // Sizes to plan buffers for: concrete values, bucket bounds, symbols' max.
  Binding PlanningBinding() const;
  const std::vector<Entry>& entries() const { return entries_; }
  // Canonical text, part of the key: "batch:sym[1,64];seq<=512".
  const std::string& ToString() const { return text_; }

 private:
  std::vector<Entry> entries_;
  std::string text_;
};

struct CacheRequest {
  std::string graph_fingerprint;        // GraphFingerprint(g)
  std::vector<SymbolInfo> symbols;      // g.symbols()
  std::map<std::string, DimPolicy> policy;
  std::string device = "cuda";
  std::string arch = "sm_90a";
  std::map<std::string, std::string> options;  // compile options, any keys
  std::string compiler_version = kGraphCompilerVersion;
  // Fingerprint and symbols of `g` (hashes its canonical text: do it once per graph, not per step).
  static CacheRequest For(const Graph& g);
};

// SHA-256 hex of CanonicalText(g).
std::string GraphFingerprint(const Graph& g);

struct CacheStats {
  int64_t lookups = 0;
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t misses = 0;  // == compiles (successful or not)
  int64_t compile_failures = 0;
  int64_t corrupt_entries = 0;  // corrupted/foreign files found, deleted and rebuilt
  int64_t write_failures = 0;
  int64_t evictions = 0;
  double compile_seconds = 0;
  std::map<std::string, int64_t> miss_reasons;  // "new graph", "specialization changed (...)", ...
  std::vector<std::string> warnings;            // the most recent 16
  double hit_rate() const { return lookups ? double(memory_hits + disk_hits) / double(lookups) : 0; }
  std::string ToJson() const;
};

class CompileCache {
 public:
  struct Options {
    std::string dir;  // "" = memory only
    int64_t max_disk_bytes = int64_t(1) << 30;
    size_t max_memory_entries = 64;
    bool log_warnings = true;  // also print warnings to stderr
  };
  using CompileFn = std::function<absl::StatusOr<Artifact>(const Specialization&)>;

  // Creates `dir` if needed. Error if it cannot be created or is not a directory.
  static absl::StatusOr<std::unique_ptr<CompileCache>> Open(Options options);

  // Returns the artifact for (request, binding): from memory, else from disk, else by calling
  // `compile` (outside any lock) and storing the result. A failed compile is returned as is.
  absl::StatusOr<std::shared_ptr<const Artifact>> GetOrCompile(const CacheRequest& request,
                                                               const Binding& binding,
                                                               const CompileFn& compile);
  // The artifact stored for (request, binding), from memory or disk, compiling nothing: nullptr on
  // a miss (counted as a lookup only). For artifacts a caller extends after use (an autotuning
  // table, compiler/autotune.h) together with Store.
  absl::StatusOr<std::shared_ptr<const Artifact>> Lookup(const CacheRequest& request, const Binding& binding);
  // Stores `artifact` for (request, binding) in memory and on disk, replacing any previous one.
  absl::Status Store(const CacheRequest& request, const Binding& binding, Artifact artifact);
  // The key for (request, binding) and its specialization (no lookup).
  absl::StatusOr<std::string> Key(const CacheRequest& request, const Binding& binding) const;

  CacheStats stats() const;
  void ResetStats();
  const Options& options() const { return options_; }

 private:
  struct MemEntry {
    std::shared_ptr<const Artifact> artifact;
    std::string guard;
    uint64_t last_use;
  };
  explicit CompileCache(Options o) : options_(std::move(o)) {}
  std::string KeyFor(const CacheRequest& r, const Specialization& s) const;
  // The artifact cached under key with this guard, from memory or else from disk (then also kept in
  // memory); nullptr when neither has it. Counts the lookup and the hit. On a memory miss,
  // *corrupt_before (when given) is the corrupt-entry count before the disk read.
  std::shared_ptr<const Artifact> Find(const std::string& key, const std::string& guard,
                                       int64_t* corrupt_before = nullptr);
  std::shared_ptr<const Artifact> ReadDisk(const std::string& key, const std::string& guard);
  void WriteDisk(const std::string& key, const std::string& guard, const Artifact& a);
  void EvictDisk();
  void Warn(std::string msg);
  std::string MissReason(const CacheRequest& r, const Specialization& s);
  void InsertMemory(const std::string& key, const std::string& guard,
                    std::shared_ptr<const Artifact> a);

  Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, MemEntry> memory_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  CacheStats stats_ ABSL_GUARDED_BY(mu_);
  // Per graph fingerprint, the last (specialization, rest-of-key) compiled: explains recompiles.
  std::map<std::string, std::pair<std::string, std::string>> last_compiled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sg::graph

#endif  // SGTRAIN_GRAPH_CACHE_H_
