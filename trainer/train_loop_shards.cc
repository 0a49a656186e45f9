// The Trainer's per-shard checkpoint pieces (train_loop.h: LocalShards, RestoreShards): which
// layout the compiled step keeps each parameter in, and copying this rank's piece out and back.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compiler/training_graph.h"
#include "kernels/core/status.h"
#include "trainer/checkpoint/sharded.h"
#include "trainer/model/llama_model.h"
#include "trainer/safetensors/hf_llama_names.h"
#include "trainer/train_loop.h"

namespace sg::trainer {
namespace {

using sharding::DeviceMesh;
using sharding::Placement;
using sharding::TensorSpec;

// The three tensors a parameter contributes: the weight and its AdamW moments, under the names
// the full checkpoint uses too (PyTorch's AdamW slot names).
struct Slot {
  const char* suffix;
  std::string (*source)(const std::string&);
};
std::string Self(const std::string& g) { return g; }
constexpr Slot kSlots[] = {{"", &Self}, {".exp_avg", &compiler::AdamMName}, {".exp_avg_sq", &compiler::AdamVName}};

absl::StatusOr<TensorSpec> Layout(const std::vector<std::string>& dims, const std::vector<int>& sizes,
                                  sharding::Placements placements, const Shape& shape) {
  SG_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(dims, sizes));
  return TensorSpec::Create(mesh, std::move(placements), shape);
}

// A flat view of `v`'s elements (the distributed step's shards are flat f32 buffers).
TensorView Flat(const TensorView& v) { return TensorView(v.raw(), v.dtype(), {v.numel()}, v.device()); }

}  // namespace

absl::StatusOr<TensorSpec> Trainer::ShardLayout(const Shape& shape) const {
  const int world = options_.world_size;
  const std::vector<int64_t>& mesh = options_.mesh;
  switch (options_.strategy) {
    case compiler::Strategy::kNone:
      return Layout({"dp"}, {1}, {Placement::Replicate()}, shape);
    case compiler::Strategy::kFsdp:
      // ZeRO-3 over every mesh dim: the runtime's shard group is the world, in world-rank order.
      return Layout({"dp"}, {world}, {Placement::Shard(0)}, shape);
    case compiler::Strategy::kHybridShard:
      if (mesh.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("per-shard checkpoint: strategy hybrid needs a 2-D --mesh, found ", mesh.size(), " dims"));
      }
      return Layout({"replicate", "shard"}, {int(mesh[0]), int(mesh[1])},
                    {Placement::Replicate(), Placement::Shard(0)}, shape);
    case compiler::Strategy::kAuto: {
      // The planner chose replicate, FSDP or (2-D mesh) HYBRID_SHARD; every parameter shares the
      // chosen layout, so the embedding's piece (the most rows) tells which one.
      SG_ASSIGN_OR_RETURN(std::string embed, GraphParameterName("model.embed_tokens.weight"));
      SG_ASSIGN_OR_RETURN(TensorView held, compiled_->View(embed));
      const Shape embed_shape = {options_.config.vocab_size, options_.config.dim};
      std::vector<std::pair<std::vector<int>, sharding::Placements>> candidates = {
          {{world}, {Placement::Shard(0)}}, {{world}, {Placement::Replicate()}}};
      if (mesh.size() == 2) {
        candidates.push_back({{int(mesh[0]), int(mesh[1])}, {Placement::Replicate(), Placement::Shard(0)}});
      }
      for (const auto& [sizes, placements] : candidates) {
        std::vector<std::string> dims = sizes.size() == 1 ? std::vector<std::string>{"dp"}
                                                          : std::vector<std::string>{"replicate", "shard"};
        SG_ASSIGN_OR_RETURN(TensorSpec probe, Layout(dims, sizes, placements, embed_shape));
        if (NumElements(probe.LocalShape(options_.rank)) == held.numel()) return Layout(dims, sizes, placements, shape);
      }
      return absl::UnimplementedError(absl::StrCat("per-shard checkpoint: strategy auto chose a layout that "
                                                   "is neither replicated, FSDP nor HYBRID_SHARD (rank ",
                                                   options_.rank, " holds ", held.numel(), " embedding elements)"));
    }
    default:
      return absl::UnimplementedError(absl::StrCat("per-shard checkpoint: the layout of strategy '",
                                                   compiler::StrategyName(options_.strategy),
                                                   "' is not known to the trainer; use --checkpoint_format=full"));
  }
}

