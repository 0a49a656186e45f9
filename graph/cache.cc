#include "graph/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/core/sha256.h"
#include "graph/text.h"
#include "kernels/core/status.h"
#include "nlohmann/json.hpp"

namespace sg::graph {
namespace {

constexpr absl::string_view kMagic = "SGCACHE1\n";

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

bool ReadFile(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return false;
  }
  out->resize(size_t(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    const ssize_t r = ::read(fd, out->data() + got, out->size() - got);
    if (r <= 0) break;
    got += size_t(r);
  }
  ::close(fd);
  out->resize(got);
  return true;
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t w = ::write(fd, data.data(), data.size());
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write: ", std::strerror(errno)));
    }
    data.remove_prefix(size_t(w));
  }
  return absl::OkStatus();
}

// Header "name=value\n" at `pos`; advances pos.
bool Field(absl::string_view file, size_t* pos, absl::string_view name, std::string* value) {
  const size_t eol = file.find('\n', *pos);
  if (eol == absl::string_view::npos) return false;
  absl::string_view line = file.substr(*pos, eol - *pos);
  if (line.size() <= name.size() || line.substr(0, name.size()) != name || line[name.size()] != '=') {
    return false;
  }
  *value = std::string(line.substr(name.size() + 1));
  *pos = eol + 1;
  return true;
}

}  // namespace

// ---- Specialization ------------------------------------------------------------------------------

absl::StatusOr<Specialization> Specialization::Make(const std::vector<SymbolInfo>& symbols,
                                                    const std::map<std::string, DimPolicy>& policy,
                                                    const Binding& binding) {
  for (const auto& [name, p] : policy) {
    bool known = false;
    for (const SymbolInfo& s : symbols) known |= s.name == name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("shape policy names symbol '", name,
                                                     "', which the graph does not declare"));
    }
  }
  Specialization spec;
  std::vector<std::string> parts;
  for (const SymbolInfo& s : symbols) {
    auto it = binding.find(s.name);
    if (it == binding.end()) {
      return absl::InvalidArgumentError(absl::StrCat("symbol '", s.name, "' is not bound"));
    }
    SG_RETURN_IF_ERROR(s.Check(it->second));
    auto pit = policy.find(s.name);
    const DimPolicy p = pit == policy.end() ? DimPolicy::Symbolic() : pit->second;
    Entry e{s, p.kind, 0};
    switch (p.kind) {
      case DimPolicy::Kind::kConcrete:
        e.value = it->second;
        parts.push_back(absl::StrCat(s.name, "=", e.value));
        break;
      case DimPolicy::Kind::kBucketed: {
        int64_t b = std::max(NextPow2(it->second), NextPow2(std::max<int64_t>(p.min_bucket, 1)));
        b = (b + s.multiple_of - 1) / s.multiple_of * s.multiple_of;
        e.value = std::min(b, s.max);
        parts.push_back(absl::StrCat(s.name, "<=", e.value));
        break;
      }
      case DimPolicy::Kind::kSymbolic:
        e.value = s.max;
        parts.push_back(absl::StrCat(s.name, ":sym[", s.min, ",", s.max, "]%", s.multiple_of));
        break;
    }
    spec.entries_.push_back(e);
  }
  spec.text_ = absl::StrJoin(parts, ";");
  return spec;
}

absl::Status Specialization::Admits(const Binding& binding) const {
  for (const Entry& e : entries_) {
    auto it = binding.find(e.symbol.name);
    if (it == binding.end()) {
      return absl::FailedPreconditionError(absl::StrCat("symbol '", e.symbol.name, "' is not bound"));
    }
    const int64_t v = it->second;
    if (auto st = e.symbol.Check(v); !st.ok()) return absl::FailedPreconditionError(st.message());
    if (e.kind == DimPolicy::Kind::kConcrete && v != e.value) {
      return absl::FailedPreconditionError(absl::StrCat(e.symbol.name, "=", v, " but the artifact is for ",
                                                        e.symbol.name, "=", e.value));
    }
    if (e.kind == DimPolicy::Kind::kBucketed && v > e.value) {
      return absl::FailedPreconditionError(absl::StrCat(e.symbol.name, "=", v, " outside bucket ",
                                                        e.symbol.name, "<=", e.value));
    }
  }
  return absl::OkStatus();
}

