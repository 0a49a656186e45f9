// A process-wide CPU thread pool for the CPU reference kernels.
//
//   sg::ParallelFor(rows, /*grain=*/16, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) DoRow(r);
//   });
#ifndef SGTRAIN_KERNELS_CORE_PARALLEL_H_
#define SGTRAIN_KERNELS_CORE_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace sg {

// Calls fn(begin, end) over disjoint ranges covering [0, n), each at least `grain` long (except the
// last), on up to CpuThreads() threads, and returns when all are done. fn must not call ParallelFor
// (nested calls run serially on the calling thread).
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Threads used by ParallelFor: SG_CPU_THREADS if set, else the hardware concurrency.
int CpuThreads();

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_PARALLEL_H_
