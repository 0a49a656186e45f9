#include "trainer/checkpoint/sharded.h"

#include <stdio.h>  // rename
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/core/status.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint/content_hash.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

using json = nlohmann::json;
using sharding::DeviceMesh;
using sharding::Placement;
using sharding::TensorSpec;

std::string ShardFileName(int rank) { return absl::StrFormat("shard_%05d.safetensors", rank); }

// Whether `rank` writes its piece: replicated pieces are written once, by coordinate 0.
bool IsWriter(const TensorSpec& spec, int rank) {
  std::vector<int> coords = spec.mesh().Coordinates(rank);
  for (int m = 0; m < spec.mesh().ndim(); ++m) {
    if (spec.placements()[size_t(m)].is_replicate() && coords[size_t(m)] != 0) return false;
  }
  return true;
}

json SpecJson(DType dtype, const TensorSpec& spec) {
  return json{{"dtype", std::string(SafetensorsDTypeName(dtype))},
              {"shape", std::vector<int64_t>(spec.global_shape().begin(), spec.global_shape().end())},
              {"placements", sharding::PlacementsToString(spec.placements())}};
}

absl::StatusOr<std::pair<DType, TensorSpec>> SpecFromJson(const json& j, const DeviceMesh& mesh,
                                                          const std::string& where) {
  if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") ||
      !j["shape"].is_array() || !j.contains("placements") || !j["placements"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected {\"dtype\": string, \"shape\": [ints], \"placements\": string}, found ",
        j.dump().substr(0, 200)));
  }
  SG_ASSIGN_OR_RETURN(DType dtype, ParseSafetensorsDType(j["dtype"].get<std::string>()));
  Shape shape;
  for (const json& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shape entries must be integers >= 0, found ", d.dump()));
    }
    shape.push_back(d.get<int64_t>());
  }
  SG_ASSIGN_OR_RETURN(sharding::Placements p, sharding::ParsePlacements(j["placements"].get<std::string>()));
  absl::StatusOr<TensorSpec> spec = TensorSpec::Create(mesh, p, shape);
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", spec.status().message()));
  return std::make_pair(dtype, *spec);
}

// Copies the overlap of two boxes of a global tensor: `src` holds the box at `src_off` of shape
// `src_shape`, `dst` the box at `dst_off` of `dst_shape` (both row-major). Returns the number of
// elements copied.
int64_t CopyOverlap(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_off,
                    char* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_off,
                    size_t item) {
  const int n = int(dst_shape.size());
  if (n == 0) {
    std::memcpy(dst, src, item);
    return 1;
  }
  std::vector<int64_t> lo(static_cast<size_t>(n)), hi(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) {
    lo[size_t(d)] = std::max(src_off[size_t(d)], dst_off[size_t(d)]);
    hi[size_t(d)] = std::min(src_off[size_t(d)] + src_shape[d], dst_off[size_t(d)] + dst_shape[d]);
    if (hi[size_t(d)] <= lo[size_t(d)]) return 0;
  }
  Strides ss = ContiguousStrides(src_shape), ds = ContiguousStrides(dst_shape);
  const int64_t run = hi[size_t(n - 1)] - lo[size_t(n - 1)];
  std::vector<int64_t> idx(lo);
  int64_t copied = 0;
  while (true) {
    int64_t si = 0, di = 0;
    for (int d = 0; d < n; ++d) {
      si += (idx[size_t(d)] - src_off[size_t(d)]) * ss[d];
      di += (idx[size_t(d)] - dst_off[size_t(d)]) * ds[d];
    }
    std::memcpy(dst + size_t(di) * item, src + size_t(si) * item, size_t(run) * item);
    copied += run;
    int d = n - 2;
    for (; d >= 0; --d) {
      if (++idx[size_t(d)] < hi[size_t(d)]) break;
      idx[size_t(d)] = lo[size_t(d)];
    }
    if (d < 0) return copied;
  }
}

}  // namespace

std::string ShardRecord::ToJson() const {
  json t = json::object();
  for (const auto& [name, ds] : tensors) {
    t[name] = SpecJson(ds.first, ds.second);
    t[name]["mesh"] = ds.second.mesh().ToString();
  }
  return json{{"rank", rank}, {"file", file}, {"hash", hash}, {"bytes", bytes}, {"tensors", t}}.dump();
}

