// The CUDA RMSNorm kernels, shared by plain RMSNorm (kernels/rmsnorm) and the fused residual add +
// RMSNorm (kernels/add_rmsnorm): one forward and one backward kernel template, the add / residual
// term switched on at compile time, and their launchers. Include only from nvcc-compiled files; the
// LaunchConfig struct is plain C++ so benchmarks and tests can pass one through *_internal.h.
//
//   rmsnorm_launch::LaunchConfig cfg;  // the measured defaults
//   SG_RETURN_IF_ERROR((rmsnorm_launch::Forward<__nv_bfloat16, /*kAdd=*/false>(cfg, rows, dim, eps,
//                           x, nullptr, w, nullptr, y, rstd, stream)));
//
// Layout (fast path: dim a multiple of 8 and every pointer 16-byte aligned). A CTA of up to
// `max_threads` threads owns whole rows: thread t holds the 8-element packs t, t + threads, ... of a
// row (kV of them), moved with 16-byte accesses, so each warp-wide access is coalesced. A CTA works on
// `rows_per_step` rows at a time: all their loads are issued together (bytes in flight), then one
// block reduction (warp shuffles, one shared-memory exchange) serves all of them. The weight row
// stays in registers for the CTA's lifetime, since a thread always owns the same columns.
// Backward: each CTA sums the weight gradient of one contiguous run of rows in f32 registers and
// writes one partial row; a second kernel sums the partial rows in a fixed order. Deterministic, no
// atomics; by default the grid is as many CTAs as are resident at once (no tail wave), which also
// keeps the partial rows to a few MB (16384 x 2048 bf16: 2 CTAs per SM, 2 MiB of partials).
// Other shapes take a simple block-per-row path. (A backward streaming each CTA's rows through a
// cp.async shared-memory ring of 2-4 slots was measured on the H200 on 2026-11-30 and removed:
// 3.16-3.32 TB/s against 3.42 for BackwardKernel at 16384 x 2048 bf16, add+RMSNorm 3.50-3.64
// against 3.64.)
#ifndef SGTRAIN_KERNELS_RMSNORM_RMSNORM_LAUNCH_H_
#define SGTRAIN_KERNELS_RMSNORM_RMSNORM_LAUNCH_H_

#include <cstdint>
#include <string>

namespace sg::kernels::rmsnorm_launch {

// How the kernels are laid out on the GPU. The defaults are the production choice; the benchmarks
// sweep the others (rmsnorm_benchmark --benchmark_filter=Sweep). Values are clamped to what the
// kernels support, so any positive values are valid.
struct LaunchConfig {
  // The backward's shape: the H200 sweep of 2026-11-30 at 16384 x 2048 bf16 put 128 threads and
  // one row per step first (2.89 TB/s vs 2.73 at 256 x 4; add+RMSNorm 3.01 vs 2.96).
  int max_threads = 128;    // threads per CTA at most (32..512); a row's packs are spread over them
  int rows_per_step = 1;    // rows in flight per CTA step (1, 2 or 4; fewer for f32 / wide rows)
  int fwd_ctas_per_sm = 0;  // forward grid: 0 = one CTA per step of rows, n = n persistent CTAs/SM
  // Backward grid (and number of partial weight-gradient rows) per SM: 0 = as many CTAs as are
  // resident at once (one wave, no tail), n = n per SM (more than fit: several waves).
  int bwd_ctas_per_sm = 0;
  // Backward: launch the partial-row sum with programmatic dependent launch (it is scheduled while
  // the main kernel runs and waits on griddepcontrol.wait), hiding its launch latency. Off until the
  // GPU run shows it helps and that CUDA-graph capture of it works there.
  bool overlap_sum = true;
  // The forward's own pair: the H200 sweep of 2026-11-30 at 16384 x 2048 bf16 put 128 threads and
  // one row per step first for both rmsnorm (3.34 TB/s vs 3.16 at 256 x 4) and add+rmsnorm (3.49).
  int fwd_max_threads = 128;
  int fwd_rows_per_step = 1;
  // Register double buffering: a CTA issues the loads of its next rows before it reduces and stores
  // the current ones, so its loads stay in flight across the block reduction (with few CTAs per SM,
  // e.g. the backward's single resident wave, the latency of each step is otherwise exposed). The
  // forward prefetches only with persistent CTAs (fwd_ctas_per_sm > 0).
  bool fwd_prefetch = false;
  bool bwd_prefetch = false;
  // Launch the forward / the backward's main kernel as a programmatic dependent of the previous
  // kernel on the stream: it is scheduled while that kernel drains and waits for it with
  // griddepcontrol.wait before touching memory, so the gap between the two kernels disappears.
  // H200, 16384 x 2048 bf16, batch timing (2026-11-30): forward 3.47 -> 3.60 TB/s (a copy of the
  // same bytes: 3.54), add+RMSNorm forward 3.63 -> 3.72. The partial-row sum as a dependent
  // (overlap_sum): backward 2.99 -> 3.04, add+RMSNorm 3.21 -> 3.26; the main kernel too
  // (bwd_pdl): 3.05 -> 3.12, add+RMSNorm 3.23 -> 3.31. CUDA-graph capture keeps these launches
  // (compile_test, llama_step_test, dist_cuda_graph_test passed on the H200s with them).
  bool fwd_pdl = true;
  bool bwd_pdl = true;