Binding Specialization::PlanningBinding() const {
  Binding b;
  for (const Entry& e : entries_) b[e.symbol.name] = e.value;
  return b;
}

// ---- keys and stats ------------------------------------------------------------------------------

std::string GraphFingerprint(const Graph& g) { return Sha256Hex(CanonicalText(g)); }

CacheRequest CacheRequest::For(const Graph& g) {
  CacheRequest r;
  r.graph_fingerprint = GraphFingerprint(g);
  r.symbols = g.symbols();
  return r;
}

std::string CacheStats::ToJson() const {
  nlohmann::json j;
  j["lookups"] = lookups;
  j["memory_hits"] = memory_hits;
  j["disk_hits"] = disk_hits;
  j["misses"] = misses;
  j["compile_failures"] = compile_failures;
  j["corrupt_entries"] = corrupt_entries;
  j["write_failures"] = write_failures;
  j["evictions"] = evictions;
  j["compile_seconds"] = compile_seconds;
  j["hit_rate"] = hit_rate();
  j["miss_reasons"] = miss_reasons;
  j["warnings"] = warnings;
  return j.dump();
}

namespace {

std::string OptionsText(const std::map<std::string, std::string>& o) {
  return absl::StrJoin(o, ";", absl::PairFormatter("="));
}

}  // namespace

std::string CompileCache::KeyFor(const CacheRequest& r, const Specialization& s) const {
  Sha256 h;
  auto field = [&h](absl::string_view name, absl::string_view v) {
    h.Update(absl::StrCat(name, ":", v.size(), ":"));
    h.Update(v);
    h.Update("\n");
  };
  field("sgcache-key", "1");
  field("graph", r.graph_fingerprint);
  field("shapes", s.ToString());
  field("device", r.device);
  field("arch", r.arch);
  field("options", OptionsText(r.options));
  field("compiler", r.compiler_version);
  return ToHex(h.Finish());
}

absl::StatusOr<std::string> CompileCache::Key(const CacheRequest& request, const Binding& binding) const {
  SG_ASSIGN_OR_RETURN(Specialization s, Specialization::Make(request.symbols, request.policy, binding));
  return KeyFor(request, s);
}

// ---- the cache -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CompileCache>> CompileCache::Open(Options options) {
  if (!options.dir.empty()) {
    if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("compile cache: cannot create directory '", options.dir,
                                              "': ", std::strerror(errno)));
    }
    struct stat st;
    if (::stat(options.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("compile cache: '", options.dir,
                                                     "' is not a directory"));
    }
  }
  return std::unique_ptr<CompileCache>(new CompileCache(std::move(options)));
}

void CompileCache::Warn(std::string msg) {
  if (options_.log_warnings) std::cerr << "warning: " << msg << "\n";
  absl::MutexLock l(&mu_);
  stats_.warnings.push_back(std::move(msg));
  if (stats_.warnings.size() > 16) stats_.warnings.erase(stats_.warnings.begin());
}

CacheStats CompileCache::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void CompileCache::ResetStats() {
  absl::MutexLock l(&mu_);
  stats_ = CacheStats();
}

