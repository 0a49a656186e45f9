// Part of rmsnorm_launch.h, included from it after its detail helpers (do not include directly): the
// backward with a shared-memory ring of row slots filled by cp.async (LaunchConfig::bwd_stages).
//
// Why: BackwardKernel keeps a row in registers from its load to its store, so each CTA step is
// load -> block reduction -> store, and its HBM latency is exposed every row (16384 x 2048 bf16:
// 3.12 TB/s on an H200 against 3.5 for a copy; more CTAs, more registers, register prefetch and 2
// rows a step did not help). Here each CTA has `stages` row slots in shared memory and issues the
// cp.async copies of row r + stages - 1 before it computes row r, so stages - 1 rows of every CTA
// stay in flight while it reduces and stores, at no register cost.
//
// Layout: as BackwardKernel with one row a step (thread t owns the 8-element packs t, t + threads,
// ...). A slot holds the x, dy (and dh_in) rows, pack p at byte p * 8 * sizeof(T) of its row, and one
// rstd word per thread. Every thread copies exactly the bytes it later reads (its own packs, its own
// rstd word), so its cp.async.wait_group alone makes a slot readable (no barrier), and a slot it
// refills is the one it read the step before (the reads fed that step's stores, which precede the
// copies in program order). Summation order of dot and dw is BackwardKernel's: deterministic.
// dx may equal dh_in: a row's dh_in is in shared memory before its dx is stored.
#ifndef SGTRAIN_KERNELS_RMSNORM_RMSNORM_BWD_RING_H_
#define SGTRAIN_KERNELS_RMSNORM_RMSNORM_BWD_RING_H_

#ifndef SGTRAIN_KERNELS_RMSNORM_RMSNORM_LAUNCH_H_
#error "rmsnorm_bwd_ring.h is part of rmsnorm_launch.h; include that instead"
#endif

#include <map>
#include <mutex>
#include <tuple>