  // The configuration the forward's shape is chosen from.
  LaunchConfig ForwardConfig() const {
    LaunchConfig c = *this;
    c.max_threads = fwd_max_threads;
    c.rows_per_step = fwd_rows_per_step;
    return c;
  }

  std::string ToString() const {
    return "threads<=" + std::to_string(max_threads) + " rows/step=" + std::to_string(rows_per_step) +
           " fwd threads<=" + std::to_string(fwd_max_threads) + " rows/step=" + std::to_string(fwd_rows_per_step) +
           " fwd_ctas/sm=" + std::to_string(fwd_ctas_per_sm) + " bwd_ctas/sm=" + std::to_string(bwd_ctas_per_sm) +
           (overlap_sum ? " overlap_sum" : "") + (fwd_prefetch ? " fwd_prefetch" : "") +
           (bwd_prefetch ? " bwd_prefetch" : "") + (fwd_pdl ? " fwd_pdl" : "") + (bwd_pdl ? " bwd_pdl" : "");
  }
};

// The plain RMSNorm backward's launch (RmsNormBackward; add+RMSNorm keeps LaunchConfig's defaults):
// rows of at most 2048 16-bit elements go two rows a step with register prefetch. H200, batch
// timing, 16384 x 2048 bf16: 3.51 and 3.53 TB/s in two calls (2026-11-30) vs 3.42-3.43 for one row
// a step; at 8192 x 4096 the same shape falls to 2.79 (one row a step: 3.39), and add+RMSNorm with
// prefetch falls to 3.07 (vs 3.64), so neither takes it.
inline LaunchConfig PlainBackwardConfig(int64_t dim, int64_t elem_bytes) {
  LaunchConfig c;
  if (elem_bytes == 2 && dim <= 2048) {
    c.rows_per_step = 2;
    c.bwd_prefetch = true;
  }
  return c;
}

}  // namespace sg::kernels::rmsnorm_launch

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "absl/status/status.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/elementwise/cuda_vec.h"