absl::StatusOr<std::vector<LocalShard>> Trainer::LocalShards() const {
  const bool distributed = options_.strategy != compiler::Strategy::kNone;
  if (distributed) SG_RETURN_IF_ERROR(compiled_->executor().Synchronize());
  std::vector<LocalShard> out;
  for (const HfParameter& p : HfLlamaParameters(options_.config)) {
    SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName(p.name));
    SG_ASSIGN_OR_RETURN(TensorSpec spec, ShardLayout(p.shape));
    for (const Slot& slot : kSlots) {
      LocalShard s;
      s.name = absl::StrCat(p.name, slot.suffix);
      s.spec = spec;
      SG_ASSIGN_OR_RETURN(s.local, Tensor::Empty(spec.LocalShape(options_.rank), DType::kF32, Device::Cpu()));
      const std::string source = slot.source(g);
      if (!distributed) {
        SG_RETURN_IF_ERROR(compiled_->Read(source, s.local.view()));
      } else {
        SG_ASSIGN_OR_RETURN(TensorView held, compiled_->View(source));
        if (held.numel() != s.local.numel() || held.dtype() != DType::kF32) {
          return absl::InternalError(absl::StrCat("per-shard checkpoint: rank ", options_.rank, " holds ",
                                                  held.numel(), " ", DTypeName(held.dtype()), " elements of '",
                                                  source, "', the layout ", spec.ToString(), " expects ",
                                                  s.local.numel(), " f32"));
        }
        SG_RETURN_IF_ERROR(CopyTensor(Flat(held), Flat(s.local.view()), compiled_->executor().compute_stream()));
      }
      out.push_back(std::move(s));
    }
  }
  if (distributed) SG_RETURN_IF_ERROR(compiled_->executor().Synchronize());
  return out;
}

absl::Status Trainer::RestoreShards(const std::string& dir, const TrainingState& state) {
  const bool distributed = options_.strategy != compiler::Strategy::kNone;
  std::vector<ShardRequest> requests;
  std::vector<std::string> sources;
  for (const HfParameter& p : HfLlamaParameters(options_.config)) {
    SG_ASSIGN_OR_RETURN(std::string g, GraphParameterName(p.name));
    SG_ASSIGN_OR_RETURN(TensorSpec spec, ShardLayout(p.shape));
    for (const Slot& slot : kSlots) {
      requests.push_back({absl::StrCat(p.name, slot.suffix), spec});
      sources.push_back(slot.source(g));
    }
  }
  SG_ASSIGN_OR_RETURN(std::vector<NamedTensor> pieces, LoadShards(dir, options_.rank, requests));
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& piece = pieces[i].tensor;
    if (piece.dtype() != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", pieces[i].name, "' is ",
                                                     DTypeName(piece.dtype()), ", the trainer saves and expects F32"));
    }
    if (!distributed) {
      SG_RETURN_IF_ERROR(compiled_->Write(sources[i], piece.view()));
      continue;
    }
    SG_ASSIGN_OR_RETURN(TensorView held, compiled_->View(sources[i]));
    if (held.numel() != piece.numel()) {
      return absl::InternalError(absl::StrCat("per-shard checkpoint: rank ", options_.rank, " holds ", held.numel(),
                                              " elements of '", sources[i], "', the checkpoint gave ",
                                              piece.numel(), " for layout ", requests[i].spec.ToString()));
    }
    SG_RETURN_IF_ERROR(CopyTensor(Flat(piece.view()), Flat(held), compiled_->executor().compute_stream()));
  }
  if (distributed) SG_RETURN_IF_ERROR(compiled_->executor().Synchronize());
  return RestoreProgress(state);
}

}  // namespace sg::trainer
