// ShardedDataParallelStep's memory: the sizes of its buffers (shared by Allocate and the
// planning-only PlanMemory) and the accounting of what lives in the arena.
#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compiler/fsdp.h"
#include "compiler/fsdp_internal.h"
#include "kernels/adamw/adamw.h"
#include "kernels/core/status.h"
#include "sharding/placement.h"

namespace sg::compiler {

std::string ShardedStepMemory::ToString() const {
  return absl::StrCat("arena ", arena_bytes, " + state ", state_bytes, " + shards ", shard_bytes, " + buckets ",
                      bucket_bytes, " + other ", other_bytes, " + comm scratch ", comm_scratch_bytes, " = ", Total(),
                      " bytes");
}

absl::StatusOr<ShardedStepMemory> ShardedDataParallelStep::PlanMemory(const graph::Graph& train,
                                                                      const CompileOptions& options, int shard_size,
                                                                      int shard_rank, int world_size) {
  if (shard_size < 1 || shard_rank < 0 || shard_rank >= shard_size || world_size < shard_size) {
    return absl::InvalidArgumentError(absl::StrCat("ShardedDataParallelStep::PlanMemory: expected 0 <= shard_rank < "
                                                   "shard_size <= world_size, found rank ", shard_rank, " of ",
                                                   shard_size, ", world ", world_size));
  }
  std::unique_ptr<ShardedDataParallelStep> s(new ShardedDataParallelStep());
  s->plan_only_ = true;
  s->shard_size_ = shard_size;
  s->shard_rank_ = shard_rank;
  s->world_size_ = world_size;
  SG_RETURN_IF_ERROR(s->Build(train, options));
  return s->memory_;
}

bool ShardedDataParallelStep::Direct(const Unit& u) const {
  if (u.params.size() > 1 && !per_parameter_collectives_) return false;
  for (int i : u.params) {
    const Param& p = *params_[size_t(i)];
    if (p.rows < shard_size_ || p.rows % shard_size_ != 0) return false;
  }
  return !u.params.empty();
}

absl::Status ShardedDataParallelStep::SizeBuffers() {
  const int P = shard_size_;
  shard_offsets_.clear();
  SG_RETURN_IF_ERROR(SizeParams());
  std::vector<int64_t> unit_base(units_.size(), 0);
  int64_t host_bytes = 0;
  int64_t shard_bytes = LayOutShards(&unit_base, &host_bytes);
  slots_offset_ = shard_bytes;
  SizeNormScratch();
  if (host_bytes > 0) shard_bytes += kHostGradientSlots * slot_bytes_;
  for (auto& p : params_) shard_offsets_.push_back(unit_base[size_t(p->unit)] + p->pack_offset * 4);
  int64_t packed = 0, block = 0, largest = 0;
  SizeStaging(&packed, &block, &largest);
  packed_ = TensorView(nullptr, DType::kF32, {packed}, program_->device);
  block_ = TensorView(nullptr, DType::kF32, {block}, program_->device);
  memory_ = ShardedStepMemory();
  memory_.arena_bytes = program_->plan.arena_bytes;
  memory_.arena_peak = FindArenaPeak(*program_);
  memory_.state_bytes = program_->state_bytes;
  memory_.shard_bytes = shard_bytes;
  memory_.host_gradient_bytes = host_bytes;
  memory_.bucket_bytes = AlignUp(std::max<int64_t>(packed, 1) * 4) + AlignUp(std::max<int64_t>(block, 1) * 4);
  memory_.other_bytes = ScalarBytes();
  PlanArenaPeaks();
  if (P > 1 && (program_->device.is_cpu() || P > 2)) memory_.comm_scratch_bytes = largest * 4;
  if (micro_batches_ > 1) AddMicroBatchInputs();
  return absl::OkStatus();
}

absl::Status ShardedDataParallelStep::SizeParams() {
  const int P = shard_size_;
  std::set<std::pair<int, bool>> seen;  // (unit, backward) whose gather dtype is set
  for (auto& p : params_) {
    const TensorView full = program_->sources.count(p->name) ? program_->sources.at(p->name)
                                                             : program_->sources.at(p->name + kBackwardSuffix);
    p->rows = full.shape().empty() ? 1 : full.shape()[0];
    p->row = p->rows == 0 ? 0 : full.numel() / p->rows;
    p->chunk = sharding::MaxChunk(p->rows, P);
    p->mine = sharding::Chunk(p->rows, P, shard_rank_);
    Unit& u = *units_[p->unit];
    // The gathered buffers: f32 (the master's dtype), or 16-bit (GatherInComputeDType), the same
    // for every parameter of a unit in one direction.
    for (const bool bwd : {false, true}) {
      auto src = program_->sources.find(bwd ? p->name + kBackwardSuffix : p->name);
      if (src == program_->sources.end()) continue;
      const DType t = src->second.dtype();
      DType& unit_dtype = bwd ? u.bwd_dtype : u.fwd_dtype;
      if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16) {
        return absl::UnimplementedError(absl::StrCat("sharded data parallel: parameter '", src->first, "' is ",
                                                     DTypeName(t), ", expected f32 (or gathered as bf16/f16)"));
      }
      if (!seen.insert({p->unit, bwd}).second && t != unit_dtype) {
        return absl::InternalError(absl::StrCat("sharded data parallel: unit '", u.name, "' mixes ",
                                                DTypeName(unit_dtype), " and ", DTypeName(t), " parameters ('",
                                                src->first, "'); one gather has one dtype"));
      }
      unit_dtype = t;
      (bwd ? p->full_bwd : p->full_fwd) = src->second;
    }
    p->grad_full = program_->outputs.at("grad:" + p->name);
    if (p->grad_full.dtype() != DType::kF32 && !(bf16_gradients_ && p->grad_full.dtype() == DType::kBF16)) {
      return absl::UnimplementedError(absl::StrCat("sharded data parallel: gradient of '", p->name, "' is ",
                                                   DTypeName(p->grad_full.dtype()), ", expected f32"));
    }
    // Each parameter's rows start 256-byte aligned inside the unit's block (kernels vectorize).
    p->pack_offset = u.block;
    u.block += AlignUp(p->chunk * p->row, kArenaAlignment / 4);
  }
  return absl::OkStatus();
}

