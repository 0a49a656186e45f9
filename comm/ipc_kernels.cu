// The kernels of the CUDA IPC collectives (ipc_kernels.h): cross-GPU signal/wait on counters, and
// the data movers that read a peer's memory directly (NVLink loads), reducing while they copy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "comm/ipc_kernels.h"
#include "kernels/core/status.h"

namespace sg::comm::ipc {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors per operand in flight per thread

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread: the signals, then the waits (the order that keeps a ring of waits from deadlocking:
// everyone has signalled before anyone waits).
__global__ void SyncKernel(SyncArgs a) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (*a.abort != 0) return;  // after a failure, peers must not be told that garbage is ready
  __threadfence_system();  // the stream's earlier kernels' writes, before any peer sees the signal
  for (int i = 0; i < a.nsignal; ++i) {
    const uint64_t c = *a.signal_count[i] + 1;
    *a.signal_count[i] = c;
    StoreRelease(a.signal_remote[i], c);
  }
  const uint64_t start = GlobalTimer();
  for (int i = 0; i < a.nwait; ++i) {
    const uint64_t want = *a.wait_count[i] + 1;
    *a.wait_count[i] = want;
    uint32_t backoff = 32;
    while (LoadAcquire(a.wait_flag[i]) < want) {
      const bool aborted = *a.abort != 0;
      if (aborted || int64_t(GlobalTimer() - start) > a.timeout_ns) {
        // First failure wins; the abort word stops every later wait of the group at once.
        if (atomicCAS(reinterpret_cast<unsigned long long*>(&a.error[0]), 0ull,
                      static_cast<unsigned long long>(aborted ? kAborted : kTimedOut)) == 0ull) {
          a.error[1] = a.seq;
          a.error[2] = a.wait_peer[i];
          a.error[3] = a.wait_slot[i];
        }
        *a.abort = 1;
        __threadfence_system();
        return;
      }
      __nanosleep(backoff);
      backoff = min(backoff * 2, 1024u);
    }
  }
}

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void FromF(float& d, float v) { d = v; }
__device__ __forceinline__ void FromF(__nv_bfloat16& d, float v) { d = __float2bfloat16(v); }

template <bool kMax>
__device__ __forceinline__ float Combine(float x, float y, float scale) {
  return (kMax ? fmaxf(x, y) : x + y) * scale;
}

template <typename T, bool kMax>
__device__ __forceinline__ uint4 CombineVec(uint4 x, const uint4& y, float scale) {
  constexpr int kVec = 16 / sizeof(T);
  T* px = reinterpret_cast<T*>(&x);
  const T* py = reinterpret_cast<const T*>(&y);
#pragma unroll
  for (int k = 0; k < kVec; ++k) FromF(px[k], Combine<kMax>(ToF(px[k]), ToF(py[k]), scale));
  return x;
}

// out = op(mine, theirs) * scale over 16-byte vectors (all pointers 16-byte aligned), then the tail
// elements. The peer's vectors are loaded with ld.global.cg (L2 only, never a stale L1 line), all
// kUnroll of them before any is used: NVLink latency is a microsecond, so loads must overlap.
template <typename T, bool kMax>
__global__ void __launch_bounds__(kThreads)
    PullReduceKernel(T* out, const T* mine, const T* theirs, int64_t n, float scale) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t vec_n = n / kVec;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const uint4* vm = reinterpret_cast<const uint4*>(mine);
  const uint4* vt = reinterpret_cast<const uint4*>(theirs);
  uint4* vo = reinterpret_cast<uint4*>(out);
  int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; v + (kUnroll - 1) * stride < vec_n; v += kUnroll * stride) {
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) y[u] = __ldcg(vt + v + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = vm[v + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) vo[v + u * stride] = CombineVec<T, kMax>(x[u], y[u], scale);
  }
  for (; v < vec_n; v += stride) vo[v] = CombineVec<T, kMax>(vm[v], __ldcg(vt + v), scale);
  for (int64_t i = vec_n * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    FromF(out[i], Combine<kMax>(ToF(mine[i]), ToF(__ldcg(theirs + i)), scale));
  }
}

