#include "compiler/compile_cache.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/text.h"

namespace sg::compiler {
namespace {

constexpr const char* kFormat = "sgtrain-compile-cache-v1";

uint64_t Fnv1a(uint64_t h, const std::string& s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string PathFor(const std::string& dir, const std::string& key) { return absl::StrCat(dir, "/", key, ".graph"); }

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("compile cache: mkdir '", partial, "': ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CacheKey(const std::string& graph_text, const std::string& options_text) {
  uint64_t h = 1469598103934665603ull;
  h = Fnv1a(h, kFormat);
  h = Fnv1a(h, graph_text);
  h = Fnv1a(h, "\n--options--\n");
  h = Fnv1a(h, options_text);
  return absl::StrFormat("%016x", h);
}

absl::StatusOr<graph::Graph> LoadCachedGraph(const std::string& dir, const std::string& key) {
  const std::string path = PathFor(dir, key);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("compile cache: no entry ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto g = graph::ParseText(ss.str());
  if (!g.ok()) {
    return absl::DataLossError(absl::StrCat("compile cache entry ", path, " does not parse: ", g.status().message()));
  }
  return g;
}

absl::Status StoreCachedGraph(const std::string& dir, const std::string& key, const graph::Graph& g) {
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  const std::string path = PathFor(dir, key);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << graph::ToText(g);
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("compile cache: writing '", tmp, "' failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("compile cache: rename to '", path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler
