// Collective bandwidth in nccl-tests conventions: size, time, algbw = size / time, and busbw =
// algbw x (2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for send/recv).
// Every rank runs every benchmark with fixed iteration counts (so the ranks stay in step); each
// reports its own time, and rank 0's line is the one to read.
//
// CPU, UCX ring all-reduce between local processes:
//   bazel build -c opt //comm:collectives_benchmark //comm:launch
//   bazel-bin/comm/launch --nproc=2 -- bazel-bin/comm/collectives_benchmark --benchmark_filter=Host
// GPU, one process per GPU (2 x H200): ring (NCCL P2P) vs NCCL native, 64 MiB - 1 GiB, and send/recv:
//   bazel-bin/comm/launch --nproc=2 -- bazel-bin/comm/collectives_benchmark --benchmark_filter=Device
// Device_Ipc* run the same collectives over CUDA IPC (ProcessGroupOptions::device_ipc; grid from
// SG_COMM_IPC_BLOCKS, all-gather copies by the copy engine with SG_COMM_IPC_COPY=ce).
// The device pipeline's chunking can be swept with SG_BENCH_CHUNK_MIB, SG_BENCH_MAX_CHUNK_MIB,
// SG_BENCH_CHUNKS and SG_BENCH_WINDOW (ProcessGroupOptions' device_* fields).
#include <cstdlib>
#include <memory>

#include "benchmark/benchmark.h"
#include "comm/nccl_transport.h"
#include "comm/process_group.h"
#include "comm/ucx_transport.h"
#include "kernels/core/device.h"
#include "kernels/core/status.h"
#include "kernels/core/tensor.h"