std::shared_ptr<const Artifact> CompileCache::ReadDisk(const std::string& key, const std::string& guard) {
  if (options_.dir.empty()) return nullptr;
  const std::string path = absl::StrCat(options_.dir, "/", key, ".sgc");
  std::string file;
  if (!ReadFile(path, &file)) return nullptr;  // absent (or vanished under an evictor): a miss
  auto reject = [&](const std::string& why) -> std::shared_ptr<const Artifact> {
    Warn(absl::StrCat("compile cache: ignoring ", path, ": ", why, "; rebuilding it"));
    ::unlink(path.c_str());
    absl::MutexLock l(&mu_);
    ++stats_.corrupt_entries;
    return nullptr;
  };
  if (file.size() < kMagic.size() || absl::string_view(file).substr(0, kMagic.size()) != kMagic) {
    return reject("not a cache entry (bad magic)");
  }
  size_t pos = kMagic.size();
  std::string fkey, fguard, graph_len, blob_len, sum;
  if (!Field(file, &pos, "key", &fkey) || !Field(file, &pos, "guard", &fguard) ||
      !Field(file, &pos, "graph", &graph_len) || !Field(file, &pos, "blob", &blob_len) ||
      !Field(file, &pos, "sha256", &sum) || pos >= file.size() || file[pos] != '\n') {
    return reject("malformed header");
  }
  ++pos;
  if (fkey != key) return reject(absl::StrCat("entry is for key ", fkey));
  if (fguard != guard) return reject(absl::StrCat("guard '", fguard, "' differs from '", guard, "'"));
  size_t gl = 0, bl = 0;
  if (!absl::SimpleAtoi(graph_len, &gl) || !absl::SimpleAtoi(blob_len, &bl) ||
      file.size() - pos != gl + bl) {
    return reject(absl::StrCat("payload is ", file.size() - pos, " bytes, header says ", graph_len,
                               " + ", blob_len, " (truncated?)"));
  }
  absl::string_view payload = absl::string_view(file).substr(pos);
  if (Sha256Hex(payload) != sum) return reject("checksum mismatch (corrupted)");
  auto a = std::make_shared<Artifact>();
  a->graph_text = std::string(payload.substr(0, gl));
  a->plan_blob = std::string(payload.substr(gl));
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recently used: last to be evicted
  return a;
}

void CompileCache::WriteDisk(const std::string& key, const std::string& guard, const Artifact& a) {
  if (options_.dir.empty()) return;
  static std::atomic<uint64_t> counter{0};
  const std::string path = absl::StrCat(options_.dir, "/", key, ".sgc");
  const std::string tmp = absl::StrCat(options_.dir, "/.tmp.", ::getpid(), ".",
                                       std::hash<std::thread::id>()(std::this_thread::get_id()), ".",
                                       counter++);
  std::string payload = a.graph_text + a.plan_blob;
  std::string header = absl::StrCat(kMagic, "key=", key, "\nguard=", guard, "\ngraph=",
                                     a.graph_text.size(), "\nblob=", a.plan_blob.size(),
                                     "\nsha256=", Sha256Hex(payload), "\n\n");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  absl::Status st = fd < 0 ? absl::InternalError(std::strerror(errno)) : absl::OkStatus();
  if (st.ok()) st = WriteAll(fd, header);
  if (st.ok()) st = WriteAll(fd, payload);
  if (st.ok() && ::fsync(fd) != 0) st = absl::InternalError(absl::StrCat("fsync: ", std::strerror(errno)));
  if (fd >= 0) ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = absl::InternalError(absl::StrCat("rename: ", std::strerror(errno)));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    Warn(absl::StrCat("compile cache: could not write ", path, ": ", st.message()));
    absl::MutexLock l(&mu_);
    ++stats_.write_failures;
    return;
  }
  EvictDisk();
}

void CompileCache::EvictDisk() {
  DIR* d = ::opendir(options_.dir.c_str());
  if (d == nullptr) return;
  struct File {
    std::string path;
    int64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<File> files;
  int64_t total = 0;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string path = options_.dir + "/" + name;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (name.rfind(".tmp.", 0) == 0) {
      if (now - mtime > int64_t(600) * 1000000000) ::unlink(path.c_str());  // a crashed writer's
      continue;
    }
    if (name.size() < 4 || name.substr(name.size() - 4) != ".sgc") continue;
    files.push_back({path, int64_t(st.st_size), mtime});
    total += st.st_size;
  }
  ::closedir(d);
  if (total <= options_.max_disk_bytes) return;
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.mtime_ns < b.mtime_ns; });
  int64_t evicted = 0;
  for (size_t i = 0; i + 1 < files.size() && total > options_.max_disk_bytes; ++i) {
    // Another process may have evicted it already; the space is gone either way.
    if (::unlink(files[i].path.c_str()) == 0) ++evicted;
    total -= files[i].bytes;
  }
  absl::MutexLock l(&mu_);
  stats_.evictions += evicted;
}

