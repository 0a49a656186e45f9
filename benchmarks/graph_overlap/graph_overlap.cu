#include "benchmarks/graph_overlap/graph_overlap.h"

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::benchmarks {
namespace {

// Busy for `ns` nanoseconds of the global timer (not SM cycles: the clock moves under a power
// limit), every thread doing arithmetic so the SM is occupied.
__global__ void SpinKernel(int64_t ns, float* sink) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  float x = float(threadIdx.x);
  do {
#pragma unroll 16
    for (int k = 0; k < 64; ++k) x = x * 1.0001f + 0.5f;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (int64_t(now - start) < ns);
  if (x == -1.f) *sink = x;  // never true: keeps the loop
}

// Reads the whole block (as an update reads a unit's gradients).
__global__ void TouchKernel(const float4* block, int64_t n4, float* sink) {
  float s = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = block[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) *sink = s;
}

struct Resources {
  cudaStream_t compute = nullptr, copy = nullptr, update = nullptr;
  std::vector<cudaEvent_t> copied, done;
  cudaEvent_t fork = nullptr, start = nullptr, end = nullptr;
  void* host = nullptr;
  void* slots = nullptr;
  float* sink = nullptr;
  int sms = 0;
  ~Resources() {
    for (cudaStream_t s : {compute, copy, update}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
    for (auto* v : {&copied, &done}) {
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : {fork, start, end}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (host != nullptr) cudaFreeHost(host);
    if (slots != nullptr) cudaFree(slots);
    if (sink != nullptr) cudaFree(sink);
  }
};

absl::Status Create(const OverlapProbe& p, Resources& r) {
  int device = 0, least = 0, greatest = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, device));
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  SG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
  SG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.copy, cudaStreamNonBlocking));
  SG_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&r.update, cudaStreamNonBlocking, p.priority ? greatest : least));
  for (auto* v : {&r.copied, &r.done}) {
    v->assign(size_t(p.copies), nullptr);
    for (cudaEvent_t& e : *v) SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r.fork, cudaEventDisableTiming));
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.start));
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.end));
  SG_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&r.host, size_t(p.copy_bytes), cudaHostAllocDefault));
  SG_CUDA_RETURN_IF_ERROR(cudaMalloc(&r.slots, size_t(p.slots * p.copy_bytes)));
  SG_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&r.sink), sizeof(float)));
  return absl::OkStatus();
}

// The copy chain, after the work already on the compute stream.
absl::Status EnqueueChain(const OverlapProbe& p, const Resources& r) {
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.fork, r.compute));
  SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.copy, r.fork, 0));
  SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.update, r.fork, 0));
  for (int j = 0; j < p.copies; ++j) {
    char* slot = static_cast<char*>(r.slots) + (j % p.slots) * p.copy_bytes;
    if (j >= p.slots) SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.copy, r.done[size_t(j - p.slots)], 0));
    SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot, r.host, size_t(p.copy_bytes), cudaMemcpyHostToDevice, r.copy));
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.copied[size_t(j)], r.copy));
    if (p.update_kernels) {
      cudaStream_t u = p.kernels_on_copy_stream ? r.copy : r.update;
      SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(u, r.copied[size_t(j)], 0));
      TouchKernel<<<unsigned(r.sms), 256, 0, u>>>(reinterpret_cast<const float4*>(slot), p.copy_bytes / 16, r.sink);
      SG_CUDA_RETURN_IF_LAUNCH_ERROR(TouchKernel);
      SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.done[size_t(j)], u));
    } else {
      SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.done[size_t(j)], r.copy));
    }
  }
  return absl::OkStatus();
}

// The compute stream's kernels, each block waited for before kernel 4 + 3 j, then the rest of the
// chain; `wait_flags` cudaEventWaitExternal when the chain is outside the captured graph.
absl::Status EnqueueCompute(const OverlapProbe& p, const Resources& r, unsigned wait_flags) {
  int next = 0;  // the next block a compute kernel waits for
  for (int i = 0; i < p.compute_kernels; ++i) {
    if (next < p.copies && i == 4 + 3 * next) {
      SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.compute, r.done[size_t(next)], wait_flags));
      ++next;
    }
    SpinKernel<<<unsigned(r.sms * 8), 256, 0, r.compute>>>(int64_t(p.kernel_us) * 1000, r.sink);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(SpinKernel);
  }
  // Joined: the compute stream waits for the rest of the chain (and so for both streams).
  for (; next < p.copies; ++next) {
    SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.compute, r.done[size_t(next)], wait_flags));
  }
  SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.compute, r.copied[size_t(p.copies - 1)], wait_flags));
  return absl::OkStatus();
}

// The work of one run, enqueued from the compute stream (capturable).
absl::Status Enqueue(const OverlapProbe& p, const Resources& r) {
  SG_RETURN_IF_ERROR(EnqueueChain(p, r));
  return EnqueueCompute(p, r, 0);
}

absl::StatusOr<double> Timed(const Resources& r, const std::function<absl::Status()>& run) {
  SG_RETURN_IF_ERROR(run());  // untimed
  SG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.compute));
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.start, r.compute));
  SG_RETURN_IF_ERROR(run());
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.end, r.compute));
  SG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.end));
  float ms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.end));
  return double(ms);
}

}  // namespace

absl::StatusOr<double> RunOverlapProbeCuda(const OverlapProbe& p) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("RunOverlapProbe: no CUDA device");
  }
  if (p.copies < 1 || p.compute_kernels < 1 || p.copy_bytes < 16 || p.copy_bytes % 16 != 0 || p.kernel_us < 1 ||
      p.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RunOverlapProbe: expected copies, compute_kernels, kernel_us >= 1 "
                                                   "and copy_bytes a positive multiple of 16, found ",
                                                   p.copies, ", ", p.compute_kernels, ", ", p.kernel_us, ", ",
                                                   p.copy_bytes));
  }
  Resources r;
  SG_RETURN_IF_ERROR(Create(p, r));
  if (!p.graph) return Timed(r, [&] { return Enqueue(p, r); });
  cudaGraph_t graph = nullptr;
  SG_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(r.compute, cudaStreamCaptureModeThreadLocal));
  const absl::Status st = p.chain_outside_graph ? EnqueueCompute(p, r, cudaEventWaitExternal) : Enqueue(p, r);
  const cudaError_t end = cudaStreamEndCapture(r.compute, &graph);
  SG_RETURN_IF_ERROR(st);
  SG_CUDA_RETURN_IF_ERROR(end);
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> graph_owner(graph, &cudaGraphDestroy);
  cudaGraphExec_t exec = nullptr;
  SG_CUDA_RETURN_IF_ERROR(
      cudaGraphInstantiateWithFlags(&exec, graph, p.priority ? cudaGraphInstantiateFlagUseNodePriority : 0));
  std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> exec_owner(exec, &cudaGraphExecDestroy);
  return Timed(r, [&]() -> absl::Status {
    if (p.chain_outside_graph) SG_RETURN_IF_ERROR(EnqueueChain(p, r));
    SG_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, r.compute));
    return absl::OkStatus();
  });
}

}  // namespace sg::benchmarks