namespace sg::comm {
namespace {

struct World {
  absl::Status status;
  RankInfo info;
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<UcxTransport> ucx;
  std::unique_ptr<NcclTransport> nccl;
  std::unique_ptr<ProcessGroup> pg;
  std::unique_ptr<ProcessGroup> ipc;  // the same collectives over CUDA IPC (comm/ipc_ring.h)
  std::unique_ptr<Stream> stream;  // the "compute" stream device collectives are ordered against
};

World& GetWorld() {
  static World* w = [] {
    auto* w = new World();
    absl::StatusOr<RankInfo> info = RankInfoFromEnv();
    if (!info.ok()) {
      w->status = absl::FailedPreconditionError("run under `launch --nproc=N`");
      return w;
    }
    w->info = *info;
    absl::Time d = absl::Now() + absl::Seconds(60);
    auto run = [&]() -> absl::Status {
      SG_ASSIGN_OR_RETURN(w->rdzv, Rendezvous::Create(w->info, d));
      SG_ASSIGN_OR_RETURN(w->ucx, UcxTransport::Create(w->rdzv->store(), "bench", w->info.rank,
                                                       w->info.world_size, d));
      if (CudaDeviceCount() > 0) {
        Device dev = Device::Cuda(w->info.local_rank % CudaDeviceCount());
        SG_ASSIGN_OR_RETURN(w->nccl, NcclTransport::Create(w->rdzv->store(), "bench", w->info.rank,
                                                           w->info.world_size, dev, d));
        SG_ASSIGN_OR_RETURN(Stream s, Stream::Create(dev));
        w->stream = std::make_unique<Stream>(std::move(s));
      }
      ProcessGroupOptions opt;
      opt.track_progress = false;  // measure the algorithm, not the store round trip
      // Sweeps of the device pipeline (see ProcessGroupOptions), e.g. SG_BENCH_CHUNK_MIB=16.
      if (const char* v = std::getenv("SG_BENCH_CHUNK_MIB")) opt.device_chunk_bytes = std::atoll(v) << 20;
      if (const char* v = std::getenv("SG_BENCH_MAX_CHUNK_MIB")) opt.device_max_chunk_bytes = std::atoll(v) << 20;
      if (const char* v = std::getenv("SG_BENCH_CHUNKS")) opt.device_chunks = std::atoi(v);
      if (const char* v = std::getenv("SG_BENCH_WINDOW")) opt.device_window = std::atoi(v);
      opt.device_ipc = 0;
      SG_ASSIGN_OR_RETURN(w->pg, ProcessGroup::Create(&w->rdzv->store(), w->ucx.get(), w->nccl.get(),
                                                      "bench", opt));
      opt.device_ipc = 1;
      SG_ASSIGN_OR_RETURN(w->ipc, ProcessGroup::Create(&w->rdzv->store(), w->ucx.get(), w->nccl.get(),
                                                       "bench_ipc", opt));
      return absl::OkStatus();
    };
    w->status = run();
    return w;
  }();
  return *w;
}

// Point to point, every rank sending `size` bytes to the next rank and receiving `size` from the
// previous one (both directions of every link at once with 2 ranks), posted three ways:
//   kSendRecv        Recv, then Send, then Wait both (separate requests, as users write it);
//   kSendFirstRecv   Send, then Recv, then Wait both;
//   kSendRecvGrouped ProcessGroup::SendRecv (one call, one NCCL group);
// and kSendOneWay: even ranks send to the odd rank after them, which only receives (one direction).
enum Op { kAllReduce, kReduceScatter, kAllGather, kSendRecv, kSendFirstRecv, kSendRecvGrouped, kSendOneWay };

double BusFactor(Op op, int n) {
  switch (op) {
    case kAllReduce: return 2.0 * (n - 1) / n;
    case kReduceScatter:
    case kAllGather: return double(n - 1) / n;
    case kSendRecv:
    case kSendFirstRecv:
    case kSendRecvGrouped:
    case kSendOneWay: return 1.0;
  }
  return 1.0;
}

// One collective of `bytes` (the nccl-tests "size": the all-reduce buffer, the reduce-scatter
// input, the all-gather output).
absl::Status RunOnce(World& w, Op op, bool native, bool ipc, const Tensor& a, const Tensor& b,
                     const Stream& stream) {
  ProcessGroup& pg = ipc ? *w.ipc : *w.pg;
  const int n = pg.size();
  TensorView part(b.view().raw(), a.dtype(), {a.numel() / n}, a.device());
  switch (op) {
    case kAllReduce:
      return native ? pg.NativeAllReduce(a, ReduceOp::kSum, stream) : pg.AllReduce(a, ReduceOp::kSum, stream);
    case kReduceScatter:
      return native ? pg.NativeReduceScatter(a, part, ReduceOp::kSum, stream)
                    : pg.ReduceScatter(a, part, ReduceOp::kSum, stream);
    case kAllGather:
      return native ? pg.NativeAllGather(part, a, stream) : pg.AllGather(part, a, stream);
    case kSendRecv:
    case kSendFirstRecv:
    case kSendRecvGrouped: {
      int next = (pg.rank() + 1) % n, prev = (pg.rank() + n - 1) % n;
      Request r, s;
      if (op == kSendRecvGrouped) {
        SG_ASSIGN_OR_RETURN(auto both, pg.SendRecv(a, next, b, prev, 1, stream));
        s = std::move(both.first);
        r = std::move(both.second);
      } else if (op == kSendRecv) {
        SG_ASSIGN_OR_RETURN(r, pg.Recv(b, prev, 1));
        SG_ASSIGN_OR_RETURN(s, pg.Send(a, next, 1));
      } else {
        SG_ASSIGN_OR_RETURN(s, pg.Send(a, next, 1));
        SG_ASSIGN_OR_RETURN(r, pg.Recv(b, prev, 1));
      }
      absl::Time d = absl::Now() + absl::Seconds(60);
      SG_RETURN_IF_ERROR(s.Wait(d));
      return r.Wait(d);
    }
    case kSendOneWay: {
      const int me = pg.rank();
      absl::Time d = absl::Now() + absl::Seconds(60);
      if (me % 2 == 0 && me + 1 < n) {
        SG_ASSIGN_OR_RETURN(Request s, pg.Send(a, me + 1, 2));
        return s.Wait(d);
      }
      if (me % 2 == 1) {
        SG_ASSIGN_OR_RETURN(Request r, pg.Recv(b, me - 1, 2));
        return r.Wait(d);
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

void Bench(benchmark::State& state, Op op, bool device, bool native, bool ipc = false) {
  World& w = GetWorld();
  if (!w.status.ok()) {
    state.SkipWithError(std::string(w.status.message()).c_str());
    return;
  }
  if (device && w.nccl == nullptr) {
    state.SkipWithError("no CUDA device / NCCL");
    return;
  }
  const int64_t bytes = state.range(0);
  const int n = w.pg->size();
  const int64_t numel = bytes / 4 / n * n;
  Device dev = device ? w.nccl->device() : Device::Cpu();
  Tensor a = Tensor::Empty({numel}, DType::kF32, dev).value();
  Tensor b = Tensor::Empty({numel}, DType::kF32, dev).value();
  Stream cpu = Stream::Cpu();
  const Stream& stream = device ? *w.stream : cpu;
  if (!ZeroTensor(a, stream).ok() || !ZeroTensor(b, stream).ok()) {
    state.SkipWithError("could not initialise buffers");
    return;
  }
  // Point-to-point requests are not ordered after `stream`: let the zeroing finish first.
  if (device) (void)stream.Synchronize();
  // Warm-up (connections, NCCL channels, allocator), then time the iterations as a batch.
  for (int i = 0; i < 2; ++i) {
    absl::Status s = RunOnce(w, op, native, ipc, a, b, stream);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  if (device) (void)stream.Synchronize();
  for (auto _ : state) {
    absl::Time start = absl::Now();
    absl::Status s = RunOnce(w, op, native, ipc, a, b, stream);
    if (device && s.ok()) s = stream.Synchronize();
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    state.SetIterationTime(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (ipc && w.ipc->DeviceAlgorithm() != "ipc") {
    state.SkipWithError(w.ipc->DeviceAlgorithm().c_str());
    return;
  }
  const double size = double(numel) * 4;
  state.counters["size_B"] = size;
  state.counters["rank"] = w.info.rank;
  state.counters["algbw_GBps"] =
      benchmark::Counter(size * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["busbw_GBps"] = benchmark::Counter(
      size * BusFactor(op, n) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

// Fixed iteration counts keep every rank issuing the same collectives.
void HostSizes(benchmark::internal::Benchmark* b) {
  for (int64_t s = 4 << 10; s <= (64 << 20); s *= 4) b->Arg(s);
  b->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
}
void DeviceSizes(benchmark::internal::Benchmark* b) {
  for (int64_t s = int64_t(64) << 20; s <= (int64_t(1) << 30); s *= 2) b->Arg(s);
  b->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(Bench, Host_RingAllReduce, kAllReduce, false, false)->Apply(HostSizes);
BENCHMARK_CAPTURE(Bench, Host_RingReduceScatter, kReduceScatter, false, false)->Apply(HostSizes);
BENCHMARK_CAPTURE(Bench, Host_RingAllGather, kAllGather, false, false)->Apply(HostSizes);
BENCHMARK_CAPTURE(Bench, Host_SendRecv, kSendRecv, false, false)->Apply(HostSizes);

BENCHMARK_CAPTURE(Bench, Device_RingAllReduce, kAllReduce, true, false)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_NcclAllReduce, kAllReduce, true, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_RingReduceScatter, kReduceScatter, true, false)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_NcclReduceScatter, kReduceScatter, true, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_RingAllGather, kAllGather, true, false)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_NcclAllGather, kAllGather, true, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_IpcAllReduce, kAllReduce, true, false, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_IpcReduceScatter, kReduceScatter, true, false, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_IpcAllGather, kAllGather, true, false, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_IpcSendRecvGrouped, kSendRecvGrouped, true, false, true)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_SendRecv, kSendRecv, true, false)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_SendFirstRecv, kSendFirstRecv, true, false)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_SendRecvGrouped, kSendRecvGrouped, true, false)->Apply(DeviceSizes);
BENCHMARK_CAPTURE(Bench, Device_SendOneWay, kSendOneWay, true, false)->Apply(DeviceSizes);

}  // namespace
}  // namespace sg::comm
