// Per-shard (tensor-level) checkpoints: every rank writes the pieces of the tensors it holds to its
// own safetensors file; a JSON manifest records each tensor's global shape, dtype and placements
// over the mesh, and each shard file's content hash. Loading verifies the hashes and reshards: a
// rank of a new layout (another mesh, other placements) reads from each old shard exactly the
// elements its new piece overlaps.
//
//   // every rank (a shared filesystem), then one rank once all are written:
//   SG_ASSIGN_OR_RETURN(ShardRecord rec, WriteShard(StagingDir(dir, "0"), rank, step, my_tensors));
//   SG_RETURN_IF_ERROR(CommitShardedCheckpoint(StagingDir(dir, "0"), dir, step, all_records, {}));
//   // later, on any layout:
//   SG_ASSIGN_OR_RETURN(auto local, LoadShards(dir, new_rank, {{"w", new_spec_of_w}}));
//
// Directory (a step directory, see StepDir in checkpoint.h):
//   <dir>/manifest.json            {"format", "version", "step", "mesh", "tensors": {name: {"dtype",
//                                   "shape", "placements"}}, "shards": [{"rank", "file", "hash",
//                                   "bytes"}], "extra": {}}; written last
//   <dir>/shard_<rank>.safetensors rank's pieces, under the tensors' own names, local shapes
// A replicated piece is written once: by the ranks at coordinate 0 of every mesh dim that
// replicates it. Partial placements are refused (reduce before saving).
//
// Atomicity: shards and manifest go to a staging directory (`<dir>.tmp.<tag>`, same tag on every
// rank, e.g. the restart count) that becomes <dir> in one rename, so a crash during a save leaves
// the previous step directory complete and the staging directory ignored (FindLatestShardedCheckpoint
// skips it). Hashes guard against corruption (a flipped byte, a shard from another save); they
// are not a defence against a forger (content_hash.h).
#ifndef SGTRAIN_TRAINER_CHECKPOINT_SHARDED_H_
#define SGTRAIN_TRAINER_CHECKPOINT_SHARDED_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/tensor.h"
#include "sharding/placement.h"
#include "trainer/safetensors/safetensors.h"

namespace sg::trainer {

inline constexpr int kShardedCheckpointVersion = 1;
inline constexpr char kShardedManifestFile[] = "manifest.json";

// A rank's local piece of a global tensor laid out by `spec` (local.shape() == spec.LocalShape(rank)).
struct ShardedTensorView {
  std::string name;
  sharding::TensorSpec spec;
  TensorView local;  // host, contiguous
};

// What WriteShard reports and CommitShardedCheckpoint collects, one per rank. Serializable, so
// ranks can send it to the committing rank through the store.
struct ShardRecord {
  int rank = 0;
  std::string file;  // relative to the checkpoint directory; empty when the rank wrote no piece
  std::string hash;  // "sg64:..." of the file
  int64_t bytes = 0;
  // Every tensor the rank holds (written or deduplicated away): name -> (dtype, spec).
  std::map<std::string, std::pair<DType, sharding::TensorSpec>> tensors;

  std::string ToJson() const;
  static absl::StatusOr<ShardRecord> FromJson(absl::string_view text);
};

// "<dir>.tmp.<tag>".
std::string StagingDir(const std::string& dir, const std::string& tag);

// Writes `rank`'s pieces to `staging_dir`/shard_<rank>.safetensors (creating the directory).
// InvalidArgument naming the tensor when a local shape disagrees with its spec, a placement is
// Partial, or `rank` is outside the spec's mesh.
absl::StatusOr<ShardRecord> WriteShard(const std::string& staging_dir, int rank, int64_t step,
                                       const std::vector<ShardedTensorView>& tensors);

// Checks that `records` hold one record per rank of the mesh with one layout per tensor, writes
// the manifest into `staging_dir` and renames it to `dir` (replacing an existing `dir`).
absl::Status CommitShardedCheckpoint(const std::string& staging_dir, const std::string& dir,
                                     int64_t step, const std::vector<ShardRecord>& records,
                                     const std::map<std::string, std::string>& extra);

// Every rank's shard and the commit in one process (tests, tools, single-process training):
// per_rank[r] holds rank r's pieces.
absl::Status SaveShardedCheckpoint(const std::string& dir, int64_t step,
                                   const std::vector<std::vector<ShardedTensorView>>& per_rank,
                                   const std::map<std::string, std::string>& extra = {});

struct ShardedManifest {
  int64_t step = 0;
  sharding::DeviceMesh mesh;
  std::map<std::string, std::pair<DType, sharding::TensorSpec>> tensors;
  std::vector<ShardRecord> shards;  // by rank; `tensors` left empty
  std::map<std::string, std::string> extra;
};

// Reads and checks the manifest (format, version, field types, one shard per rank of the mesh).
absl::StatusOr<ShardedManifest> ReadShardedManifest(const std::string& dir);

// The new layout of one tensor: `spec` over the new mesh, with the saved global shape.
struct ShardRequest {
  std::string name;
  sharding::TensorSpec spec;
};

// Rank `rank`'s pieces under the new layouts (host tensors of the saved dtype, in request order).
// Every shard file read is first checked against the manifest's hash and size; errors name the
// shard file and rank ("shard_00002.safetensors (rank 2) has content hash ..., the manifest
// records ...: corrupted"), the tensor, and what was expected and found.
absl::StatusOr<std::vector<NamedTensor>> LoadShards(const std::string& dir, int rank,
                                                    const std::vector<ShardRequest>& requests);

// The complete sharded step directory ("<root>/step_<n>" holding a manifest; staging ".tmp." and
// ".old." directories are ignored) with the highest step; NotFound when there is none. Step
// directories are named by StepDir (checkpoint.h).
absl::StatusOr<std::string> FindLatestShardedCheckpoint(const std::string& root);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_CHECKPOINT_SHARDED_H_
