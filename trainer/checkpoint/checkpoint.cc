#include "trainer/checkpoint/checkpoint.h"

#include <stdio.h>  // renameat2
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/status.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint/content_hash.h"
#include "trainer/io/file_io.h"
#include "trainer/safetensors/hf_llama_names.h"

namespace sg::trainer {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

bool IsReserved(const std::string& name) {
  return name == kModelFile || name == kConfigFile || name == kOptimizerFile || name == kStateFile;
}

absl::Status Bad(const std::string& dir, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint '", dir, "': ", what));
}

// Replaces `dir` by `tmp` in one step when the filesystem can exchange directories; otherwise
// moves the old one aside first (a crash between the two renames leaves it as <dir>.old.<pid>).
absl::Status ReplaceDirectory(const std::string& tmp, const std::string& dir) {
  if (!fs::exists(dir)) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename '", tmp, "' to '", dir, "': ", std::strerror(errno)));
    }
    return FsyncDirectory(DirName(dir));
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    SG_RETURN_IF_ERROR(FsyncDirectory(DirName(dir)));
    return RemoveAll(tmp);  // now holds the previous checkpoint
  }
  const std::string old = absl::StrCat(dir, ".old.", ::getpid());
  if (::rename(dir.c_str(), old.c_str()) != 0 || ::rename(tmp.c_str(), dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot replace checkpoint '", dir, "' by '", tmp, "': ",
                                            std::strerror(errno)));
  }
  SG_RETURN_IF_ERROR(FsyncDirectory(DirName(dir)));
  return RemoveAll(old);
}

absl::StatusOr<int64_t> GetInt(const json& j, const std::string& path, const char* field, int64_t min_value) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < min_value) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, "': expected an integer >= ", min_value,
                                                   ", found ", it == j.end() ? "nothing" : it->dump()));
  }
  return it->get<int64_t>();
}

absl::Status CompareConfigs(const std::string& path, const LlamaConfig& found, const LlamaConfig& want) {
  struct Field {
    const char* name;
    double found, want;
  };
  const Field fields[] = {
      {"hidden_size", double(found.dim), double(want.dim)},
      {"num_hidden_layers", double(found.n_layers), double(want.n_layers)},
      {"num_attention_heads", double(found.n_heads), double(want.n_heads)},
      {"num_key_value_heads", double(found.n_kv_heads), double(want.n_kv_heads)},
      {"intermediate_size", double(found.ffn_dim), double(want.ffn_dim)},
      {"vocab_size", double(found.vocab_size), double(want.vocab_size)},
      {"max_position_embeddings", double(found.max_seq_len), double(want.max_seq_len)},
      {"rms_norm_eps", found.norm_eps, want.norm_eps},
      {"rope_theta", found.rope_theta, want.rope_theta},
  };
  for (const Field& f : fields) {
    if (f.found != f.want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field '", f.name, "' is ", f.found,
                                                     ", the run's config expects ", f.want));
    }
  }
  return absl::OkStatus();
}