namespace sg::kernels::rmsnorm_launch {
namespace detail {

using cuda_vec::Pack8;
using cuda_vec::PackRounded;
using cuda_vec::Raw8;
using cuda_vec::Unpack;
using cuda_vec::WarpSum;

// Every activation is read exactly once (cuda_vec::LoadRawOnce).
template <typename T>
__device__ __forceinline__ Raw8<T> LoadOnce(const T* p) {
  return cuda_vec::LoadRawOnce(p);
}
template <typename T>
__device__ __forceinline__ void Store(T* p, const Raw8<T>& r) {
  cuda_vec::StoreRaw(p, r);
}

constexpr int kMaxThreads = 512;  // __launch_bounds__: leaves the compiler 128 registers a thread

// Sums v[r] over the CTA for each r; every thread gets the totals, summed in a fixed order (warp
// butterflies, then warps 0, 1, ...), so results do not depend on scheduling. `scratch` must not be
// the buffer the previous call used (callers alternate two), which saves a second barrier.
template <int kR>
__device__ __forceinline__ void BlockSumRows(float (&v)[kR], float (*scratch)[32]) {
#pragma unroll
  for (int r = 0; r < kR; ++r) v[r] = WarpSum(v[r]);
  const int warps = int(blockDim.x) / 32;
  if (warps == 1) return;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) scratch[r][threadIdx.x / 32] = v[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    float s = 0.f;
    for (int i = 0; i < warps; ++i) s += scratch[r][i];
    v[r] = s;
  }
}

// y = h * rstd * w with h = x (kAdd false) or h = round(x + delta) also written out (kAdd true).
// y null: h and rstd only (w unused), for a consumer that applies the norm itself.
// x may equal h (in-place residual update), so neither is __restrict__. kPrefetch: the next step's
// rows are loaded before this step's are reduced and stored (rows differ, so in place is safe).
template <typename T, int kV, int kR, bool kAdd, bool kPrefetch>
__global__ void __launch_bounds__(kMaxThreads)
    ForwardKernel(const T* x, const T* __restrict__ delta, const T* __restrict__ w, T* h, T* __restrict__ y,
                  float* __restrict__ rstd, int64_t rows, int packs, float eps) {
  // Launched as a programmatic dependent (LaunchConfig::fwd_pdl): wait until the previous grid has
  // completed and its writes are visible, then let the next one be scheduled. No-ops otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  __shared__ float scratch[2][kR][32];
  const int dim = packs * 8;
  float wv[kV][8];
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const int p = int(threadIdx.x) + int(blockDim.x) * j;
    if (p < packs && y != nullptr) {
      Pack8<T>::Load(w + p * 8, wv[j]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) wv[j][k] = 0.f;
    }
  }
  constexpr int kD = kAdd ? kR : 1;
  constexpr int kDV = kAdd ? kV : 1;
  // Loads rows row0 .. row0 + kR - 1 (those that exist) into registers.
  auto load = [&](int64_t row0, Raw8<T> (&hr)[kR][kV], Raw8<T> (&dr)[kD][kDV]) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = int(threadIdx.x) + int(blockDim.x) * j;
        if (row0 + r < rows && p < packs) {
          const int64_t off = (row0 + r) * dim + p * 8;
          hr[r][j] = LoadOnce(x + off);
          if constexpr (kAdd) dr[r][j] = LoadOnce(delta + off);
        }
      }
    }
  };
  const int64_t stride = int64_t(gridDim.x) * kR;
  int buf = 0;
  Raw8<T> hr[kR][kV];
  Raw8<T> dr[kD][kDV];
  int64_t row0 = int64_t(blockIdx.x) * kR;
  if (row0 < rows) load(row0, hr, dr);
  for (; row0 < rows; row0 += stride, buf ^= 1) {
    [[maybe_unused]] Raw8<T> hn[kPrefetch ? kR : 1][kPrefetch ? kV : 1];
    [[maybe_unused]] Raw8<T> dn[kPrefetch ? kD : 1][kPrefetch ? kDV : 1];
    if constexpr (kPrefetch) {
      if (row0 + stride < rows) load(row0 + stride, hn, dn);
    }
    float ss[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      ss[r] = 0.f;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = int(threadIdx.x) + int(blockDim.x) * j;
        if (row0 + r < rows && p < packs) {
          float v[8];
          Unpack(hr[r][j], v);
          if constexpr (kAdd) {
            float d[8];
            Unpack(dr[r][j], d);
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] += d[k];
            hr[r][j] = PackRounded<T>(v);  // the norm sees the stored residual
            Store(h + (row0 + r) * dim + p * 8, hr[r][j]);
            Unpack(hr[r][j], v);
          }
#pragma unroll
          for (int k = 0; k < 8; ++k) ss[r] += v[k] * v[k];
        }
      }
    }
    BlockSumRows<kR>(ss, scratch[buf]);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (row0 + r >= rows) continue;
      const float rs = rsqrtf(ss[r] / float(dim) + eps);
      if (threadIdx.x == 0) rstd[row0 + r] = rs;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = int(threadIdx.x) + int(blockDim.x) * j;
        if (p < packs && y != nullptr) {
          float v[8];
          Unpack(hr[r][j], v);
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = v[k] * rs * wv[j][k];
          Store(y + (row0 + r) * dim + p * 8, PackRounded<T>(v));
        }
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
#pragma unroll
        for (int j = 0; j < kV; ++j) hr[r][j] = hn[r][j];
      }
      if constexpr (kAdd) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