namespace sg::kernels::rmsnorm_launch::detail {

constexpr int kMinRingStages = 2, kMaxRingStages = 4;  // the instantiated ring depths

__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's most recent groups are incomplete.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Bytes of one ring slot: the row buffers (x, dy, and dh_in when kResidual) and a rstd word a thread.
// Multiples of 16 (dim is a multiple of 8, threads of 32), so every slot and row stays 16-byte aligned.
template <typename T, bool kResidual>
constexpr int64_t RingSlotBytes(int64_t dim, int threads) {
  return (kResidual ? 3 : 2) * dim * int64_t(sizeof(T)) + int64_t(threads) * 4;
}

// BackwardKernel's contract (one row a step; rows_per_cta any positive count) with kStages row slots
// in dynamic shared memory (kStages * RingSlotBytes bytes).
template <typename T, int kV, int kStages, bool kResidual>
__global__ void __launch_bounds__(kMaxThreads)
    BackwardRingKernel(const T* __restrict__ dy, const T* dh_in, const T* __restrict__ x, const T* __restrict__ w,
                       const float* __restrict__ rstd, T* dx, float* __restrict__ dw_partial, int64_t rows, int packs,
                       int64_t rows_per_cta) {
  static_assert(kStages >= kMinRingStages && kStages <= kMaxRingStages, "ring depth outside the instantiated range");
  // As BackwardKernel: the previous grid's writes are visible before any global access here.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  extern __shared__ __align__(16) unsigned char ring[];
  __shared__ float scratch[2][1][32];
  constexpr int kBufs = kResidual ? 3 : 2;
  constexpr int kChunks = int(sizeof(Raw8<T>)) / 16;  // 16-byte copies a pack
  const int dim = packs * 8;
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const int row_bytes = dim * int(sizeof(T));
  const int slot_bytes = int(RingSlotBytes<T, kResidual>(dim, threads));
  const uint32_t ring_base = uint32_t(__cvta_generic_to_shared(ring));
  float wv[kV][8], acc[kV][8];
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const int p = tid + threads * j;
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
  // Starts this thread's copies of `row` (if it is one of this CTA's) into `slot`; always commits a
  // group (possibly empty), so the group of row r is always kStages - 1 groups behind the newest.
  auto issue = [&](int64_t row, int slot) {
    if (row < end) {
      const uint32_t base = ring_base + uint32_t(slot * slot_bytes);
      const T* srcs[kBufs];
      srcs[0] = x;
      srcs[1] = dy;
      if constexpr (kResidual) srcs[2] = dh_in;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const int p = tid + threads * j;
        if (p < packs) {
          const int64_t off = row * dim + p * 8;
#pragma unroll
          for (int b = 0; b < kBufs; ++b) {
#pragma unroll
            for (int c = 0; c < kChunks; ++c) {
              CpAsync16(base + uint32_t(b * row_bytes + p * int(sizeof(Raw8<T>)) + 16 * c),
                        reinterpret_cast<const char*>(srcs[b] + off) + 16 * c);
            }
          }
        }
      }
      CpAsync4(base + uint32_t(kBufs * row_bytes + 4 * tid), rstd + row);
    }
    CpAsyncCommit();
  };
  // This thread's packs of buffer b in `slot` (only after its copies completed).
  auto read = [&](int slot, int b, int j) {
    const int p = tid + threads * j;
    return *reinterpret_cast<const Raw8<T>*>(ring + slot * slot_bytes + b * row_bytes + p * int(sizeof(Raw8<T>)));
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(begin + s, s);
  int slot = 0, buf = 0;
  for (int64_t row = begin; row < end; ++row, buf ^= 1) {
    issue(row + kStages - 1, slot == 0 ? kStages - 1 : slot - 1);  // the slot read last step
    CpAsyncWait<kStages - 1>();                                     // this row's group is complete
    const float rs = *reinterpret_cast<const float*>(ring + slot * slot_bytes + kBufs * row_bytes + 4 * tid);
    float dot[1] = {0.f};
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      if (tid + threads * j < packs) {
        float xv[8], dv[8];
        Unpack(read(slot, 0, j), xv);
        Unpack(read(slot, 1, j), dv);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          dot[0] += wv[j][k] * dv[k] * xv[k];
          acc[j][k] += dv[k] * xv[k] * rs;
        }
      }
    }
    BlockSumRows<1>(dot, scratch[buf]);
    const float mean = dot[0] / float(dim);
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const int p = tid + threads * j;
      if (p < packs) {
        // Read again rather than held across the reduction: registers, not shared-memory bandwidth,
        // limit the CTAs an SM holds.
        float xv[8], dv[8], out[8];
        Unpack(read(slot, 0, j), xv);
        Unpack(read(slot, 1, j), dv);
        if constexpr (kResidual) {
          Unpack(read(slot, 2, j), out);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) out[k] = 0.f;
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) out[k] += rs * (wv[j][k] * dv[k] - xv[k] * rs * rs * mean);
        Store(dx + row * dim + p * 8, PackRounded<T>(out));
      }
    }
    slot = slot + 1 == kStages ? 0 : slot + 1;
  }
  CpAsyncWait<0>();  // only empty groups remain; leave nothing outstanding at exit
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const int p = tid + threads * j;
    if (p < packs) Pack8<float>::Store(dw_partial + int64_t(blockIdx.x) * dim + p * 8, acc[j]);
  }
}

// Calls f(integral_constant<kStages>) for stages in [kMinRingStages, kMaxRingStages].
template <typename F>
void WithStages(int stages, F&& f) {
  using std::integral_constant;
  if (stages == 2) f(integral_constant<int, 2>());
  if (stages == 3) f(integral_constant<int, 3>());
  if (stages == 4) f(integral_constant<int, 4>());
}

// Resident CTAs per SM of `kernel` at `threads` threads and `smem` bytes of dynamic shared memory on
// `device`, or 0 when that much does not fit a CTA. The first query for a kernel on a device raises
// its dynamic shared memory limit to the device's opt-in maximum (rings over 48 KB) and prefers
// shared memory to L1 (the ring's copies bypass L1). Cached: microseconds of host time otherwise.
template <typename Kernel>
absl::StatusOr<int> RingResident(Kernel kernel, int threads, int64_t smem, int device) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int64_t>, int> cache;
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), threads, smem);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int optin = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr = {};
  SG_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, kernel));
  const int64_t max_dynamic = int64_t(optin) - int64_t(attr.sharedSizeBytes);
  int resident = 0;
  if (smem <= max_dynamic) {
    SG_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_dynamic)));
    SG_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 int(cudaSharedmemCarveoutMaxShared)));
    SG_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, size_t(smem)));
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = resident;
  return resident;
}

}  // namespace sg::kernels::rmsnorm_launch::detail

#endif  // SGTRAIN_KERNELS_RMSNORM_RMSNORM_BWD_RING_H_
