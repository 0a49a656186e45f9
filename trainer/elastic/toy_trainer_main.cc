// toy_trainer: a deterministic stand-in for a training loop, used to test elastic recovery end to
// end (kill a rank, restart with fewer, reload the sharded checkpoint, continue) without a model.
//
//   launch --nproc=4 --max_restarts=1 -- toy_trainer --ckpt_dir=/tmp/run --steps=30 --every=5
//
// State: a parameter vector P of --size floats, sharded S(0) over the ranks. Step t: every rank
// computes a gradient over its share of --samples samples (sample k belongs to rank k % world),
// integer-valued so that the all-reduced sum is exact in f32 whatever the world size; then each
// rank updates its own shard elementwise, P = 0.875 P + G / 1024. Hence the state after step t is
// bit-for-bit the same for any world size and any restart history: ExpectedState() below is the
// single-process reference the tests compare against.
//
// Every --every steps all ranks write a sharded checkpoint (step directories under --ckpt_dir);
// on start the newest one is loaded, resharded onto the current world size. --kill_rank/--kill_step
// make that rank SIGKILL itself in the middle of that step, between its two all-reduces (first
// attempt only).
// Rank 0 prints "step <t> loss <mean P^2>" after each step and "resumed from step <s> on <n> ranks".
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "comm/health.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/ucx_transport.h"
#include "kernels/core/status.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/sharded.h"
#include "trainer/elastic/toy_model.h"

ABSL_FLAG(std::string, ckpt_dir, "", "directory of the sharded step checkpoints (required)");
ABSL_FLAG(int64_t, steps, 30, "steps to train");
ABSL_FLAG(int64_t, every, 5, "checkpoint every N steps (>= 1)");
ABSL_FLAG(int64_t, size, 1000, "parameters (>= 1)");
ABSL_FLAG(int64_t, samples, 24, "samples per step");
ABSL_FLAG(int, kill_rank, -1, "this rank SIGKILLs itself in --kill_step (first attempt only; -1: none)");
ABSL_FLAG(int64_t, kill_step, -1, "the step --kill_rank dies in");