#pragma unroll
          for (int j = 0; j < kV; ++j) dr[r][j] = dn[r][j];
        }
      }
    } else {
      if (row0 + stride < rows) load(row0 + stride, hr, dr);
    }
  }
}

// dx = rstd * (w * dy - x * rstd^2 * mean(w * dy * x)) (+ dh_in when kResidual), and this CTA's
// partial row of dw = sum over its rows of dy * x * rstd. dx may equal dh_in (in place).
// kPrefetch: the next step's rows are loaded before this step's are reduced and stored.
template <typename T, int kV, int kR, bool kResidual, bool kPrefetch>
__global__ void __launch_bounds__(kMaxThreads)
    BackwardKernel(const T* __restrict__ dy, const T* dh_in, const T* __restrict__ x, const T* __restrict__ w,
                   const float* __restrict__ rstd, T* dx, float* __restrict__ dw_partial, int64_t rows, int packs,
                   int64_t rows_per_cta) {
  // Launched as a programmatic dependent (LaunchConfig::bwd_pdl): wait for the previous grid. Then
  // let a dependent SumPartialsKernel be scheduled now (it waits for this grid's completion
  // itself). Both are no-ops without programmatic launches.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  __shared__ float scratch[2][kR][32];
  const int dim = packs * 8;
  float wv[kV][8], acc[kV][8];
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const int p = int(threadIdx.x) + int(blockDim.x) * j;
    if (p < packs) {
      Pack8<T>::Load(w + p * 8, wv[j]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) wv[j][k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[j][k] = 0.f;
  }
  const int64_t begin = int64_t(blockIdx.x) * rows_per_cta;
  const int64_t end = begin + rows_per_cta < rows ? begin + rows_per_cta : rows;
  constexpr int kG = kResidual ? kR : 1;
  constexpr int kGV = kResidual ? kV : 1;
  // One step's rows: raw x, dy (and dh_in) packs and rstd.
  struct Rows {
    Raw8<T> x[kR][kV], d[kR][kV];
    Raw8<T> g[kG][kGV];
    float rs[kR];
  };
  auto load = [&](int64_t row0, Rows& in) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      in.rs[r] = row0 + r < end ? rstd[row0 + r] : 0.f;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = int(threadIdx.x) + int(blockDim.x) * j;
        if (row0 + r < end && p < packs) {
          const int64_t off = (row0 + r) * dim + p * 8;
          in.x[r][j] = LoadOnce(x + off);
          in.d[r][j] = LoadOnce(dy + off);
          if constexpr (kResidual) in.g[r][j] = LoadOnce(dh_in + off);
        }
      }
    }
  };
  int buf = 0;
  Rows cur;
  if (begin < end) load(begin, cur);
  for (int64_t row0 = begin; row0 < end; row0 += kR, buf ^= 1) {
    [[maybe_unused]] Rows next;
    if constexpr (kPrefetch) {
      if (row0 + kR < end) load(row0 + kR, next);
    }
    float dot[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      dot[r] = 0.f;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = int(threadIdx.x) + int(blockDim.x) * j;
        if (row0 + r < end && p < packs) {
          float xv[8], dv[8];
          Unpack(cur.x[r][j], xv);
          Unpack(cur.d[r][j], dv);
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            dot[r] += wv[j][k] * dv[k] * xv[k];
            acc[j][k] += dv[k] * xv[k] * cur.rs[r];
          }
        }
      }
    }
    BlockSumRows<kR>(dot, scratch[buf]);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (row0 + r >= end) continue;
      const float mean = dot[r] / float(dim);
      const float rs = cur.rs[r];
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = int(threadIdx.x) + int(blockDim.x) * j;
        if (p < packs) {
          float xv[8], dv[8], out[8];
          Unpack(cur.x[r][j], xv);
          Unpack(cur.d[r][j], dv);
          if constexpr (kResidual) {
            Unpack(cur.g[r][j], out);
          } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) out[k] = 0.f;
          }