// Optimizer tensors named "<model tensor>.<slot>" must have that tensor's shape.
absl::Status CheckOptimizerShapes(const std::string& path, const SafetensorsFile& optimizer,
                                  const std::vector<NamedTensor>& model) {
  for (const SafetensorsEntry& e : optimizer.entries()) {
    for (const NamedTensor& m : model) {
      if (absl::StartsWith(e.name, m.name + ".") && e.name.find('.', m.name.size() + 1) == std::string::npos &&
          e.shape != m.tensor.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name, "' has shape ",
                                                       ShapeToString(e.shape), ", its parameter '", m.name,
                                                       "' has shape ", ShapeToString(m.tensor.shape())));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NamedTensor>> LoadModelTensors(const std::string& path, const LlamaConfig& config) {
  SG_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
  SG_RETURN_IF_ERROR(CheckHfLlamaTensors(TensorShapes(f), config, path));
  return f.LoadAll();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir, const CheckpointContents& c) {
  SG_RETURN_IF_ERROR(ValidateLlamaConfig(c.config));
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const NamedTensorView& t : c.model) shapes.emplace_back(t.name, t.view.shape());
  SG_RETURN_IF_ERROR(CheckHfLlamaTensors(shapes, c.config, absl::StrCat("SaveCheckpoint '", dir, "': model")));
  for (const auto& [name, source] : c.extra_files) {
    SG_CHECK_ARG(!name.empty() && name.find('/') == std::string::npos && name[0] != '.' && !IsReserved(name),
                 "SaveCheckpoint '", dir, "': extra file name '", name,
                 "' must be a plain file name other than the checkpoint's own files");
  }
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  const std::string tmp = absl::StrCat(clean, ".tmp.", ::getpid());
  SG_RETURN_IF_ERROR(RemoveAll(tmp));
  SG_RETURN_IF_ERROR(MakeDirectories(tmp));

  const std::map<std::string, std::string> pt = {{"format", "pt"}};
  SG_RETURN_IF_ERROR(WriteSafetensors(JoinPath(tmp, kModelFile), c.model, pt));
  SG_RETURN_IF_ERROR(WriteHfConfig(c.config, JoinPath(tmp, kConfigFile), c.torch_dtype));
  SG_RETURN_IF_ERROR(WriteSafetensors(JoinPath(tmp, kOptimizerFile), c.optimizer, pt));
  std::vector<std::string> files = {kModelFile, kConfigFile, kOptimizerFile};
  for (const auto& [name, source] : c.extra_files) {
    SG_ASSIGN_OR_RETURN(std::string bytes, ReadFile(source));
    SG_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(tmp, name), bytes));
    files.push_back(name);
  }

  json state = {{"version", kCheckpointVersion},
                {"step", c.state.step},
                {"data", {{"epoch", c.state.data.epoch}, {"window", c.state.data.window}}},
                {"rng", c.state.rng},
                {"world_size", c.state.world_size},
                {"extra", c.state.extra},
                {"files", json::object()}};
  for (const std::string& name : files) {
    const std::string path = JoinPath(tmp, name);
    SG_ASSIGN_OR_RETURN(std::string hash, HashFile(path));
    state["files"][name] = {{"bytes", int64_t(fs::file_size(path))}, {"hash", hash}};
  }
  SG_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(tmp, kStateFile), state.dump(2) + "\n"));
  SG_RETURN_IF_ERROR(FsyncDirectory(tmp));
  return ReplaceDirectory(tmp, clean);
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir, const LlamaConfig* expected) {
  if (!fs::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir, "' does not exist"));
  }
  const std::string state_path = JoinPath(dir, kStateFile);
  SG_ASSIGN_OR_RETURN(std::string text, ReadFile(state_path, int64_t(1) << 26));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(state_path, ": expected a JSON object"));
  SG_ASSIGN_OR_RETURN(int64_t version, GetInt(j, state_path, "version", 0));
  if (version != kCheckpointVersion) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'version': expected ", kCheckpointVersion,
                                                   ", found ", version, " (written by another trainer version)"));
  }
  Checkpoint ckpt;
  SG_ASSIGN_OR_RETURN(ckpt.state.step, GetInt(j, state_path, "step", 0));
  SG_ASSIGN_OR_RETURN(int64_t world, GetInt(j, state_path, "world_size", 1));
  ckpt.state.world_size = int(world);
  if (!j.contains("data") || !j["data"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'data': expected {\"epoch\", \"window\"}"));
  }
  SG_ASSIGN_OR_RETURN(ckpt.state.data.epoch, GetInt(j["data"], state_path, "epoch", 0));
  SG_ASSIGN_OR_RETURN(ckpt.state.data.window, GetInt(j["data"], state_path, "window", 0));
  if (!j.contains("rng") || !j["rng"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'rng': expected a string"));
  }
  ckpt.state.rng = j["rng"].get<std::string>();
  if (j.contains("extra")) {
    if (!j["extra"].is_object()) return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'extra': expected an object"));
    for (auto it = j["extra"].begin(); it != j["extra"].end(); ++it) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'extra." , it.key(), "': expected a string"));
      }
      ckpt.state.extra[it.key()] = it->get<std::string>();
    }
  }

  // Every file is checked before any is parsed.
  if (!j.contains("files") || !j["files"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'files': expected an object"));
  }
  const json& files = j["files"];
  for (const char* required : {kModelFile, kConfigFile, kOptimizerFile}) {
    if (!files.contains(required)) {
      return absl::InvalidArgumentError(absl::StrCat(state_path, ": field 'files' does not list '", required, "'"));
    }
  }
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string name = it.key();
    if (name.find('/') != std::string::npos || name.empty() || name[0] == '.') {
      return absl::InvalidArgumentError(absl::StrCat(state_path, ": file name '", name, "' is not a plain file name"));
    }
    const std::string path = JoinPath(dir, name);
    if (!it->is_object() || !(*it)["hash"].is_string() || !(*it)["bytes"].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(state_path, ": files.", name, ": expected {\"bytes\", \"hash\"}"));
    }
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return Bad(dir, absl::StrCat("file '", name, "' listed in ", kStateFile, " is missing: ", ec.message()));
    const int64_t want_size = (*it)["bytes"].get<int64_t>();
    if (int64_t(size) != want_size) {
      return Bad(dir, absl::StrCat("file '", name, "' has ", size, " bytes, ", kStateFile, " records ", want_size,
                                   ": the file is truncated or was replaced"));
    }
    SG_ASSIGN_OR_RETURN(std::string hash, HashFile(path));
    const std::string want_hash = (*it)["hash"].get<std::string>();
    if (hash != want_hash) {
      return Bad(dir, absl::StrCat("file '", name, "' has content hash ", hash, ", ", kStateFile, " records ",
                                   want_hash, ": the file is corrupted or was replaced"));
    }
    if (!IsReserved(name)) ckpt.extra_files[name] = path;
  }

  const std::string config_path = JoinPath(dir, kConfigFile);
  SG_ASSIGN_OR_RETURN(ckpt.config, ReadHfConfig(config_path));
  if (expected != nullptr) SG_RETURN_IF_ERROR(CompareConfigs(config_path, ckpt.config, *expected));
  SG_ASSIGN_OR_RETURN(ckpt.model, LoadModelTensors(JoinPath(dir, kModelFile), ckpt.config));
  const std::string optimizer_path = JoinPath(dir, kOptimizerFile);
  SG_ASSIGN_OR_RETURN(SafetensorsFile optimizer, SafetensorsFile::Open(optimizer_path));
  SG_RETURN_IF_ERROR(CheckOptimizerShapes(optimizer_path, optimizer, ckpt.model));
  SG_ASSIGN_OR_RETURN(ckpt.optimizer, optimizer.LoadAll());
  return ckpt;
}