namespace sg::trainer {
namespace {

struct Flags {
  std::string ckpt_dir;
  int64_t steps = 30, every = 5, size = 1000, samples = 24;
  int kill_rank = -1;
  int64_t kill_step = -1;
};

absl::Status Run(const Flags& f) {
  SG_ASSIGN_OR_RETURN(comm::RankInfo info, comm::RankInfoFromEnv());
  const int world = info.world_size, me = info.rank;
  const char* restart_env = std::getenv("SG_RESTART_COUNT");
  const std::string restart = restart_env ? restart_env : "0";
  absl::Time d = absl::Now() + absl::Seconds(30);
  SG_ASSIGN_OR_RETURN(auto rdzv, comm::Rendezvous::Create(info, d));
  SG_ASSIGN_OR_RETURN(auto ucx, comm::UcxTransport::Create(rdzv->store(), "toy", me, world, d));
  comm::ProcessGroupOptions pgo;
  pgo.timeout = absl::Seconds(30);
  SG_ASSIGN_OR_RETURN(auto pg, comm::ProcessGroup::Create(&rdzv->store(), ucx.get(), nullptr, "world", pgo));
  comm::HealthOptions ho;
  ho.interval = absl::Milliseconds(200);
  ho.deadline = absl::Seconds(3);
  ho.on_failure = [](const comm::RankFault& fault) { std::cerr << "health: " << fault.ToString() << "\n"; };
  SG_ASSIGN_OR_RETURN(auto health, comm::HealthMonitor::Start(info, ho));

  SG_ASSIGN_OR_RETURN(sharding::DeviceMesh mesh, sharding::DeviceMesh::Create({"dp"}, {world}));
  SG_ASSIGN_OR_RETURN(sharding::TensorSpec spec,
                      sharding::TensorSpec::Create(mesh, {sharding::Placement::Shard(0)}, {f.size}));
  const int64_t offset = spec.LocalOffsets(me)[0];
  Tensor p;
  int64_t step = 0;
  absl::StatusOr<std::string> latest = FindLatestShardedCheckpoint(f.ckpt_dir);
  if (latest.ok()) {
    SG_ASSIGN_OR_RETURN(std::vector<NamedTensor> loaded, LoadShards(*latest, me, {{"P", spec}}));
    SG_ASSIGN_OR_RETURN(ShardedManifest m, ReadShardedManifest(*latest));
    p = std::move(loaded[0].tensor);
    step = m.step;
    if (me == 0) {
      std::cout << "resumed from step " << step << " on " << world << " ranks (saved on "
                << m.mesh.size() << ", restart " << restart << ")" << std::endl;
    }
  } else {
    SG_ASSIGN_OR_RETURN(p, Tensor::Empty(spec.LocalShape(me), DType::kF32, Device::Cpu()));
    for (int64_t i = 0; i < p.numel(); ++i) p.data<float>()[i] = ToyInit(offset + i);
  }

  SG_ASSIGN_OR_RETURN(Tensor g, Tensor::Empty({f.size}, DType::kF32, Device::Cpu()));
  SG_ASSIGN_OR_RETURN(Tensor loss, Tensor::Empty({1}, DType::kF32, Device::Cpu()));
  while (step < f.steps) {
    const int64_t t = step + 1;
    ToyGradient(t, f.samples, me, world, g.data<float>(), f.size);
    SG_RETURN_IF_ERROR(pg->AllReduce(g, comm::ReduceOp::kSum));
    if (me == f.kill_rank && t == f.kill_step && restart == "0") {
      // Between the step's two all-reduces: the other ranks wait in the second one for this rank,
      // so none finishes the step. (A timer 2 ms into the step used to land inside the first
      // all-reduce, until host collectives took microseconds instead of milliseconds.)
      ::raise(SIGKILL);
    }
    ToyUpdate(p.data<float>(), g.data<float>() + offset, p.numel());
    double local = 0;
    for (int64_t i = 0; i < p.numel(); ++i) local += double(p.data<float>()[i]) * p.data<float>()[i];
    loss.data<float>()[0] = float(local / double(f.size));
    SG_RETURN_IF_ERROR(pg->AllReduce(loss, comm::ReduceOp::kSum));
    step = t;
    if (me == 0) std::cout << "step " << step << " loss " << loss.data<float>()[0] << std::endl;
    if (step % f.every == 0 || step == f.steps) {
      // Every rank writes its shard; rank 0 commits once all records are in the store.
      const std::string dir = StepDir(f.ckpt_dir, step);
      const std::string staging = StagingDir(dir, restart);
      SG_ASSIGN_OR_RETURN(ShardRecord rec, WriteShard(staging, me, step, {{"P", spec, p}}));
      const std::string key = absl::StrCat("ckpt/", step, "/");
      absl::Time cd = absl::Now() + absl::Seconds(30);
      SG_RETURN_IF_ERROR(rdzv->store().Set(absl::StrCat(key, "rank/", me), rec.ToJson(), cd));
      if (me == 0) {
        std::vector<ShardRecord> records;
        for (int r = 0; r < world; ++r) {
          SG_ASSIGN_OR_RETURN(std::string text, rdzv->store().Get(absl::StrCat(key, "rank/", r), cd));
          SG_ASSIGN_OR_RETURN(ShardRecord other, ShardRecord::FromJson(text));
          records.push_back(std::move(other));
        }
        SG_RETURN_IF_ERROR(CommitShardedCheckpoint(staging, dir, step, records,
                                                   {{"restart", restart}}));
        SG_RETURN_IF_ERROR(rdzv->store().Set(key + "done", "1", cd));
        std::cout << "checkpoint step " << step << std::endl;
      } else {
        SG_RETURN_IF_ERROR(rdzv->store().Get(key + "done", cd).status());
      }
    }
  }
  SG_RETURN_IF_ERROR(health->Stop(absl::Now() + absl::Seconds(10)));
  return rdzv->Finalize(absl::Now() + absl::Seconds(30));
}

}  // namespace
}  // namespace sg::trainer

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A deterministic toy training loop for elastic-recovery tests.\n"
      "  toy_trainer --ckpt_dir=D [--steps=30 --every=5 --size=1000 --samples=24 --kill_rank=R --kill_step=T]");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "toy_trainer: expected only --flag=value arguments, found '" << rest[1] << "'\n";
    return 2;
  }
  sg::trainer::Flags f;
  f.ckpt_dir = absl::GetFlag(FLAGS_ckpt_dir);
  f.steps = absl::GetFlag(FLAGS_steps);
  f.every = absl::GetFlag(FLAGS_every);
  f.size = absl::GetFlag(FLAGS_size);
  f.samples = absl::GetFlag(FLAGS_samples);
  f.kill_rank = absl::GetFlag(FLAGS_kill_rank);
  f.kill_step = absl::GetFlag(FLAGS_kill_step);
  if (f.ckpt_dir.empty()) {
    std::cerr << "toy_trainer: --ckpt_dir is required\n";
    return 2;
  }
  if (f.every < 1 || f.size < 1) {
    std::cerr << "toy_trainer: --every and --size: expected >= 1, found " << f.every << " and " << f.size << "\n";
    return 2;
  }
  absl::Status s = sg::trainer::Run(f);
  if (!s.ok()) {
    std::cerr << "toy_trainer: " << s << "\n";
    return 1;
  }
  return 0;
}
