// Training checkpoints: one directory that transformers can load as a Llama model and that resumes
// training exactly.
//
//   <dir>/model.safetensors      the weights, Hugging Face Llama names and [out, in] orientation
//   <dir>/config.json            Hugging Face LlamaConfig
//   <dir>/optimizer.safetensors  optimizer state (any names, e.g. "<param>.exp_avg")
//   <dir>/<extra files>          e.g. tokenizer.model, copied in
//   <dir>/training_state.json    version, step, RNG state, data position, world size, and each
//                                file's size and content hash; written last
//
// Saving is atomic: everything goes to `<dir>.tmp.<pid>`, is fsynced, and replaces <dir> in one
// rename (an atomic exchange when <dir> exists), so a crash at any point leaves the previous
// checkpoint loadable. Loading verifies every file's hash and the tensors' shapes against the
// config before returning anything.
//
//   SG_RETURN_IF_ERROR(SaveCheckpoint(StepDir("runs/x", step), {config, model, optimizer, state}));
//   SG_ASSIGN_OR_RETURN(std::string latest, FindLatestCheckpoint("runs/x"));
//   SG_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(latest, &config));
#ifndef SGTRAIN_TRAINER_CHECKPOINT_CHECKPOINT_H_
#define SGTRAIN_TRAINER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/config/llama_config.h"
#include "trainer/data/data_loader.h"
#include "trainer/safetensors/safetensors.h"

namespace sg::trainer {

inline constexpr int kCheckpointVersion = 1;
inline constexpr char kModelFile[] = "model.safetensors";
inline constexpr char kConfigFile[] = "config.json";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kStateFile[] = "training_state.json";

struct TrainingState {
  int64_t step = 0;
  DataPosition data;
  std::string rng;     // the trainer's RNG, serialized by the trainer (e.g. `os << std::mt19937_64`)
  int world_size = 1;  // the run's data-parallel size when saved
  std::map<std::string, std::string> extra;  // free-form notes (loss, tokenizer, ...)
};

// What SaveCheckpoint writes. Tensors are host tensors; model names must be the config's
// HfLlamaParameters (checked before anything is written).
struct CheckpointContents {
  LlamaConfig config;
  std::vector<NamedTensorView> model;
  std::vector<NamedTensorView> optimizer;
  TrainingState state;
  // File name in the checkpoint -> existing file to copy in (e.g. {"tokenizer.model", path}).
  std::map<std::string, std::string> extra_files;
  std::string torch_dtype = "float32";  // config.json's torch_dtype
};

struct Checkpoint {
  LlamaConfig config;
  std::vector<NamedTensor> model;
  std::vector<NamedTensor> optimizer;
  TrainingState state;
  std::map<std::string, std::string> extra_files;  // name -> path inside the checkpoint
};

absl::Status SaveCheckpoint(const std::string& dir, const CheckpointContents& contents);

// Loads and verifies `dir`: training_state.json's version and fields, every listed file's size and
// hash, config.json, model tensors against the config (and against `expected` when given: a
// checkpoint of another shape is refused naming the field), optimizer tensors named
// "<model tensor>.<slot>" against that tensor's shape. Every error names the file, the tensor or
// field, what was expected and what was found.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir, const LlamaConfig* expected = nullptr);

// Loads only the weights of a Hugging Face Llama directory (config.json + model.safetensors, as
// transformers saves them, no training state), checked against the config.
absl::StatusOr<Checkpoint> LoadHfModel(const std::string& dir);

// "<root>/step_00001200".
std::string StepDir(const std::string& root, int64_t step);
// The complete step directory with the highest step under `root` (in-progress ".tmp" directories
// are ignored); NotFound when there is none.
absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& root);
// Removes all but the newest `keep` step directories under `root`.
absl::Status PruneCheckpoints(const std::string& root, int keep);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_CHECKPOINT_CHECKPOINT_H_
