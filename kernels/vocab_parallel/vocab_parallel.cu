// CUDA vocabulary-parallel kernels, on one stream, no host synchronization:
//   ShiftIdsKernel  ids into this shard's rows (others -1) for kernels/embedding;
//   StatsKernel     one block per token row: local max, then sum of exp(x - max), the target logit;
//   CountKernel     valid = targets != ignore_index (one block, fixed order);
//   RowKernel       one block per row: combines the T gathered triples, writes the row loss to a
//                   scratch f32 [rows] and dlogits from the row (read, then written: may alias);
//   SumKernel       loss = sum of row losses in row order (f64) / valid: deterministic.
// The rows are re-read rather than held in registers: the vocabulary shard is V/T wide and this
// path runs once per step (no measured variant yet; see kernels/cross_entropy for the tuned one).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/vocab_parallel/vocab_parallel_internal.h"

namespace sg::kernels::vocab_parallel_internal {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// Block-wide reduction over kThreads threads; every thread gets the result.
template <bool kMax>
__device__ float BlockReduce(float v, float* smem) {
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // smem may still be read by a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float r = kMax ? -INFINITY : 0.f;
  for (int k = 0; k < kThreads / 32; ++k) r = kMax ? fmaxf(r, smem[k]) : r + smem[k];
  return r;
}

template <typename I>
__global__ void ShiftIdsKernel(int64_t n, const I* ids, int64_t start, int64_t local_vocab, int32_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t v = int64_t(ids[i]) - start;
  out[i] = v >= 0 && v < local_vocab ? int32_t(v) : -1;
}

template <typename T, typename I>
__global__ void StatsKernel(CeProblem p, const T* logits, const I* targets, float* stats) {
  __shared__ float smem[kThreads / 32];
  const int64_t r = blockIdx.x;
  const T* x = logits + r * p.local_vocab;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < p.local_vocab; j += kThreads) m = fmaxf(m, Load(x, j));
  m = BlockReduce<true>(m, smem);
  float s = 0.f;
  if (m > -INFINITY) {
    for (int64_t j = threadIdx.x; j < p.local_vocab; j += kThreads) s += __expf(Load(x, j) - m);
  }
  s = BlockReduce<false>(s, smem);
  if (threadIdx.x == 0) {
    const int64_t local = int64_t(targets[r]) - p.vocab_start;
    stats[r] = m;
    stats[p.rows + r] = s;
    stats[2 * p.rows + r] = local >= 0 && local < p.local_vocab ? Load(x, local) : 0.f;
  }
}

template <typename I>
__global__ void CountKernel(int64_t rows, const I* targets, int64_t ignore, int32_t* valid) {
  int count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) count += int64_t(targets[r]) != ignore;
  __shared__ int smem[kThreads];
  smem[threadIdx.x] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int k = 0; k < kThreads; ++k) total += smem[k];
    *valid = total;
  }
}

template <typename T, typename I>
__global__ void RowKernel(CeProblem p, const T* logits, const I* targets, const float* gathered, const float* dloss,
                          const int32_t* valid, float* row_loss, T* dlogits) {
  const int64_t r = blockIdx.x;
  float m = -INFINITY, s = 0.f, t = 0.f;
  for (int64_t k = 0; k < p.ranks; ++k) m = fmaxf(m, gathered[(k * 3) * p.rows + r]);
  for (int64_t k = 0; k < p.ranks; ++k) {
    const float mk = gathered[(k * 3) * p.rows + r];
    if (mk > -INFINITY) s += gathered[(k * 3 + 1) * p.rows + r] * __expf(mk - m);
    t += gathered[(k * 3 + 2) * p.rows + r];
  }
  const float lse = m + logf(s);
  const int64_t target = int64_t(targets[r]);
  const bool ignored = target == p.ignore_index;
  if (threadIdx.x == 0) row_loss[r] = ignored ? 0.f : lse - t;
  if (dlogits == nullptr) return;
  const float scale = *valid > 0 ? (dloss != nullptr ? *dloss : 1.f) / float(*valid) : 0.f;
  const T* x = logits + r * p.local_vocab;
  T* g = dlogits + r * p.local_vocab;
  for (int64_t j = threadIdx.x; j < p.local_vocab; j += kThreads) {
    const float soft = __expf(Load(x, j) - lse);
    const float hot = p.vocab_start + j == target ? 1.f : 0.f;
    Store(g, j, ignored ? 0.f : scale * (soft - hot));
  }
}