absl::StatusOr<ShardRecord> ShardRecord::FromJson(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer() ||
      !j.contains("file") || !j["file"].is_string() || !j.contains("hash") ||
      !j["hash"].is_string() || !j.contains("bytes") || !j["bytes"].is_number_integer() ||
      !j.contains("tensors") || !j["tensors"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("shard record: expected {rank, file, hash, bytes, tensors}, found ",
                                                   std::string(text.substr(0, 200))));
  }
  ShardRecord r;
  r.rank = j["rank"].get<int>();
  r.file = j["file"].get<std::string>();
  r.hash = j["hash"].get<std::string>();
  r.bytes = j["bytes"].get<int64_t>();
  for (const auto& [name, spec] : j["tensors"].items()) {
    if (!spec.is_object() || !spec.contains("mesh") || !spec["mesh"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("shard record of rank ", r.rank, ": tensor '", name, "' has no mesh"));
    }
    SG_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Parse(spec["mesh"].get<std::string>()));
    SG_ASSIGN_OR_RETURN(r.tensors[name], SpecFromJson(spec, mesh, "shard record tensor '" + name + "'"));
  }
  return r;
}

std::string StagingDir(const std::string& dir, const std::string& tag) {
  return absl::StrCat(dir, ".tmp.", tag);
}

absl::StatusOr<ShardRecord> WriteShard(const std::string& staging_dir, int rank, int64_t step,
                                       const std::vector<ShardedTensorView>& tensors) {
  ShardRecord rec;
  rec.rank = rank;
  std::vector<NamedTensorView> pieces;
  for (const ShardedTensorView& t : tensors) {
    const TensorSpec& s = t.spec;
    SG_CHECK_ARG(rank >= 0 && rank < s.mesh().size(), "WriteShard: rank ", rank, " is outside ",
                 s.ToString(), " of tensor '", t.name, "'");
    for (const Placement& p : s.placements()) {
      SG_CHECK_ARG(!p.is_partial(), "WriteShard: tensor '", t.name, "' is ", s.ToString(),
                   "; reduce Partial placements before saving");
    }
    SG_CHECK_ARG(t.local.shape() == s.LocalShape(rank), "WriteShard: tensor '", t.name, "' on rank ",
                 rank, " has local shape ", ShapeToString(t.local.shape()), ", its spec ",
                 s.ToString(), " gives ", ShapeToString(s.LocalShape(rank)));
    SG_CHECK_ARG(rec.tensors.count(t.name) == 0, "WriteShard: tensor '", t.name, "' given twice");
    rec.tensors[t.name] = {t.local.dtype(), s};
    if (IsWriter(s, rank) && t.local.numel() > 0) pieces.push_back({t.name, t.local});
  }
  if (pieces.empty()) return rec;
  SG_RETURN_IF_ERROR(MakeDirectories(staging_dir));
  rec.file = ShardFileName(rank);
  const std::string path = JoinPath(staging_dir, rec.file);
  SG_RETURN_IF_ERROR(WriteSafetensors(path, pieces,
                                      {{"format", "sgtrain-shard"},
                                       {"version", std::to_string(kShardedCheckpointVersion)},
                                       {"rank", std::to_string(rank)},
                                       {"step", std::to_string(step)}}));
  SG_ASSIGN_OR_RETURN(rec.hash, HashFile(path));
  rec.bytes = int64_t(std::filesystem::file_size(path));
  return rec;
}

