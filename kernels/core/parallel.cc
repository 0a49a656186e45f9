#include "kernels/core/parallel.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace sg {
namespace {

thread_local bool in_parallel_region = false;

// Workers wait for a job generation number to change, take chunks from a shared counter, and
// report completion; the caller takes chunks too.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  int size() const { return int(workers_.size()) + 1; }

  void Run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    absl::MutexLock run_lock(&run_mu_);  // one job at a time
    {
      absl::MutexLock l(&mu_);
      fn_ = &chunk_fn;
      total_ = chunks;
      next_ = 0;
      done_ = 0;
      ++generation_;
    }
    Work();
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(+[](Pool* p) { return p->done_ == p->total_; }, this));
    fn_ = nullptr;
  }

 private:
  void Work() {
    in_parallel_region = true;
    for (;;) {
      int64_t c;
      const std::function<void(int64_t)>* fn;
      {
        absl::MutexLock l(&mu_);
        if (fn_ == nullptr || next_ >= total_) break;
        c = next_++;
        fn = fn_;
      }
      (*fn)(c);
      absl::MutexLock l(&mu_);
      ++done_;
    }
    in_parallel_region = false;
  }
  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        auto ready = [&] { return generation_ != seen; };
        mu_.Await(absl::Condition(&ready));
        seen = generation_;
      }
      Work();
    }
  }

  absl::Mutex run_mu_;
  absl::Mutex mu_;
  const std::function<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> workers_;
};

Pool& GlobalPool() {
  static Pool* pool = new Pool(CpuThreads());  // never destroyed: workers live for the process
  return *pool;
}

}  // namespace

int CpuThreads() {
  static const int n = [] {
    if (const char* s = std::getenv("SG_CPU_THREADS"); s != nullptr && std::atoi(s) > 0) return std::atoi(s);
    return std::max(1, int(std::thread::hardware_concurrency()));
  }();
  return n;
}

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  Pool& pool = GlobalPool();
  const int64_t max_chunks = std::max<int64_t>(1, n / grain);
  const int64_t chunks = std::min<int64_t>(max_chunks, int64_t(pool.size()) * 4);
  if (chunks <= 1 || in_parallel_region || pool.size() == 1) {
    fn(0, n);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  pool.Run(chunks, [&](int64_t c) {
    const int64_t b = c * step;
    const int64_t e = std::min(n, b + step);
    if (b < e) fn(b, e);
  });
}

}  // namespace sg