// The same element by element, for pointers that are not 16-byte aligned; TOut is f32 or T (the
// widening reduce of bf16 inputs below).
template <typename T, bool kMax, typename TOut = T>
__global__ void __launch_bounds__(kThreads)
    PullReduceScalarKernel(TOut* out, const T* mine, const T* theirs, int64_t n, float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    FromF(out[i], Combine<kMax>(ToF(mine[i]), ToF(__ldcg(theirs + i)), scale));
  }
}

// out[i] = op(mine[i], theirs[i]) * scale with bf16 inputs and an f32 output: each 16-byte vector of
// 8 bf16 from either side (the peer's by ld.global.cg) becomes 8 f32 in two 16-byte stores. The
// bf16 values are summed in f32 and rounded once, to f32: FSDP2's f32 reduction of bf16 gradients,
// with bf16 on the wire. `out` and both inputs 16-byte aligned; the tail element by element.
template <bool kMax>
__global__ void __launch_bounds__(kThreads)
    PullReduceWidenKernel(float* out, const __nv_bfloat16* mine, const __nv_bfloat16* theirs, int64_t n, float scale) {
  constexpr int kVec = 8;
  const int64_t vec_n = n / kVec;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const uint4* vm = reinterpret_cast<const uint4*>(mine);
  const uint4* vt = reinterpret_cast<const uint4*>(theirs);
  float4* vo = reinterpret_cast<float4*>(out);
  auto combine = [scale](const uint4& x, const uint4& y, float4* o) {
    const __nv_bfloat16* px = reinterpret_cast<const __nv_bfloat16*>(&x);
    const __nv_bfloat16* py = reinterpret_cast<const __nv_bfloat16*>(&y);
    float r[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) r[k] = Combine<kMax>(ToF(px[k]), ToF(py[k]), scale);
    o[0] = make_float4(r[0], r[1], r[2], r[3]);
    o[1] = make_float4(r[4], r[5], r[6], r[7]);
  };
  int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; v + (kUnroll - 1) * stride < vec_n; v += kUnroll * stride) {
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) y[u] = __ldcg(vt + v + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = vm[v + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) combine(x[u], y[u], vo + 2 * (v + u * stride));
  }
  for (; v < vec_n; v += stride) combine(vm[v], __ldcg(vt + v), vo + 2 * v);
  for (int64_t i = vec_n * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = Combine<kMax>(ToF(mine[i]), ToF(__ldcg(theirs + i)), scale);
  }
}

__global__ void __launch_bounds__(kThreads) PullCopyKernel(uint4* out, const uint4* theirs, int64_t vec_n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; v + (kUnroll - 1) * stride < vec_n; v += kUnroll * stride) {
    uint4 y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) y[u] = __ldcg(theirs + v + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out[v + u * stride] = y[u];
  }
  for (; v < vec_n; v += stride) out[v] = __ldcg(theirs + v);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// One wave of `kernel` on the current device (occupancy x SMs), or `blocks` when set; never more
// blocks than there is work for.
template <auto kKernel>
absl::StatusOr<int> Grid(int blocks, int64_t work_items) {
  if (blocks <= 0) {
    static int wave = 0;  // per kernel; the devices of one job are alike
    if (wave == 0) {
      int dev = 0, sms = 0, per_sm = 0;
      SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
      SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      SG_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0));
      wave = std::max(1, sms * per_sm);
    }
    blocks = wave;
  }
  const int64_t needed = (work_items + kThreads - 1) / kThreads;
  return int(std::max<int64_t>(1, std::min<int64_t>(blocks, needed)));
}

