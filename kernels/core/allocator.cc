#include "kernels/core/allocator.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/core/status.h"

namespace sg {
namespace {

// Shared bookkeeping: bytes in use and the peak.
class CountingAllocator : public Allocator {
 public:
  int64_t CurrentBytes() const override {
    absl::MutexLock l(&mu_);
    return current_;
  }
  int64_t PeakBytes() const override {
    absl::MutexLock l(&mu_);
    return peak_;
  }
  void ResetPeak() override {
    absl::MutexLock l(&mu_);
    peak_ = current_;
  }

 protected:
  void CountAlloc(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    current_ += bytes;
    if (current_ > peak_) peak_ = current_;
  }
  mutable absl::Mutex mu_;
  int64_t current_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

class HostAllocator final : public CountingAllocator {
 public:
  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    if (bytes <= 0) return nullptr;
    const int64_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(256, size_t((rounded + 255) / 256 * 256));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
    absl::MutexLock l(&mu_);
    sizes_[p] = rounded;
    CountAlloc(rounded);
    return p;
  }
  void Free(void* p) override {
    if (p == nullptr) return;
    {
      absl::MutexLock l(&mu_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        current_ -= it->second;
        sizes_.erase(it);
      }
    }
    std::free(p);
  }
  Device device() const override { return Device::Cpu(); }
  int64_t ReservedBytes() const override { return CurrentBytes(); }
  void ReleaseCache() override {}

 private:
  absl::flat_hash_map<void*, int64_t> sizes_ ABSL_GUARDED_BY(mu_);
};

#ifdef SG_WITH_CUDA
// Caching allocator: blocks are rounded (512 B under 1 MiB, 2 MiB above) and kept in a free list by
// size after Free, so steady-state training never calls cudaMalloc. A request takes the smallest
// cached block that fits if it wastes at most a quarter of it; on out-of-memory the cache is
// released and the cudaMalloc retried once.
class CudaCachingAllocator final : public CountingAllocator {
 public:
  explicit CudaCachingAllocator(int ordinal) : ordinal_(ordinal) {}

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    if (bytes <= 0) return nullptr;
    const int64_t size = Round(bytes);
    absl::MutexLock l(&mu_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= size + size / 4) {
      void* p = it->second;
      const int64_t block = it->first;
      free_.erase(it);
      in_use_[p] = block;
      CountAlloc(block);
      return p;
    }
    int prev = 0;
    SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
    SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size_t(size));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ReleaseCacheLocked();
      err = cudaMalloc(&p, size_t(size));
    }
    cudaSetDevice(prev);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", ordinal_, " cannot allocate ", bytes, " bytes (", cudaGetErrorString(err),
          "); in use ", current_, " bytes, reserved ", reserved_, " bytes"));
    }
    reserved_ += size;
    in_use_[p] = size;
    CountAlloc(size);
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    absl::MutexLock l(&mu_);
    auto it = in_use_.find(p);
    if (it == in_use_.end()) return;
    if (holding_) capture_freed_.insert(p);
    current_ -= it->second;
    free_.emplace(it->second, p);
    in_use_.erase(it);
  }

  void BeginHoldingFrees() override {
    absl::MutexLock l(&mu_);
    holding_ = true;
  }
  // Blocks freed during the capture may be reused within it (the graph replays in stream order),
  // but none may be handed out after it: each one still free at the end is taken back out of the
  // cache and held for the graph.
  std::vector<void*> EndHoldingFrees() override {
    absl::MutexLock l(&mu_);
    holding_ = false;
    std::vector<void*> held;
    for (auto it = free_.begin(); it != free_.end();) {
      if (capture_freed_.contains(it->second)) {
        in_use_[it->second] = it->first;
        CountAlloc(it->first);
        held.push_back(it->second);
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
    capture_freed_.clear();
    return held;
  }

  Device device() const override { return Device::Cuda(ordinal_); }
  int64_t ReservedBytes() const override {
    absl::MutexLock l(&mu_);
    return reserved_;
  }
  void ReleaseCache() override {
    absl::MutexLock l(&mu_);
    ReleaseCacheLocked();
  }

 private:
  static int64_t Round(int64_t bytes) {
    constexpr int64_t kSmall = 512, kLarge = 2 << 20;
    return bytes < (1 << 20) ? (bytes + kSmall - 1) / kSmall * kSmall
                             : (bytes + kLarge - 1) / kLarge * kLarge;
  }
  void ReleaseCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cudaDeviceSynchronize();  // cached blocks may still be read by queued work
    for (auto& [size, p] : free_) {
      cudaFree(p);
      reserved_ -= size;
    }
    free_.clear();
  }

  const int ordinal_;
  std::multimap<int64_t, void*> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, int64_t> in_use_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<void*> capture_freed_ ABSL_GUARDED_BY(mu_);
};
#endif

}  // namespace

absl::StatusOr<Allocator*> AllocatorFor(Device device) {
  if (device.is_cpu()) {
    static HostAllocator* host = new HostAllocator();
    return host;
  }
  if (device.ordinal < 0 || device.ordinal >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no allocator for ", device.ToString(), ": ", CudaDeviceCount(), " CUDA devices (",
        CudaUnavailableReason(), ")"));
  }
#ifdef SG_WITH_CUDA
  static auto* allocators = [] {
    auto* v = new std::vector<std::unique_ptr<CudaCachingAllocator>>();
    for (int i = 0; i < CudaDeviceCount(); ++i) v->push_back(std::make_unique<CudaCachingAllocator>(i));
    return v;
  }();
  return (*allocators)[device.ordinal].get();
#else
  return absl::FailedPreconditionError("built without CUDA");
#endif
}

}  // namespace sg