int64_t ShardedDataParallelStep::LayOutShards(std::vector<int64_t>* unit_base, int64_t* host_bytes) {
  // The shards, unit by unit: four regions of the unit's block layout (this rank's parameter
  // rows, gradient, m, v), so the gradient region is what the unit's reduce-scatter produces. A
  // unit whose gradients wait on the host has three (rows, m, v); its reduce-scatter writes into a
  // slot after every unit's regions, and its region of the host buffer is one block.
  int64_t shard_bytes = 0;
  slot_bytes_ = 0;
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = *units_[k];
    (*unit_base)[k] = shard_bytes;
    shard_bytes += (u.host ? 3 : 4) * u.block * 4;
    if (!u.host) continue;
    u.host_offset = *host_bytes;
    *host_bytes += u.block * 4;
    slot_bytes_ = std::max(slot_bytes_, u.block * 4);
  }
  return shard_bytes;
}

void ShardedDataParallelStep::SizeNormScratch() {
  // The units' norms run on the comm stream, with their own scratch (GradNorm): the most chunks of
  // one unit's counted gradient shards.
  norm_scratch_ = 0;
  for (auto& u : units_) {
    int64_t chunks = 0;
    for (int i : u->params) {
      const Param& p = *params_[size_t(i)];
      if (p.mine.length == 0 || (layout_.counts_in_norm && !layout_.counts_in_norm(p.name))) continue;
      chunks += (p.mine.length * p.row + kernels::AdamWTensorList::kChunk - 1) / kernels::AdamWTensorList::kChunk;
    }
    norm_scratch_ = std::max(norm_scratch_, chunks);
  }
}

void ShardedDataParallelStep::SizeStaging(int64_t* packed, int64_t* block, int64_t* largest) const {
  const int P = shard_size_;
  // A Direct unit needs no packed staging. Block staging: for micro-batches after the first (they
  // add their reduce-scattered gradients to the shards), for an f32 gather's input, and for a
  // unit with a short (uneven) chunk on this rank; otherwise the reduce-scatter writes straight
  // into the gradient region.
  for (auto& u : units_) {
    if (!Direct(*u)) *packed = std::max(*packed, u->block * P);
    if (micro_batches_ > 1 || (!Direct(*u) && !ScatterIntoShards(*u))) *block = std::max(*block, u->block);
    if (!Direct(*u)) *largest = std::max(*largest, u->block * P);
    for (int i : u->params) {
      if (Direct(*u)) *largest = std::max(*largest, params_[size_t(i)]->rows * params_[size_t(i)]->row);
    }
  }
}

