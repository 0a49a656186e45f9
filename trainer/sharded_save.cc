#include "trainer/sharded_save.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "trainer/checkpoint/sharded.h"
#include "trainer/config/llama_config.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

namespace fs = std::filesystem;

// Manifest extra entries beside the notes.
constexpr char kConfigEntry[] = "config.json";
constexpr char kEpochEntry[] = "state.data_epoch";
constexpr char kWindowEntry[] = "state.data_window";
constexpr char kRngEntry[] = "state.rng";
constexpr char kWorldEntry[] = "state.world_size";
// A rank whose save waits longer than this for the others has lost them (the monitor normally
// says so much earlier).
constexpr absl::Duration kCommitTimeout = absl::Minutes(10);

absl::StatusOr<int64_t> IntEntry(const ShardedManifest& m, const char* key, const std::string& dir) {
  auto it = m.extra.find(key);
  int64_t v;
  if (it == m.extra.end() || !absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", kShardedManifestFile, ": extra '", key,
                                                   "': expected an integer, found ",
                                                   it == m.extra.end() ? "nothing" : "'" + it->second + "'"));
  }
  return v;
}

// Copies `files` (name -> source path) into `dir`.
absl::Status CopyFiles(const std::map<std::string, std::string>& files, const std::string& dir) {
  for (const auto& [name, source] : files) {
    SG_ASSIGN_OR_RETURN(std::string bytes, ReadFile(source));
    SG_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, name), bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveTrainerShards(const Trainer& trainer, const std::string& dir, const ShardedSaveOptions& options,
                               JobLink* link) {
  const int rank = trainer.options().rank, world = trainer.options().world_size;
  SG_CHECK_ARG(link != nullptr || world == 1, "SaveTrainerShards: a job of ", world, " ranks needs a JobLink");
  const TrainingState state = trainer.Progress(options.notes);
  std::map<std::string, std::string> extra = state.extra;
  SG_ASSIGN_OR_RETURN(extra[kConfigEntry], HfConfigJson(trainer.options().config));
  extra[kEpochEntry] = absl::StrCat(state.data.epoch);
  extra[kWindowEntry] = absl::StrCat(state.data.window);
  extra[kRngEntry] = state.rng;
  extra[kWorldEntry] = absl::StrCat(world);

  SG_ASSIGN_OR_RETURN(std::vector<LocalShard> shards, trainer.LocalShards());
  std::vector<ShardedTensorView> views;
  for (const LocalShard& s : shards) views.push_back({s.name, s.spec, s.local.view()});
  const std::string staging = StagingDir(dir, link != nullptr ? link->attempt() : "0");
  SG_ASSIGN_OR_RETURN(ShardRecord record, WriteShard(staging, rank, state.step, views));
  if (options.after_write) options.after_write();

  if (link == nullptr) {
    SG_RETURN_IF_ERROR(CopyFiles(options.extra_files, staging));
    return CommitShardedCheckpoint(staging, dir, state.step, {record}, extra);
  }
  // One key space per save: the same step may be saved twice (periodic and final).
  const std::string key = absl::StrCat("ckpt/", link->NextSequence(), "/");
  SG_RETURN_IF_ERROR(link->Publish(absl::StrCat(key, "rank/", rank), record.ToJson()));
  if (rank != 0) return link->Await(key + "done", kCommitTimeout).status();
  std::vector<ShardRecord> records;
  for (int r = 0; r < world; ++r) {
    SG_ASSIGN_OR_RETURN(std::string text, link->Await(absl::StrCat(key, "rank/", r), kCommitTimeout));
    SG_ASSIGN_OR_RETURN(ShardRecord other, ShardRecord::FromJson(text));
    records.push_back(std::move(other));
  }
  SG_RETURN_IF_ERROR(CopyFiles(options.extra_files, staging));
  SG_RETURN_IF_ERROR(CommitShardedCheckpoint(staging, dir, state.step, records, extra));
  return link->Publish(key + "done", "1");
}

bool IsShardedCheckpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(JoinPath(dir, kShardedManifestFile), ec);
}

absl::StatusOr<Checkpoint> ReadTrainerShardState(const std::string& dir) {
  SG_ASSIGN_OR_RETURN(ShardedManifest m, ReadShardedManifest(dir));
  Checkpoint c;
  auto config = m.extra.find(kConfigEntry);
  if (config == m.extra.end()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", kShardedManifestFile, ": extra has no '", kConfigEntry,
                                                   "' entry (not a trainer checkpoint?)"));
  }
  SG_ASSIGN_OR_RETURN(c.config, ParseHfConfig(config->second, absl::StrCat(dir, "/", kShardedManifestFile,
                                                                           " extra '", kConfigEntry, "'")));
  c.state.step = m.step;
  SG_ASSIGN_OR_RETURN(c.state.data.epoch, IntEntry(m, kEpochEntry, dir));
  SG_ASSIGN_OR_RETURN(c.state.data.window, IntEntry(m, kWindowEntry, dir));
  SG_ASSIGN_OR_RETURN(const int64_t world, IntEntry(m, kWorldEntry, dir));
  c.state.world_size = int(world);
  if (auto rng = m.extra.find(kRngEntry); rng != m.extra.end()) c.state.rng = rng->second;
  for (const auto& [k, v] : m.extra) {
    if (k != kConfigEntry && !absl::StartsWith(k, "state.")) c.state.extra[k] = v;
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name != kShardedManifestFile && !absl::EndsWith(name, ".safetensors")) {
      c.extra_files[name] = e.path().string();
    }
  }
  return c;
}

absl::StatusOr<std::string> FindLatestTrainerCheckpoint(const std::string& root) {
  absl::StatusOr<std::string> full = FindLatestCheckpoint(root);
  absl::StatusOr<std::string> sharded = FindLatestShardedCheckpoint(root);
  if (!full.ok() && !sharded.ok()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint (step_* directory, full or per-shard) under '", root, "'"));
  }
  if (!full.ok()) return sharded;
  if (!sharded.ok()) return full;
  // Same root, same StepDir naming: the later step sorts last.
  return std::max(*full, *sharded);
}

absl::Status PruneShardedCheckpoints(const std::string& root, int keep, const std::string& attempt) {
  SG_CHECK_ARG(keep >= 1, "PruneShardedCheckpoints: keep must be >= 1, found ", keep);
  std::vector<std::string> complete;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !absl::StartsWith(name, "step_")) continue;
    const size_t tmp = name.find(".tmp.");
    if (tmp != std::string::npos) {
      if (name.substr(tmp + 5) != attempt) SG_RETURN_IF_ERROR(RemoveAll(e.path().string()));
    } else if (name.find('.') == std::string::npos && IsShardedCheckpoint(e.path().string())) {
      complete.push_back(e.path().string());
    }
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + size_t(keep) < complete.size(); ++i) SG_RETURN_IF_ERROR(RemoveAll(complete[i]));
  return absl::OkStatus();
}

}  // namespace sg::trainer
