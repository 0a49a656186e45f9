// Per-shard checkpoints of a Trainer (trainer/checkpoint/sharded.h) across the ranks of a job:
// every rank writes its own pieces (Trainer::LocalShards) to one shard file, rank 0 collects the
// shard records through the job's store and commits the manifest, whose `extra` also carries the
// model config and the training progress (step, data position, RNG, notes). Loading needs no
// coordination: any rank of any world size reads what it needs (Trainer::RestoreShards).
//
//   ShardedSaveOptions o;  o.notes = {{"loss", "3.2"}};
//   SG_RETURN_IF_ERROR(SaveTrainerShards(*trainer, StepDir(run_dir, step), o, link));  // every rank
//   SG_ASSIGN_OR_RETURN(Checkpoint c, ReadTrainerShardState(dir));    // config + progress, no tensors
//   SG_RETURN_IF_ERROR(trainer->RestoreShards(dir, c.state));
//
// A rank lost during the save leaves the staging directory ("<dir>.tmp.<attempt>") uncommitted:
// the previous step directory stays the newest complete one. The survivors' waits fail with the
// health monitor's report (JobLink::Await) instead of hanging.
#ifndef SGTRAIN_TRAINER_SHARDED_SAVE_H_
#define SGTRAIN_TRAINER_SHARDED_SAVE_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/job_link.h"
#include "trainer/train_loop.h"

namespace sg::trainer {

struct ShardedSaveOptions {
  std::map<std::string, std::string> notes;        // the manifest's extra (as training_state's)
  std::map<std::string, std::string> extra_files;  // name in the checkpoint -> file, copied by rank 0
  std::function<void()> after_write;  // runs once this rank's shard is written, before the commit
};

// Collective over the job when `link` is non-null (every rank calls it, in the same order);
// a single process commits on its own.
absl::Status SaveTrainerShards(const Trainer& trainer, const std::string& dir, const ShardedSaveOptions& options,
                               JobLink* link);

// Whether `dir` holds a per-shard checkpoint (a manifest) rather than a full one.
bool IsShardedCheckpoint(const std::string& dir);

// The config (from the manifest's "config.json" entry), progress and notes of a per-shard
// checkpoint; tensors are left empty, extra_files lists the copied-in files present.
absl::StatusOr<Checkpoint> ReadTrainerShardState(const std::string& dir);

// The newest complete checkpoint under `root`, full or per-shard; NotFound when there is none.
absl::StatusOr<std::string> FindLatestTrainerCheckpoint(const std::string& root);

// Removes all but the newest `keep` per-shard step directories under `root`, and staging
// directories left by other attempts than `attempt` (a rank lost mid-save).
absl::Status PruneShardedCheckpoints(const std::string& root, int keep, const std::string& attempt);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_SHARDED_SAVE_H_
