// The compiler's on-disk cache: the prepared training graph (after mixed precision, autodiff,
// optimizer and passes) keyed by a hash of the input graph's canonical text and every option that
// changes it, so a second process start skips that work. Entries are written atomically (a
// temporary file renamed into place), so a crash never leaves a torn entry.
//
//   std::string key = CacheKey(CanonicalText(g), "precision=bf16;recompute=none");
//   if (auto hit = LoadCachedGraph(dir, key); hit.ok()) { ... }
//   SG_RETURN_IF_ERROR(StoreCachedGraph(dir, key, training_graph));
//
// This is the compiler's adapter until graph/cache lands; the key and file format are private to
// this file, so switching changes nothing for callers.
#ifndef SGTRAIN_COMPILER_COMPILE_CACHE_H_
#define SGTRAIN_COMPILER_COMPILE_CACHE_H_

#include <string>

#include "absl/status/statusor.h"
#include "graph/ir.h"

namespace sg::compiler {

// 16 hex digits: FNV-1a 64 of the graph text, the options text and the cache format version.
std::string CacheKey(const std::string& graph_text, const std::string& options_text);

// NotFound when no entry exists; DataLoss naming the file when an entry does not parse.
absl::StatusOr<graph::Graph> LoadCachedGraph(const std::string& dir, const std::string& key);

// Creates `dir` if needed. Internal with the path and errno text on an I/O failure.
absl::Status StoreCachedGraph(const std::string& dir, const std::string& key, const graph::Graph& g);

}  // namespace sg::compiler

#endif  // SGTRAIN_COMPILER_COMPILE_CACHE_H_