#pragma unroll
          for (int k = 0; k < 8; ++k) out[k] += rs * (wv[j][k] * dv[k] - xv[k] * rs * rs * mean);
          Store(dx + (row0 + r) * dim + p * 8, PackRounded<T>(out));
        }
      }
    }
    if constexpr (kPrefetch) {
      cur = next;
    } else {
      if (row0 + kR < end) load(row0 + kR, cur);
    }
  }
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const int p = int(threadIdx.x) + int(blockDim.x) * j;
    if (p < packs) Pack8<float>::Store(dw_partial + int64_t(blockIdx.x) * dim + p * 8, acc[j]);
  }
}

// dw[c] = sum over g of partial[g][c]. A CTA takes 32 columns: warp i sums partial rows i, i + 32,
// ... (coalesced 128-byte rows), then thread c of warp 0 adds the 32 warp sums in order. The order is
// fixed, so the result is bitwise reproducible; 32 warps keep many loads in flight (this stage is
// latency-bound: a few MB read once).
// kAfterPrimary: launched as a programmatic dependent of BackwardKernel; waits for it to complete
// and its writes to be visible before reading the partial rows.
constexpr int kSumThreads = 1024;
template <bool kAfterPrimary>
__global__ void __launch_bounds__(kSumThreads)
    SumPartialsKernel(const float* __restrict__ partial, float* __restrict__ dw, int groups, int dim) {
  if constexpr (kAfterPrimary) asm volatile("griddepcontrol.wait;" ::: "memory");
  __shared__ float sums[kSumThreads / 32][33];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int c = int(blockIdx.x) * 32 + lane;
  float s = 0.f;
  if (c < dim) {
#pragma unroll 8
    for (int g = warp; g < groups; g += kSumThreads / 32) s += partial[int64_t(g) * dim + c];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && c < dim) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < kSumThreads / 32; ++i) t += sums[i][lane];
    dw[c] = t;
  }
}

// --- general path: any dim, any alignment --------------------------------------------------------

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += scratch[i];
  __syncthreads();
  return total;
}

template <typename T>
__device__ __forceinline__ float Get(const T* p, int64_t i) {
  return cuda_vec::ToF<T>(p[i]);
}

// Writes h first (kAdd), then reads it back (each thread its own elements) for the output.
template <typename T, bool kAdd>
__global__ void ForwardRowKernel(const T* x, const T* delta, const T* w, T* h, T* y, float* rstd, int dim,
                                 float eps) {
  __shared__ float scratch[32];
  const int64_t base = int64_t(blockIdx.x) * dim;
  const T* src = kAdd ? h : x;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = Get(x, base + i);
    if constexpr (kAdd) {
      const T hv = cuda_vec::FromF<T>(v + Get(delta, base + i));
      h[base + i] = hv;
      v = cuda_vec::ToF<T>(hv);
    }
    ss += v * v;
  }
  const float rs = rsqrtf(BlockSum(ss, scratch) / float(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  if (y == nullptr) return;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    y[base + i] = cuda_vec::FromF<T>(Get(src, base + i) * rs * Get(w, i));
  }
}