__global__ void SumKernel(int64_t rows, const float* row_loss, const int32_t* valid, float* loss) {
  if (threadIdx.x != 0) return;
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum += row_loss[r];
  *loss = *valid > 0 ? float(sum / double(*valid)) : 0.f;
}

template <typename T, typename I>
absl::Status Stats(const CeProblem& p, const void* logits, const void* targets, float* stats, cudaStream_t s) {
  if (p.rows == 0) return absl::OkStatus();
  StatsKernel<T, I><<<unsigned(p.rows), kThreads, 0, s>>>(p, static_cast<const T*>(logits),
                                                          static_cast<const I*>(targets), stats);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(StatsKernel);
  return absl::OkStatus();
}

template <typename T, typename I>
absl::Status Finish(const CeProblem& p, const void* logits, const void* targets, const float* gathered,
                    const float* dloss, float* loss, void* dlogits, float* row_loss, int32_t* valid, cudaStream_t s) {
  const I* t = static_cast<const I*>(targets);
  CountKernel<I><<<1, kThreads, 0, s>>>(p.rows, t, p.ignore_index, valid);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(CountKernel);
  if (p.rows > 0) {
    RowKernel<T, I><<<unsigned(p.rows), kThreads, 0, s>>>(p, static_cast<const T*>(logits), t, gathered, dloss, valid,
                                                          row_loss, static_cast<T*>(dlogits));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(RowKernel);
  }
  SumKernel<<<1, 32, 0, s>>>(p.rows, row_loss, valid, loss);
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(SumKernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status ShiftIdsCuda(int64_t tokens, bool i64, const void* ids, int64_t vocab_start, int64_t local_vocab,
                          int32_t* local, void* stream) {
  if (tokens == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = unsigned((tokens + kThreads - 1) / kThreads);
  if (i64) {
    ShiftIdsKernel<<<blocks, kThreads, 0, s>>>(tokens, static_cast<const int64_t*>(ids), vocab_start, local_vocab, local);
  } else {
    ShiftIdsKernel<<<blocks, kThreads, 0, s>>>(tokens, static_cast<const int32_t*>(ids), vocab_start, local_vocab, local);
  }
  SG_CUDA_RETURN_IF_LAUNCH_ERROR(ShiftIdsKernel);
  return absl::OkStatus();
}

absl::Status StatsCuda(const CeProblem& p, const void* logits, const void* targets, float* stats, int device,
                       void* stream) {
  (void)device;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBF16) {
    if (p.targets_i64) return Stats<__nv_bfloat16, int64_t>(p, logits, targets, stats, s);
    return Stats<__nv_bfloat16, int32_t>(p, logits, targets, stats, s);
  }
  if (p.targets_i64) return Stats<float, int64_t>(p, logits, targets, stats, s);
  return Stats<float, int32_t>(p, logits, targets, stats, s);
}

absl::Status FinishCuda(const CeProblem& p, const void* logits, const void* targets, const float* gathered,
                        const float* dloss, float* loss, void* dlogits, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate((p.rows + 1) * int64_t(sizeof(float))));
  float* row_loss = static_cast<float*>(scratch);
  int32_t* valid = reinterpret_cast<int32_t*>(row_loss + p.rows);
  auto run = [&]() -> absl::Status {
    if (p.dtype == DType::kBF16) {
      if (p.targets_i64) {
        return Finish<__nv_bfloat16, int64_t>(p, logits, targets, gathered, dloss, loss, dlogits, row_loss, valid, s);
      }
      return Finish<__nv_bfloat16, int32_t>(p, logits, targets, gathered, dloss, loss, dlogits, row_loss, valid, s);
    }
    if (p.targets_i64) return Finish<float, int64_t>(p, logits, targets, gathered, dloss, loss, dlogits, row_loss, valid, s);
    return Finish<float, int32_t>(p, logits, targets, gathered, dloss, loss, dlogits, row_loss, valid, s);
  };
  const absl::Status st = run();
  alloc->Free(scratch);  // reused only by later work on the same stream
  return st;
}

}  // namespace sg::kernels::vocab_parallel_internal