absl::Status CommitShardedCheckpoint(const std::string& staging_dir, const std::string& dir,
                                     int64_t step, const std::vector<ShardRecord>& records,
                                     const std::map<std::string, std::string>& extra) {
  SG_CHECK_ARG(!records.empty(), "CommitShardedCheckpoint: no shard records");
  std::map<std::string, std::pair<DType, TensorSpec>> tensors;
  std::map<std::string, int> first_rank;
  const DeviceMesh* mesh = nullptr;
  for (const ShardRecord& r : records) {
    for (const auto& [name, ds] : r.tensors) {
      if (mesh == nullptr) mesh = &ds.second.mesh();
      SG_CHECK_ARG(ds.second.mesh() == *mesh, "CommitShardedCheckpoint: tensor '", name, "' is over mesh ",
                   ds.second.mesh().ToString(), ", others over ", mesh->ToString(), "; one mesh per checkpoint");
      auto [it, fresh] = tensors.emplace(name, ds);
      if (fresh) first_rank[name] = r.rank;
      SG_CHECK_ARG(it->second.first == ds.first && it->second.second == ds.second,
                   "CommitShardedCheckpoint: tensor '", name, "' is ", it->second.second.ToString(), " on rank ",
                   first_rank[name], " but ", ds.second.ToString(), " on rank ", r.rank);
    }
  }
  SG_CHECK_ARG(mesh != nullptr, "CommitShardedCheckpoint: no tensors");
  std::vector<const ShardRecord*> by_rank(size_t(mesh->size()), nullptr);
  for (const ShardRecord& r : records) {
    SG_CHECK_ARG(r.rank >= 0 && r.rank < mesh->size() && by_rank[size_t(r.rank)] == nullptr,
                 "CommitShardedCheckpoint: record of rank ", r.rank, " is out of range or repeated (mesh ",
                 mesh->ToString(), ")");
    by_rank[size_t(r.rank)] = &r;
  }
  json shards = json::array();
  for (int r = 0; r < mesh->size(); ++r) {
    SG_CHECK_ARG(by_rank[size_t(r)] != nullptr, "CommitShardedCheckpoint: no record from rank ", r, " of ",
                 mesh->size());
    const ShardRecord& rec = *by_rank[size_t(r)];
    shards.push_back({{"rank", r}, {"file", rec.file}, {"hash", rec.hash}, {"bytes", rec.bytes}});
  }
  json t = json::object();
  for (const auto& [name, ds] : tensors) t[name] = SpecJson(ds.first, ds.second);
  json manifest = {{"format", "sgtrain-sharded-checkpoint"},
                   {"version", kShardedCheckpointVersion},
                   {"step", step},
                   {"mesh", mesh->ToString()},
                   {"tensors", t},
                   {"shards", shards},
                   {"extra", extra}};
  SG_RETURN_IF_ERROR(MakeDirectories(staging_dir));
  SG_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging_dir, kShardedManifestFile), manifest.dump(1)));
  SG_RETURN_IF_ERROR(FsyncDirectory(staging_dir));
  // An existing `dir` (the same step saved again after a restart) moves aside first; a crash
  // between the two renames leaves it as <dir>.old.<pid>, never a half-written <dir>.
  const std::string old = absl::StrCat(dir, ".old.", ::getpid());
  const bool existed = std::filesystem::exists(dir);
  if (existed && ::rename(dir.c_str(), old.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot move '", dir, "' aside: ", std::strerror(errno)));
  }
  if (::rename(staging_dir.c_str(), dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename '", staging_dir, "' to '", dir, "': ",
                                            std::strerror(errno)));
  }
  SG_RETURN_IF_ERROR(FsyncDirectory(DirName(dir)));
  return existed ? RemoveAll(old) : absl::OkStatus();
}

absl::Status SaveShardedCheckpoint(const std::string& dir, int64_t step,
                                   const std::vector<std::vector<ShardedTensorView>>& per_rank,
                                   const std::map<std::string, std::string>& extra) {
  const std::string staging = StagingDir(dir, std::to_string(::getpid()));
  SG_RETURN_IF_ERROR(RemoveAll(staging));
  SG_RETURN_IF_ERROR(MakeDirectories(staging));
  std::vector<ShardRecord> records;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    SG_ASSIGN_OR_RETURN(ShardRecord rec, WriteShard(staging, int(r), step, per_rank[r]));
    records.push_back(std::move(rec));
  }
  return CommitShardedCheckpoint(staging, dir, step, records, extra);
}