template <typename T, bool kResidual>
__global__ void BackwardRowKernel(const T* dy, const T* dh_in, const T* x, const T* w, const float* rstd, T* dx,
                                  int dim) {
  __shared__ float scratch[32];
  const int64_t base = int64_t(blockIdx.x) * dim;
  const float rs = rstd[blockIdx.x];
  float dot = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dot += Get(w, i) * Get(dy, base + i) * Get(x, base + i);
  const float mean = BlockSum(dot, scratch) / float(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float g = rs * (Get(w, i) * Get(dy, base + i) - Get(x, base + i) * rs * rs * mean);
    if constexpr (kResidual) g += Get(dh_in, base + i);
    dx[base + i] = cuda_vec::FromF<T>(g);
  }
}

template <typename T>
__global__ void WeightGradColumnKernel(const T* dy, const T* x, const float* rstd, float* dw, int64_t rows,
                                       int dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.f;
  for (int64_t r = 0; r < rows; ++r) s += Get(dy, r * dim + c) * Get(x, r * dim + c) * rstd[r];
  dw[c] = s;
}

// --- shape selection ------------------------------------------------------------------------------

// Packs per thread (kV), rows per step (kR) and threads for the fast path; kV == 0: general path.
struct Shape {
  int kv = 0, kr = 1, threads = 0;
};

// Registers per thread for the raw rows: kR * kV packs of each input may be live at once, and f32
// packs take twice the registers of bf16 ones; this cap keeps every instantiation within the
// 128-register budget of __launch_bounds__(512) without spills (ptxas -v).
template <typename T>
constexpr int kMaxPacksInFlight = std::is_same_v<T, float> ? 2 : 4;

template <typename T>
Shape ChooseShape(const LaunchConfig& cfg, int64_t dim, bool aligned) {
  Shape s;
  if (dim % 8 != 0 || !aligned) return s;
  const int64_t packs = dim / 8;
  const int64_t max_threads = std::clamp(cfg.max_threads, 32, kMaxThreads);
  for (int kv = 1; kv <= kMaxPacksInFlight<T>; kv *= 2) {
    if ((packs + kv - 1) / kv <= max_threads) {
      s.kv = kv;
      break;
    }
  }
  // Wider rows than max_threads allows: more threads rather than more registers.
  if (s.kv == 0 && (packs + kMaxPacksInFlight<T> - 1) / kMaxPacksInFlight<T> <= kMaxThreads) {
    s.kv = kMaxPacksInFlight<T>;
  }
  if (s.kv == 0) return s;
  s.threads = int(((packs + s.kv - 1) / s.kv + 31) / 32 * 32);
  s.kr = 1;
  while (s.kr * 2 <= cfg.rows_per_step && s.kr * 2 * s.kv <= kMaxPacksInFlight<T>) s.kr *= 2;
  return s;
}

// Calls f(integral_constant<kV>, integral_constant<kR>) for the shape (one of those ChooseShape<T>
// can return; only those are instantiated).
template <typename T, typename F>
void WithShape(const Shape& s, F&& f) {
  auto one = [&](auto kv, auto kr) {
    if constexpr (decltype(kv)::value * decltype(kr)::value <= kMaxPacksInFlight<T>) {
      if (s.kv == decltype(kv)::value && s.kr == decltype(kr)::value) f(kv, kr);
    }
  };
  using std::integral_constant;
  one(integral_constant<int, 1>(), integral_constant<int, 1>());
  one(integral_constant<int, 1>(), integral_constant<int, 2>());
  one(integral_constant<int, 1>(), integral_constant<int, 4>());
  one(integral_constant<int, 2>(), integral_constant<int, 1>());
  one(integral_constant<int, 2>(), integral_constant<int, 2>());
  one(integral_constant<int, 4>(), integral_constant<int, 1>());
}