void ShardedDataParallelStep::PlanArenaPeaks() {
  // Inside the arena: the gathered parameters and the full unit gradients live at once, at their
  // busiest node (each from where the runtime issues it to its last reader).
  const int num_nodes = int(dp_.graph.nodes().size());
  std::vector<int64_t> gathered(size_t(num_nodes) + 2, 0), grads(size_t(num_nodes) + 2, 0);
  auto live = [&](std::vector<int64_t>& d, int from, int to, int64_t bytes) {
    if (from < 0 || from > num_nodes || to < from) return;
    d[size_t(from)] += bytes;
    d[size_t(std::min(to, num_nodes)) + 1] -= bytes;
  };
  for (auto& p : params_) {
    const Unit& u = *units_[p->unit];
    const int64_t bytes = p->rows * p->row * int64_t(SizeOf(p->grad_full.dtype()));  // f32, or bf16 gradients
    const int64_t fwd_bytes = p->rows * p->row * int64_t(SizeOf(u.fwd_dtype));
    const int64_t bwd_bytes = p->rows * p->row * int64_t(SizeOf(u.bwd_dtype));
    if (u.fwd_at != INT_MAX && p->fwd_last >= 0) live(gathered, u.fwd_at, p->fwd_last, fwd_bytes);
    if (u.bwd_at != INT_MAX && p->bwd_last >= 0) live(gathered, u.bwd_at, p->bwd_last, bwd_bytes);
    live(grads, p->grad_from, std::min(PerParameter(u) ? p->rs_wait_at : u.packed_at, num_nodes), bytes);
  }
  int64_t g_sum = 0, r_sum = 0;
  for (int i = 0; i <= num_nodes; ++i) {
    g_sum += gathered[size_t(i)];
    r_sum += grads[size_t(i)];
    memory_.gathered_peak_bytes = std::max(memory_.gathered_peak_bytes, g_sum);
    memory_.unit_grads_peak_bytes = std::max(memory_.unit_grads_peak_bytes, r_sum);
  }
}

void ShardedDataParallelStep::AddMicroBatchInputs() {
  for (const std::string& name : program_->input_names) {
    if (name == kLossScaleName) continue;
    const TensorView& micro = program_->sources.at(name);
    memory_.other_bytes += AlignUp(micro.numel() * int64_t(SizeOf(micro.dtype())) * micro_batches_);
  }
}

bool ShardedDataParallelStep::PerParameter(const Unit& u) const { return per_parameter_collectives_ && Direct(u); }

bool ShardedDataParallelStep::ScatterIntoShards(const Unit& u) const {
  if ((u.fwd_at != INT_MAX && u.fwd_dtype == DType::kF32) || (u.bwd_at != INT_MAX && u.bwd_dtype == DType::kF32)) {
    return false;  // its gathers stage this rank's rows in the block
  }
  for (int i : u.params) {
    if (params_[size_t(i)]->mine.length != params_[size_t(i)]->chunk) return false;
  }
  return true;
}

int64_t ShardedDataParallelStep::ScalarBytes() const {
  const int64_t P = NormRanks(), W = world_size_, K = micro_batches_;
  // lr, counter (i64), local norm, P norms (of the norm group), norm, clip, world losses (per
  // micro-batch), 3 dummies of P, this rank's micro-batch losses, its loss seeds per micro-batch.
  const int64_t slots[] = {1, 2, 1, P, 1, 1, W * K, P, P, P, K, K};
  int64_t total = 0;
  for (int64_t n : slots) total += AlignUp(n * 4);
  if (Deferred()) {
    // The deferred optimizer: the kept learning rate, the units' norms, 3 dummies of as many, the
    // units' step counters (i64), the norms' scratch.
    const int64_t U = int64_t(units_.size());
    for (int64_t n : {int64_t(1), U, U, U, U, 2 * U, std::max<int64_t>(norm_scratch_, 1)}) total += AlignUp(n * 4);
  }
  return total;
}

}  // namespace sg::compiler