absl::StatusOr<ShardedManifest> ReadShardedManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kShardedManifestFile);
  SG_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 64 << 20));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (j.value("format", "") != "sgtrain-sharded-checkpoint") {
    return bad(absl::StrCat("expected format \"sgtrain-sharded-checkpoint\", found ",
                            j.contains("format") ? j["format"].dump() : "nothing"));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int>() != kShardedCheckpointVersion) {
    return bad(absl::StrCat("expected version ", kShardedCheckpointVersion, ", found ",
                            j.contains("version") ? j["version"].dump() : "nothing"));
  }
  if (!j.contains("step") || !j["step"].is_number_integer() || !j.contains("mesh") ||
      !j["mesh"].is_string() || !j.contains("tensors") || !j["tensors"].is_object() ||
      !j.contains("shards") || !j["shards"].is_array()) {
    return bad("expected fields step (int), mesh (string), tensors (object), shards (array)");
  }
  ShardedManifest m;
  m.step = j["step"].get<int64_t>();
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Parse(j["mesh"].get<std::string>());
  if (!mesh.ok()) return bad(std::string(mesh.status().message()));
  m.mesh = *mesh;
  for (const auto& [name, spec] : j["tensors"].items()) {
    SG_ASSIGN_OR_RETURN(m.tensors[name], SpecFromJson(spec, m.mesh, path + ": tensor '" + name + "'"));
  }
  if (int(j["shards"].size()) != m.mesh.size()) {
    return bad(absl::StrCat("mesh ", m.mesh.ToString(), " has ", m.mesh.size(), " ranks, found ",
                            j["shards"].size(), " shard entries"));
  }
  for (const json& s : j["shards"]) {
    ShardRecord r;
    if (!s.is_object() || !s.contains("rank") || !s["rank"].is_number_integer() ||
        !s.contains("file") || !s["file"].is_string() || !s.contains("hash") ||
        !s["hash"].is_string() || !s.contains("bytes") || !s["bytes"].is_number_integer()) {
      return bad(absl::StrCat("shard entry ", m.shards.size(), ": expected {rank, file, hash, bytes}"));
    }
    r.rank = s["rank"].get<int>();
    r.file = s["file"].get<std::string>();
    r.hash = s["hash"].get<std::string>();
    r.bytes = s["bytes"].get<int64_t>();
    if (r.rank != int(m.shards.size())) {
      return bad(absl::StrCat("shard entry ", m.shards.size(), " is for rank ", r.rank));
    }
    if (r.file.find('/') != std::string::npos || r.file == "..") {
      return bad(absl::StrCat("shard file '", r.file, "' must be a plain name inside the checkpoint"));
    }
    m.shards.push_back(std::move(r));
  }
  if (j.contains("extra") && j["extra"].is_object()) {
    for (const auto& [k, v] : j["extra"].items()) {
      if (v.is_string()) m.extra[k] = v.get<std::string>();
    }
  }
  return m;
}