inline bool Aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (p != nullptr && !cuda_vec::Aligned16(p)) return false;
  }
  return true;
}

inline absl::StatusOr<int> SmCount(int device) {
  int sms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(sms, 1);
}

// A launch configuration for cudaLaunchKernelEx, as a programmatic dependent launch when
// `programmatic` (the kernel may be scheduled while the previous one on the stream finishes; it
// must execute griddepcontrol.wait before using that kernel's results), a plain launch otherwise.
struct KernelLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1];
  KernelLaunch(unsigned grid, unsigned threads, cudaStream_t stream, bool programmatic) {
    config.gridDim = dim3(grid);
    config.blockDim = dim3(threads);
    config.stream = stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = programmatic ? 1 : 0;
  }
};

}  // namespace detail

// Forward: y and rstd from x (kAdd false; delta and h unused, may be null), or h = x + delta, then
// y and rstd from h (kAdd true). y may be null (w then unused): rstd (and h) only.
template <typename T, bool kAdd>
absl::Status Forward(const LaunchConfig& cfg, int64_t rows, int64_t dim, float eps, const T* x, const T* delta,
                     const T* w, T* h, T* y, float* rstd, int device, cudaStream_t stream) {
  const detail::Shape shape = detail::ChooseShape<T>(cfg.ForwardConfig(), dim, detail::Aligned({x, delta, w, h, y}));
  if (shape.kv == 0) {
    detail::ForwardRowKernel<T, kAdd><<<unsigned(rows), 256, 0, stream>>>(x, delta, w, h, y, rstd, int(dim), eps);
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(ForwardRowKernel);
    return absl::OkStatus();
  }
  int64_t grid = (rows + shape.kr - 1) / shape.kr;
  if (cfg.fwd_ctas_per_sm > 0) {
    SG_ASSIGN_OR_RETURN(const int sms, detail::SmCount(device));
    grid = std::min<int64_t>(grid, int64_t(cfg.fwd_ctas_per_sm) * sms);
  }
  const bool prefetch = cfg.fwd_prefetch && cfg.fwd_ctas_per_sm > 0;
  cudaError_t err = cudaSuccess;
  detail::WithShape<T>(shape, [&](auto kv, auto kr) {
    constexpr int kV = decltype(kv)::value, kR = decltype(kr)::value;
    auto kernel = prefetch ? detail::ForwardKernel<T, kV, kR, kAdd, true> : detail::ForwardKernel<T, kV, kR, kAdd, false>;
    detail::KernelLaunch launch(unsigned(grid), unsigned(shape.threads), stream, cfg.fwd_pdl);
    err = cudaLaunchKernelEx(&launch.config, kernel, x, delta, w, h, y, rstd, rows, int(dim / 8), eps);
  });
  if (err != cudaSuccess) {
    return LibraryError(absl::StatusCode::kInternal, "CUDA", err, cudaGetErrorString(err), "ForwardKernel", __FILE__,
                        __LINE__);
  }
  return absl::OkStatus();
}