template <typename T, bool kMax>
absl::Status PullReduceTyped(void* out, const void* mine, const void* theirs, int64_t n, float scale,
                             int blocks, cudaStream_t s) {
  T* o = static_cast<T*>(out);
  const T* m = static_cast<const T*>(mine);
  const T* t = static_cast<const T*>(theirs);
  if (Aligned16(out) && Aligned16(mine) && Aligned16(theirs)) {
    constexpr auto kKernel = PullReduceKernel<T, kMax>;
    SG_ASSIGN_OR_RETURN(int grid, Grid<kKernel>(blocks, n / (16 / int(sizeof(T))) + 1));
    PullReduceKernel<T, kMax><<<grid, kThreads, 0, s>>>(o, m, t, n, scale);
  } else {
    constexpr auto kKernel = PullReduceScalarKernel<T, kMax>;
    SG_ASSIGN_OR_RETURN(int grid, Grid<kKernel>(blocks, n));
    PullReduceScalarKernel<T, kMax><<<grid, kThreads, 0, s>>>(o, m, t, n, scale);
  }
  SG_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <bool kMax>
absl::Status PullReduceWidenTyped(float* out, const __nv_bfloat16* mine, const __nv_bfloat16* theirs, int64_t n,
                                  float scale, int blocks, cudaStream_t s) {
  if (Aligned16(out) && Aligned16(mine) && Aligned16(theirs)) {
    constexpr auto kKernel = PullReduceWidenKernel<kMax>;
    SG_ASSIGN_OR_RETURN(int grid, Grid<kKernel>(blocks, n / 8 + 1));
    PullReduceWidenKernel<kMax><<<grid, kThreads, 0, s>>>(out, mine, theirs, n, scale);
  } else {
    constexpr auto kKernel = PullReduceScalarKernel<__nv_bfloat16, kMax, float>;
    SG_ASSIGN_OR_RETURN(int grid, Grid<kKernel>(blocks, n));
    PullReduceScalarKernel<__nv_bfloat16, kMax, float><<<grid, kThreads, 0, s>>>(out, mine, theirs, n, scale);
  }
  SG_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchPullReduceWiden(ReduceOp op, float* out, const void* mine, const void* theirs, int64_t n,
                                   float scale, int blocks, void* stream) {
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const auto* m = static_cast<const __nv_bfloat16*>(mine);
  const auto* t = static_cast<const __nv_bfloat16*>(theirs);
  return op == ReduceOp::kMax ? PullReduceWidenTyped<true>(out, m, t, n, scale, blocks, s)
                              : PullReduceWidenTyped<false>(out, m, t, n, scale, blocks, s);
}

absl::Status LaunchSync(const SyncArgs& args, void* stream) {
  SyncKernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(args);
  SG_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchPullReduce(DType dtype, ReduceOp op, void* out, const void* mine, const void* theirs,
                              int64_t n, float scale, int blocks, void* stream) {
  if (n == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool max = op == ReduceOp::kMax;
  switch (dtype) {
    case DType::kF32:
      return max ? PullReduceTyped<float, true>(out, mine, theirs, n, scale, blocks, s)
                 : PullReduceTyped<float, false>(out, mine, theirs, n, scale, blocks, s);
    case DType::kBF16:
      return max ? PullReduceTyped<__nv_bfloat16, true>(out, mine, theirs, n, scale, blocks, s)
                 : PullReduceTyped<__nv_bfloat16, false>(out, mine, theirs, n, scale, blocks, s);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("ipc reduce: dtype must be f32 or bf16, found ", DTypeName(dtype)));
  }
}

absl::Status LaunchPullCopy(void* out, const void* theirs, int64_t bytes, int blocks, bool copy_engine,
                            void* stream) {
  if (bytes == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (copy_engine || !Aligned16(out) || !Aligned16(theirs) || bytes % 16 != 0) {
    SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, theirs, size_t(bytes), cudaMemcpyDeviceToDevice, s));
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(int grid, Grid<PullCopyKernel>(blocks, bytes / 16));
  PullCopyKernel<<<grid, kThreads, 0, s>>>(static_cast<uint4*>(out), static_cast<const uint4*>(theirs), bytes / 16);
  SG_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace sg::comm::ipc