void CompileCache::InsertMemory(const std::string& key, const std::string& guard,
                                std::shared_ptr<const Artifact> a) {
  absl::MutexLock l(&mu_);
  memory_[key] = MemEntry{std::move(a), guard, ++clock_};
  while (memory_.size() > std::max<size_t>(options_.max_memory_entries, 1)) {
    auto oldest = memory_.begin();
    for (auto it = memory_.begin(); it != memory_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    memory_.erase(oldest);
  }
}

std::string CompileCache::MissReason(const CacheRequest& r, const Specialization& s) {
  const std::string rest = absl::StrCat(r.device, "|", r.arch, "|", OptionsText(r.options), "|",
                                        r.compiler_version);
  auto it = last_compiled_.find(r.graph_fingerprint);
  std::string reason;
  if (it == last_compiled_.end()) {
    reason = "new graph";
  } else if (it->second.second != rest) {
    reason = "target, options or compiler version changed";
  } else {
    std::vector<std::string> changed;
    std::vector<std::string> old_parts = absl::StrSplit(it->second.first, ';');
    std::vector<std::string> new_parts = absl::StrSplit(s.ToString(), ';');
    for (size_t i = 0; i < s.entries().size(); ++i) {
      if (i >= old_parts.size() || i >= new_parts.size() || old_parts[i] != new_parts[i]) {
        changed.push_back(s.entries()[i].symbol.name);
      }
    }
    reason = changed.empty() ? "evicted" : "specialization changed: " + absl::StrJoin(changed, ",");
  }
  last_compiled_[r.graph_fingerprint] = {s.ToString(), rest};
  return reason;
}

absl::StatusOr<std::shared_ptr<const Artifact>> CompileCache::GetOrCompile(
    const CacheRequest& request, const Binding& binding, const CompileFn& compile) {
  SG_ASSIGN_OR_RETURN(Specialization spec, Specialization::Make(request.symbols, request.policy, binding));
  SG_RETURN_IF_ERROR(spec.Admits(binding));
  const std::string key = KeyFor(request, spec);
  const std::string& guard = spec.ToString();
  int64_t corrupt_before = 0;
  if (std::shared_ptr<const Artifact> a = Find(key, guard, &corrupt_before)) return a;
  std::string reason;
  {
    absl::MutexLock l(&mu_);
    ++stats_.misses;
    reason = stats_.corrupt_entries > corrupt_before ? "corrupt disk entry" : MissReason(request, spec);
    ++stats_.miss_reasons[reason];
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Artifact> built = compile(spec);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    absl::MutexLock l(&mu_);
    stats_.compile_seconds += secs;
    if (!built.ok()) ++stats_.compile_failures;
  }
  if (!built.ok()) return built.status();
  auto a = std::make_shared<const Artifact>(*std::move(built));
  WriteDisk(key, guard, *a);
  InsertMemory(key, guard, a);
  return a;
}

absl::StatusOr<std::shared_ptr<const Artifact>> CompileCache::Lookup(const CacheRequest& request,
                                                                    const Binding& binding) {
  SG_ASSIGN_OR_RETURN(Specialization spec, Specialization::Make(request.symbols, request.policy, binding));
  SG_RETURN_IF_ERROR(spec.Admits(binding));
  return Find(KeyFor(request, spec), spec.ToString());
}

std::shared_ptr<const Artifact> CompileCache::Find(const std::string& key, const std::string& guard,
                                                   int64_t* corrupt_before) {
  {
    absl::MutexLock l(&mu_);
    ++stats_.lookups;
    auto it = memory_.find(key);
    if (it != memory_.end() && it->second.guard == guard) {
      ++stats_.memory_hits;
      it->second.last_use = ++clock_;
      return it->second.artifact;
    }
    if (corrupt_before != nullptr) *corrupt_before = stats_.corrupt_entries;
  }
  std::shared_ptr<const Artifact> a = ReadDisk(key, guard);
  if (a != nullptr) {
    InsertMemory(key, guard, a);
    absl::MutexLock l(&mu_);
    ++stats_.disk_hits;
  }
  return a;
}

absl::Status CompileCache::Store(const CacheRequest& request, const Binding& binding, Artifact artifact) {
  SG_ASSIGN_OR_RETURN(Specialization spec, Specialization::Make(request.symbols, request.policy, binding));
  const std::string key = KeyFor(request, spec);
  auto a = std::make_shared<const Artifact>(std::move(artifact));
  WriteDisk(key, spec.ToString(), *a);
  InsertMemory(key, spec.ToString(), a);
  return absl::OkStatus();
}

}  // namespace sg::graph