// Backward: dx (and the f32 weight gradient dw, overwritten) from dy, x, w and the forward's rstd;
// kResidual adds dh_in to dx (dh_in unused, may be null, when false).
template <typename T, bool kResidual>
absl::Status Backward(const LaunchConfig& cfg, int64_t rows, int64_t dim, const T* dy, const T* dh_in, const T* x,
                      const T* w, const float* rstd, T* dx, float* dw, int device, cudaStream_t stream) {
  const detail::Shape shape = detail::ChooseShape<T>(cfg, dim, detail::Aligned({dy, dh_in, x, w, dx}));
  if (shape.kv == 0) {
    detail::BackwardRowKernel<T, kResidual><<<unsigned(rows), 256, 0, stream>>>(dy, dh_in, x, w, rstd, dx, int(dim));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(BackwardRowKernel);
    detail::WeightGradColumnKernel<T><<<unsigned((dim + 255) / 256), 256, 0, stream>>>(dy, x, rstd, dw, rows, int(dim));
    SG_CUDA_RETURN_IF_LAUNCH_ERROR(WeightGradColumnKernel);
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(const int sms, detail::SmCount(device));
  // Contiguous runs of rows, a multiple of the step, split over ~bwd_ctas_per_sm CTAs per SM, by
  // default as many as fit at once (a second, partial wave would leave SMs idle at the end).
  // The occupancy query is cached per kernel and thread count (one GPU model per process assumed):
  // it costs microseconds of host time per call otherwise.
  int resident = 1;
  cudaError_t err = cudaSuccess;
  const bool prefetch = cfg.bwd_prefetch;
  detail::WithShape<T>(shape, [&](auto kv, auto kr) {
    constexpr int kV = decltype(kv)::value, kR = decltype(kr)::value;
    static std::atomic<int> cached[2][detail::kMaxThreads / 32 + 1] = {};
    std::atomic<int>& slot = cached[prefetch ? 1 : 0][shape.threads / 32];
    resident = slot.load(std::memory_order_relaxed);
    if (resident == 0) {
      auto kernel = prefetch ? detail::BackwardKernel<T, kV, kR, kResidual, true>
                             : detail::BackwardKernel<T, kV, kR, kResidual, false>;
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, shape.threads, 0);
      slot.store(resident, std::memory_order_relaxed);
    }
  });
  SG_CUDA_RETURN_IF_ERROR(err);
  const int per_sm = std::max(1, cfg.bwd_ctas_per_sm > 0 ? cfg.bwd_ctas_per_sm : resident);
  const int64_t want_ctas = int64_t(per_sm) * sms;
  int64_t rows_per_cta = (rows + want_ctas - 1) / want_ctas;
  rows_per_cta = (rows_per_cta + shape.kr - 1) / shape.kr * shape.kr;
  const int64_t groups = (rows + rows_per_cta - 1) / rows_per_cta;
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* scratch, alloc->Allocate(groups * dim * int64_t(sizeof(float))));
  float* partial = static_cast<float*>(scratch);
  detail::WithShape<T>(shape, [&](auto kv, auto kr) {
    constexpr int kV = decltype(kv)::value, kR = decltype(kr)::value;
    auto kernel = prefetch ? detail::BackwardKernel<T, kV, kR, kResidual, true>
                           : detail::BackwardKernel<T, kV, kR, kResidual, false>;
    detail::KernelLaunch launch(unsigned(groups), unsigned(shape.threads), stream, cfg.bwd_pdl);
    err = cudaLaunchKernelEx(&launch.config, kernel, dy, dh_in, x, w, rstd, dx, partial, rows, int(dim / 8),
                             rows_per_cta);
  });
  const char* failed = "BackwardKernel";
  if (err == cudaSuccess) {
    // As a programmatic dependent (overlap_sum), the sum waits for the main kernel itself.
    detail::KernelLaunch launch(unsigned((dim + 31) / 32), detail::kSumThreads, stream, cfg.overlap_sum);
    err = cudaLaunchKernelEx(&launch.config,
                             cfg.overlap_sum ? detail::SumPartialsKernel<true> : detail::SumPartialsKernel<false>,
                             static_cast<const float*>(partial), dw, int(groups), int(dim));
    failed = "SumPartialsKernel";
  }
  alloc->Free(scratch);  // reused only by later work on the same stream
  if (err != cudaSuccess) {
    return LibraryError(absl::StatusCode::kInternal, "CUDA", err, cudaGetErrorString(err), failed, __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

}  // namespace sg::kernels::rmsnorm_launch

#endif  // __CUDACC__
#endif  // SGTRAIN_KERNELS_RMSNORM_RMSNORM_LAUNCH_H_