absl::StatusOr<Checkpoint> LoadHfModel(const std::string& dir) {
  Checkpoint ckpt;
  SG_ASSIGN_OR_RETURN(ckpt.config, ReadHfConfig(JoinPath(dir, kConfigFile)));
  const std::string model_path = JoinPath(dir, kModelFile);
  if (!fs::exists(model_path) && fs::exists(JoinPath(dir, "model.safetensors.index.json"))) {
    return absl::UnimplementedError(absl::StrCat("'", dir, "' holds a sharded model (model.safetensors.index.json); ",
                                                 "expected a single model.safetensors"));
  }
  SG_ASSIGN_OR_RETURN(ckpt.model, LoadModelTensors(model_path, ckpt.config));
  return ckpt;
}

std::string StepDir(const std::string& root, int64_t step) {
  return JoinPath(root, absl::StrFormat("step_%08d", step));
}

namespace {

// (step, path) of the complete step directories under root, ascending.
std::vector<std::pair<int64_t, std::string>> ListStepDirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step;
    if (!e.is_directory() || !absl::StartsWith(name, "step_") || !absl::SimpleAtoi(name.substr(5), &step) ||
        name.find('.') != std::string::npos || !fs::exists(e.path() / kStateFile)) {
      continue;
    }
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& root) {
  const auto dirs = ListStepDirs(root);
  if (dirs.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint (step_* directory) under '", root, "'"));
  return dirs.back().second;
}

absl::Status PruneCheckpoints(const std::string& root, int keep) {
  SG_CHECK_ARG(keep >= 1, "PruneCheckpoints: keep must be >= 1, found ", keep);
  const auto dirs = ListStepDirs(root);
  for (size_t i = 0; i + size_t(keep) < dirs.size(); ++i) SG_RETURN_IF_ERROR(RemoveAll(dirs[i].second));
  return absl::OkStatus();
}

}  // namespace sg::trainer