absl::StatusOr<std::vector<NamedTensor>> LoadShards(const std::string& dir, int rank,
                                                    const std::vector<ShardRequest>& requests) {
  SG_ASSIGN_OR_RETURN(ShardedManifest m, ReadShardedManifest(dir));
  // Shard files opened (and hash-checked) on first use.
  std::map<int, std::unique_ptr<SafetensorsFile>> files;
  auto open = [&](int r) -> absl::StatusOr<const SafetensorsFile*> {
    auto it = files.find(r);
    if (it != files.end()) return it->second.get();
    const ShardRecord& rec = m.shards[size_t(r)];
    const std::string what = absl::StrCat("checkpoint '", dir, "': shard ", rec.file, " (rank ", r, ")");
    if (rec.file.empty()) return absl::DataLossError(absl::StrCat(what, ": the manifest lists no file"));
    const std::string path = JoinPath(dir, rec.file);
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(what, ": ", ec.message()));
    if (int64_t(size) != rec.bytes) {
      return absl::DataLossError(absl::StrCat(what, " is ", size, " bytes, the manifest records ",
                                              rec.bytes, ": truncated or replaced; refusing to load"));
    }
    SG_ASSIGN_OR_RETURN(std::string hash, HashFile(path));
    if (hash != rec.hash) {
      return absl::DataLossError(absl::StrCat(what, " has content hash ", hash, ", the manifest records ",
                                              rec.hash, ": corrupted or from another save; refusing to load"));
    }
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    if (!f.ok()) return absl::DataLossError(absl::StrCat(what, ": ", f.status().message()));
    if (f->metadata().count("rank") == 0 || f->metadata().at("rank") != std::to_string(r)) {
      return absl::DataLossError(absl::StrCat(what, ": its metadata names rank ",
                                              f->metadata().count("rank") ? f->metadata().at("rank") : "none"));
    }
    return (files[r] = std::make_unique<SafetensorsFile>(*std::move(f))).get();
  };

  std::vector<NamedTensor> out;
  for (const ShardRequest& req : requests) {
    auto it = m.tensors.find(req.name);
    if (it == m.tensors.end()) {
      return absl::NotFoundError(absl::StrCat("checkpoint '", dir, "' has no tensor '", req.name, "'"));
    }
    const auto& [dtype, saved] = it->second;
    SG_CHECK_ARG(req.spec.global_shape() == saved.global_shape(), "checkpoint '", dir, "': tensor '",
                 req.name, "' has global shape ", ShapeToString(saved.global_shape()),
                 ", the new layout expects ", ShapeToString(req.spec.global_shape()));
    SG_CHECK_ARG(rank >= 0 && rank < req.spec.mesh().size(), "LoadShards: rank ", rank,
                 " is outside the new layout ", req.spec.ToString(), " of '", req.name, "'");
    for (const Placement& p : req.spec.placements()) {
      SG_CHECK_ARG(!p.is_partial(), "LoadShards: '", req.name, "' cannot be loaded as ", req.spec.ToString());
    }
    const Shape want_shape = req.spec.LocalShape(rank);
    const std::vector<int64_t> want_off = req.spec.LocalOffsets(rank);
    SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(want_shape, dtype, Device::Cpu()));
    const size_t item = size_t(SizeOf(dtype));
    int64_t filled = 0;
    for (int q = 0; q < saved.mesh().size() && filled < t.numel(); ++q) {
      if (!IsWriter(saved, q)) continue;
      const Shape src_shape = saved.LocalShape(q);
      if (NumElements(src_shape) == 0) continue;
      const std::vector<int64_t> src_off = saved.LocalOffsets(q);
      bool overlaps = true;
      for (size_t d = 0; d < want_shape.size(); ++d) {
        overlaps &= std::max(src_off[d], want_off[d]) < std::min(src_off[d] + src_shape[int(d)],
                                                                 want_off[d] + want_shape[int(d)]);
      }
      if (!overlaps) continue;
      SG_ASSIGN_OR_RETURN(const SafetensorsFile* f, open(q));
      const SafetensorsEntry* e = f->Find(req.name);
      const std::string what = absl::StrCat("checkpoint '", dir, "': shard ", m.shards[size_t(q)].file,
                                            " (rank ", q, ") tensor '", req.name, "'");
      if (e == nullptr) return absl::DataLossError(absl::StrCat(what, " is missing"));
      if (e->dtype != dtype || e->shape != src_shape) {
        return absl::DataLossError(absl::StrCat(what, " is ", SafetensorsDTypeName(e->dtype),
                                                ShapeToString(e->shape), ", the manifest's ", saved.ToString(),
                                                " gives ", SafetensorsDTypeName(dtype), ShapeToString(src_shape)));
      }
      SG_ASSIGN_OR_RETURN(absl::string_view bytes, f->Bytes(req.name));
      filled += CopyOverlap(bytes.data(), src_shape, src_off, static_cast<char*>(t.view().raw()),
                            want_shape, want_off, item);
    }
    if (filled != t.numel()) {
      return absl::DataLossError(absl::StrCat("checkpoint '", dir, "': tensor '", req.name, "' as ",
                                              saved.ToString(), " covers ", filled, " of the ", t.numel(),
                                              " elements rank ", rank, " needs under ", req.spec.ToString()));
    }
    out.push_back({req.name, std::move(t)});
  }
  return out;
}

absl::StatusOr<std::string> FindLatestShardedCheckpoint(const std::string& root) {
  int64_t best = -1;
  std::string best_dir;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step;
    if (!e.is_directory() || name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos ||
        !absl::SimpleAtoi(name.substr(5), &step) ||
        !std::filesystem::exists(e.path() / kShardedManifestFile)) {
      continue;
    }
    if (step > best) {
      best = step;
      best_dir = e.path().string();
    }
  }
  if (best < 0) {
    return absl::NotFoundError(absl::StrCat("no sharded checkpoint (step_* directory with ",
                                            kShardedManifestFile, ") under '", root, "'"));
  }
  return best_dir;
}

}  // namespace sg::trainer
