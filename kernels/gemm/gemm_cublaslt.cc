// CUDA GEMM through cuBLASLt: one handle per device, a 32 MiB workspace per (device, stream), and the
// heuristic's algorithm cached per problem key, so a training step pays for descriptor setup only.
//
// Row-major vs cuBLASLt's column-major. A row-major [r, c] matrix with row stride ld is, byte for
// byte, a column-major [c, r] matrix with leading dimension ld: the same memory read as its
// transpose. So the row-major product D[M,N] = op(A)[M,K] op(B)[K,N] is issued as the column-major
// product D^T[N,M] = op(B)^T[N,K] op(A)^T[K,M]: cuBLASLt's "A" is our b and its "B" is our a, its
// m = N, n = M, and each operand's transpose flag carries over unchanged (a row-major [K,N] b is
// already the column-major [N,K] that cuBLASLt wants untransposed). cuBLASLt's bias epilogue adds a
// vector along the rows of its column-major D, i.e. along our N: exactly a Linear bias.
//
// The one exception is the per-row scale (row_scale, the 1/rms of kernels/gemm_rmsnorm): cuBLASLt's
// per-row alpha vector (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO) scales rows of its D,
// which in the swapped form are our columns. For that case the problem is issued unswapped, with D in
// CUBLASLT_ORDER_ROW so it lands row-major: cuBLASLt's m = M, n = N, A = our a (op T when not
// transposed, since row-major [M,K] is column-major [K,M]) and B = our b (likewise). When cuBLASLt
// refuses that form (no algorithm; remembered per key) or alpha != 1, the product is computed in the
// swapped form and a separate pass (gemm.cu) scales d's rows.
//
// The first call for a key allocates the stream's workspace and runs the heuristic: make it before
// capturing a CUDA graph (a warm-up step), as cudaMalloc cannot run inside a capture.
//
// Autotuning (GemmAlgo::kTuned, or kDefault with the process's Tuner enabled): the first call for
// a key times the heuristic's top kTuneCandidates algorithms on the call's own operands (CUDA
// events, a few reps each; d is rewritten by the real call after, a scratch d only for in-place
// accumulation), keeps the fastest in autotune::Tuner::Global() under (problem text, device model
// name, cuBLASLt version) and caches it per key like the heuristic's. A choice already in the
// Tuner (installed from the compile cache by compiler/autotune.h) is reused without timing, after
// cublasLtMatmulAlgoCheck accepts it. With a CostMeter installed on the Tuner, the fastest few
// candidates of a long enough GEMM are re-ranked by the meter (autotune::RerankPolicy), and with
// RerankPolicy::variants configurations of the heuristic's first algorithms it did not list are
// timed beside its list (AlgoVariants).
#ifdef SG_WITH_CUDA

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/autotune/tuning_table.h"
#include "kernels/core/allocator.h"
#include "kernels/core/status.h"
#include "kernels/gemm/gemm_internal.h"

// Returns an Internal status carrying the call, file:line and cuBLASLt's own status string.
#define SG_CUBLAS_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                            \
    cublasStatus_t sg_cublas_status_ = (call);                                                    \
    if (sg_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      return ::sg::LibraryError(absl::StatusCode::kInternal, "cuBLASLt", sg_cublas_status_,       \
                                cublasLtGetStatusString(sg_cublas_status_), #call, __FILE__, __LINE__); \
  } while (0)

namespace sg::kernels::gemm_internal {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t CudaType(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// --- per-device state -----------------------------------------------------------------------------

// Makes `device` current for the scope, restoring the caller's device after.
class DeviceGuard {
 public:
  static absl::StatusOr<DeviceGuard> Enter(int device) {
    int prev = 0;
    SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
    if (prev != device) SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return DeviceGuard(prev, prev != device);
  }
  DeviceGuard(DeviceGuard&& o) noexcept : prev_(o.prev_), restore_(std::exchange(o.restore_, false)) {}
  DeviceGuard& operator=(DeviceGuard&&) = delete;
  ~DeviceGuard() {
    if (restore_) (void)cudaSetDevice(prev_);
  }

 private:
  DeviceGuard(int prev, bool restore) : prev_(prev), restore_(restore) {}
  int prev_;
  bool restore_;
};

absl::Mutex g_state_mu(absl::kConstInit);

// Handles and workspaces live for the process: destroying them at exit would race the driver's
// own teardown, and they are few (one handle per device, one workspace per stream).
absl::StatusOr<cublasLtHandle_t> Handle(int device) {
  static auto* handles = new absl::flat_hash_map<int, cublasLtHandle_t>();
  absl::MutexLock lock(&g_state_mu);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  cublasLtHandle_t h = nullptr;
  SG_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  handles->emplace(device, h);
  return h;
}

// One workspace per stream: two streams running GEMMs concurrently must not share scratch memory.
absl::StatusOr<void*> Workspace(int device, cudaStream_t stream) {
  static auto* spaces = new absl::flat_hash_map<std::pair<int, cudaStream_t>, void*>();
  absl::MutexLock lock(&g_state_mu);
  auto it = spaces->find({device, stream});
  if (it != spaces->end()) return it->second;
  SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
  SG_ASSIGN_OR_RETURN(void* ws, alloc->Allocate(int64_t(kWorkspaceBytes)));
  spaces->emplace(std::make_pair(device, stream), ws);
  return ws;
}

// --- the column-major problem handed to cuBLASLt --------------------------------------------------

struct LtMatrix {
  const void* ptr = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;  // column-major dimensions as stored (before the op)
  int64_t ld = 0, batch_stride = 0;
  bool row_order = false;  // CUBLASLT_ORDER_ROW: ld is then the distance between rows
};

struct LtPlan {
  uint64_t m = 0, n = 0, k = 0;
  int batch = 1;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  LtMatrix a, b, c, d;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  const float* alpha_vector = nullptr;  // per-row alpha over cuBLASLt's m (beta must be 0)
  float alpha = 1.0f, beta = 0.0f;
  int sm_count = 0;  // CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; 0: the device's
};

LtMatrix Stored(const Matrix& m, DType t) {
  LtMatrix x;
  x.ptr = m.data;
  x.type = CudaType(t);
  x.rows = uint64_t(m.cols);  // row-major [rows, cols] == column-major [cols, rows]
  x.cols = uint64_t(m.rows);
  x.ld = m.ld;
  x.batch_stride = m.batch_stride;
  return x;
}

LtMatrix Output(const Matrix& m, DType t, bool row_order) {
  LtMatrix x = Stored(m, t);
  if (row_order) {
    x.rows = uint64_t(m.rows);
    x.cols = uint64_t(m.cols);
    x.row_order = true;
  }
  return x;
}

// D^T = op(b)^T op(a)^T in column-major terms (see the file comment).
LtPlan SwappedPlan(const Problem& p) {
  LtPlan l;
  l.m = uint64_t(p.n);
  l.n = uint64_t(p.m);
  l.k = uint64_t(p.k);
  l.batch = int(p.batch);
  l.op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  l.op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  l.a = Stored(p.b, p.ab_dtype);
  l.b = Stored(p.a, p.ab_dtype);
  l.d = Output(p.d, p.d_dtype, false);
  l.c = p.c.data != nullptr ? Output(p.c, p.d_dtype, false) : l.d;
  l.bias = p.bias;
  l.bias_type = CudaType(p.d_dtype);
  l.alpha = p.alpha;
  l.beta = p.beta;
  l.sm_count = p.sm_count;
  return l;
}

// D = op(a) op(b) with D row-ordered, so the per-row alpha vector runs over our rows (M).
LtPlan RowScalePlan(const Problem& p) {
  LtPlan l;
  l.m = uint64_t(p.m);
  l.n = uint64_t(p.n);
  l.k = uint64_t(p.k);
  l.batch = int(p.batch);
  l.op_a = p.trans_a ? CUBLAS_OP_N : CUBLAS_OP_T;
  l.op_b = p.trans_b ? CUBLAS_OP_N : CUBLAS_OP_T;
  l.a = Stored(p.a, p.ab_dtype);
  l.b = Stored(p.b, p.ab_dtype);
  l.d = Output(p.d, p.d_dtype, true);
  l.c = l.d;
  l.alpha_vector = p.row_scale;
  l.sm_count = p.sm_count;
  return l;
}

// --- descriptors ----------------------------------------------------------------------------------

using DescPtr = std::unique_ptr<cublasLtMatmulDescOpaque_t, cublasStatus_t (*)(cublasLtMatmulDesc_t)>;
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, cublasStatus_t (*)(cublasLtMatrixLayout_t)>;
using PrefPtr =
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)>;

template <typename V>
absl::Status SetDesc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  SG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
  return absl::OkStatus();
}

template <typename V>
absl::Status SetLayout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  SG_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
  return absl::OkStatus();
}

absl::StatusOr<LayoutPtr> MakeLayout(const LtMatrix& m, int batch) {
  cublasLtMatrixLayout_t raw = nullptr;
  SG_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&raw, m.type, m.rows, m.cols, m.ld));
  LayoutPtr l(raw, &cublasLtMatrixLayoutDestroy);
  if (m.row_order) SG_RETURN_IF_ERROR(SetLayout(raw, CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t(CUBLASLT_ORDER_ROW)));
  if (batch > 1) {
    SG_RETURN_IF_ERROR(SetLayout(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(batch)));
    SG_RETURN_IF_ERROR(SetLayout(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(m.batch_stride)));
  }
  return l;
}

// Largest power of two up to 16 dividing the address and every stride (in bytes) of an operand.
uint32_t Alignment(const void* ptr, int64_t ld, int64_t batch_stride, cudaDataType_t t) {
  const uint64_t elem = t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 4;
  const uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(ptr)) | uint64_t(ld) * elem |
                        uint64_t(batch_stride) * elem;
  uint32_t a = 16;
  while (a > 1 && bits % a != 0) a >>= 1;
  return a;
}

// --- the algorithm cache --------------------------------------------------------------------------

// Everything the heuristic's choice depends on. Pointers enter only through their alignment.
struct AlgoKey {
  int device;
  uint64_t m, n, k;
  int batch;
  int op_a, op_b;
  int a_type, d_type;
  int64_t lda, ldb, ldc, ldd, sa, sb, sc, sd;
  bool row_order_d, has_bias, alpha_vector, beta_nonzero, c_is_d;
  uint32_t align_a, align_b, align_c, align_d, align_bias;
  bool tuned;  // chosen by autotuning rather than the heuristic's first
  int sm_count;

  auto Tie() const {
    return std::make_tuple(device, m, n, k, batch, op_a, op_b, a_type, d_type, lda, ldb, ldc, ldd, sa, sb, sc, sd,
                           row_order_d, has_bias, alpha_vector, beta_nonzero, c_is_d, align_a, align_b, align_c,
                           align_d, align_bias, tuned, sm_count);
  }
  // The autotuning table's problem text: everything but the device ordinal and the policy.
  std::string ProblemText() const {
    return absl::StrCat("m=", m, ",n=", n, ",k=", k, ",batch=", batch, ",op=", op_a, op_b, ",ab=", a_type,
                        ",d=", d_type, ",ld=", lda, "/", ldb, "/", ldc, "/", ldd, ",stride=", sa, "/", sb, "/", sc,
                        "/", sd, ",row_d=", row_order_d, ",bias=", has_bias, ",alpha_vec=", alpha_vector,
                        ",beta=", beta_nonzero, ",c_is_d=", c_is_d, ",align=", align_a, "/", align_b, "/",
                        align_c, "/", align_d, "/", align_bias, sm_count > 0 ? absl::StrCat(",sms=", sm_count) : "");
  }
  friend bool operator==(const AlgoKey& x, const AlgoKey& y) { return x.Tie() == y.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const AlgoKey& key) {
    return H::combine(std::move(h), key.Tie());
  }
};

struct AlgoEntry {
  bool found = false;  // false: cuBLASLt has no algorithm for this key (remembered, not retried)
  cublasLtMatmulAlgo_t algo;
};

absl::Mutex g_algo_mu(absl::kConstInit);

absl::flat_hash_map<AlgoKey, AlgoEntry>& AlgoCache() {
  static auto* cache = new absl::flat_hash_map<AlgoKey, AlgoEntry>();
  return *cache;
}

AlgoKey KeyOf(const LtPlan& l, int device, bool tuned) {
  AlgoKey k;
  k.device = device;
  k.tuned = tuned;
  k.m = l.m;
  k.n = l.n;
  k.k = l.k;
  k.batch = l.batch;
  k.op_a = int(l.op_a);
  k.op_b = int(l.op_b);
  k.a_type = int(l.a.type);
  k.d_type = int(l.d.type);
  k.lda = l.a.ld;
  k.ldb = l.b.ld;
  k.ldc = l.c.ld;
  k.ldd = l.d.ld;
  k.sa = l.a.batch_stride;
  k.sb = l.b.batch_stride;
  k.sc = l.c.batch_stride;
  k.sd = l.d.batch_stride;
  k.row_order_d = l.d.row_order;
  k.has_bias = l.bias != nullptr;
  k.alpha_vector = l.alpha_vector != nullptr;
  k.beta_nonzero = l.beta != 0.0f;
  k.c_is_d = l.c.ptr == l.d.ptr;
  k.align_a = Alignment(l.a.ptr, l.a.ld, l.a.batch_stride, l.a.type);
  k.align_b = Alignment(l.b.ptr, l.b.ld, l.b.batch_stride, l.b.type);
  k.align_c = Alignment(l.c.ptr, l.c.ld, l.c.batch_stride, l.c.type);
  k.align_d = Alignment(l.d.ptr, l.d.ld, l.d.batch_stride, l.d.type);
  k.align_bias = l.bias != nullptr ? Alignment(l.bias, 0, 0, l.bias_type) : 0;
  k.sm_count = l.sm_count;
  return k;
}

// Everything one cublasLtMatmul call needs besides the algorithm and the output pointers.
struct MatmulCall {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c, d;
  const LtPlan* plan;
  const void* alpha;
  void* workspace;
  cudaStream_t stream;

  cublasStatus_t Run(const cublasLtMatmulAlgo_t& algo, const void* c_ptr, void* d_ptr) const {
    return cublasLtMatmul(handle, desc, alpha, plan->a.ptr, a, plan->b.ptr, b, &plan->beta, c_ptr, c, d_ptr, d, &algo,
                          workspace, kWorkspaceBytes, stream);
  }
};

// Up to `max_results` algorithms from cuBLASLt's heuristic, best first; empty when it has none
// for the problem (e.g. the row-ordered output of RowScalePlan on a library version without it).
absl::StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> Heuristic(const MatmulCall& call, const AlgoKey& key,
                                                                       int max_results) {
  cublasLtMatmulPreference_t raw = nullptr;
  SG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw));
  PrefPtr pref(raw, &cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = kWorkspaceBytes;
  SG_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d},
  };
  for (const auto& [attr, bytes] : aligns) {
    SG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(raw, attr, &bytes, sizeof(bytes)));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_results));
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(call.handle, call.desc, call.a, call.b, call.c, call.d,
                                                           raw, max_results, results.data(), &returned);
  // The per-row alpha / row-ordered D form is optional (there is a fallback): any refusal of it
  // means "not available". For plain GEMMs only NOT_SUPPORTED does; anything else is our bug.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !key.alpha_vector) {
    return LibraryError(absl::StatusCode::kInternal, "cuBLASLt", st, cublasLtGetStatusString(st),
                        "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  }
  std::vector<cublasLtMatmulHeuristicResult_t> ok;
  if (st != CUBLAS_STATUS_SUCCESS) return ok;
  for (int i = 0; i < returned; ++i) {
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) ok.push_back(results[size_t(i)]);
  }
  return ok;
}

// --- autotuning -----------------------------------------------------------------------------------

// How many of the heuristic's algorithms are timed, and how: one untimed call, then kTuneReps
// timed back to back between two events. Enough to separate tile shapes at the step's GEMMs
// (milliseconds each); a small GEMM's choice is noisier but matters little.
constexpr int kTuneCandidates = 8;
constexpr int kTuneReps = 5;

absl::StatusOr<std::string> DeviceName(int device) {
  static auto* names = new absl::flat_hash_map<int, std::string>();
  absl::MutexLock lock(&g_state_mu);
  auto it = names->find(device);
  if (it != names->end()) return it->second;
  cudaDeviceProp prop;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return names->emplace(device, std::string(prop.name)).first->second;
}

std::string LibraryVersion() { return absl::StrCat("cublasLt ", cublasLtGetVersion()); }

// Bytes spanned by an operand (all batch entries).
int64_t ExtentBytes(const LtMatrix& m, int batch) {
  const int64_t outer = int64_t(m.row_order ? m.rows : m.cols), inner = int64_t(m.row_order ? m.cols : m.rows);
  const int64_t elems = (outer - 1) * m.ld + inner + int64_t(batch - 1) * m.batch_stride;
  return elems * (m.type == CUDA_R_16BF || m.type == CUDA_R_16F ? 2 : 4);
}

// Device memory from the caching allocator for the scope.
class Scratch {
 public:
  static absl::StatusOr<Scratch> Allocate(int device, int64_t bytes) {
    SG_ASSIGN_OR_RETURN(Allocator * alloc, AllocatorFor(Device::Cuda(device)));
    SG_ASSIGN_OR_RETURN(void* p, alloc->Allocate(bytes));
    return Scratch(alloc, p);
  }
  Scratch(Scratch&& o) noexcept : alloc_(o.alloc_), ptr_(std::exchange(o.ptr_, nullptr)) {}
  Scratch& operator=(Scratch&&) = delete;
  ~Scratch() {
    if (ptr_ != nullptr) alloc_->Free(ptr_);
  }
  void* get() const { return ptr_; }

 private:
  Scratch(Allocator* a, void* p) : alloc_(a), ptr_(p) {}
  Allocator* alloc_;
  void* ptr_;
};

// Milliseconds `calls` back-to-back calls of `algo` take, between two events on the stream.
absl::StatusOr<float> TimeCalls(const MatmulCall& call, const cublasLtMatmulAlgo_t& algo, const void* c_ptr, void* d,
                                int calls) {
  cudaEvent_t start = nullptr, stop = nullptr;
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> start_owner(start, &cudaEventDestroy);
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> stop_owner(stop, &cudaEventDestroy);
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, call.stream));
  for (int r = 0; r < calls; ++r) SG_CUBLAS_RETURN_IF_ERROR(call.Run(algo, c_ptr, d));
  SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, call.stream));
  SG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

// Microseconds per call of `algo` on the problem, writing `d` (read as c too when the problem
// accumulates in place): one untimed call, then kTuneReps timed. Synchronizes on its events (the
// stream is not capturing). Measured and removed (2026-12-01 04:30, gpu_call45.sh, the 1b step on
// one H200 at its 700 W limit): timing each candidate over ~50 ms after ~100 ms of untimed calls, at
// the clock its own power draw leaves it, picked no faster algorithms: 81,267 / 81,052 tokens/s
// against 81,394 / 81,639 with these few calls at boost clocks.
absl::StatusOr<double> TimeAlgo(const MatmulCall& call, const cublasLtMatmulAlgo_t& algo, void* d) {
  const LtPlan& l = *call.plan;
  const void* c_ptr = l.c.ptr == l.d.ptr ? d : l.c.ptr;
  SG_CUBLAS_RETURN_IF_ERROR(call.Run(algo, c_ptr, d));
  SG_ASSIGN_OR_RETURN(float ms, TimeCalls(call, algo, c_ptr, d, kTuneReps));
  return double(ms) * 1e3 / kTuneReps;
}

// An algorithm as the bytes the Tuner records as its variant, and back (false for bytes that are
// not one).
std::string AlgoBytes(const cublasLtMatmulAlgo_t& algo) {
  return std::string(reinterpret_cast<const char*>(&algo), sizeof(algo));
}

bool AlgoFromBytes(const std::string& bytes, cublasLtMatmulAlgo_t* algo) {
  if (bytes.size() != sizeof(cublasLtMatmulAlgo_t)) return false;
  std::memcpy(algo, bytes.data(), sizeof(*algo));
  return true;
}

// Whether cuBLASLt accepts `algo` for the call's problem within our workspace; *result gets its
// check (state, workspace size).
bool AlgoFits(const MatmulCall& call, const cublasLtMatmulAlgo_t& algo, cublasLtMatmulHeuristicResult_t* result) {
  *result = {};
  return cublasLtMatmulAlgoCheck(call.handle, call.desc, call.a, call.b, call.c, call.d, &algo, result) ==
             CUBLAS_STATUS_SUCCESS &&
         result->state == CUBLAS_STATUS_SUCCESS && result->workspaceSize <= kWorkspaceBytes;
}

// One algorithm configuration attribute, or false where this algorithm has none of that size.
template <typename T>
bool GetConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr, T* value) {
  size_t written = 0;
  return cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, value, sizeof(T), &written) == CUBLAS_STATUS_SUCCESS &&
         written == sizeof(T);
}

// Configurations the heuristic did not list: its first two algorithms with each thread-block
// cluster shape of up to 8 CTAs, each tile among the listed candidates' and each custom option
// the algorithm has, as cublasLtMatmulAlgoCheck accepts them for this problem within the
// workspace. At most `limit`, those closest to a listed configuration first (the seed's tile and
// option with other cluster shapes, then other tiles, then other options). Larger clusters share
// more of each operand's tile loads (TMA multicast), which is what could lower a call's joules.
std::vector<cublasLtMatmulHeuristicResult_t> AlgoVariants(const MatmulCall& call,
                                                         const std::vector<cublasLtMatmulHeuristicResult_t>& listed,
                                                         int limit) {
  std::vector<cublasLtMatmulHeuristicResult_t> out;
  if (limit <= 0 || listed.empty()) return out;
  absl::flat_hash_set<std::string> seen;
  std::vector<uint32_t> tiles;
  for (const cublasLtMatmulHeuristicResult_t& r : listed) {
    seen.insert(AlgoBytes(r.algo));
    uint32_t tile = 0;
    if (GetConfig(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile) &&
        std::find(tiles.begin(), tiles.end(), tile) == tiles.end()) {
      tiles.push_back(tile);
    }
  }
  constexpr uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1,
                                    CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_1x4x1,
                                    CUBLASLT_CLUSTER_SHAPE_4x2x1, CUBLASLT_CLUSTER_SHAPE_2x4x1};
  for (size_t s = 0; s < std::min<size_t>(2, listed.size()) && int(out.size()) < limit; ++s) {
    const cublasLtMatmulAlgo_t& seed = listed[s].algo;
    uint32_t seed_tile = 0, seed_option = 0;
    int32_t option_max = 0;
    size_t written = 0;
    if (!GetConfig(seed, CUBLASLT_ALGO_CONFIG_TILE_ID, &seed_tile) ||
        !GetConfig(seed, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &seed_option) ||
        cublasLtMatmulAlgoCapGetAttribute(&seed, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &option_max,
                                          sizeof(option_max), &written) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    // (distance from the seed, tile, option): the seed's own pair first.
    std::vector<std::tuple<int, uint32_t, uint32_t>> pairs;
    for (uint32_t tile : tiles) {
      for (uint32_t option = 0; option <= uint32_t(std::max(option_max, 0)); ++option) {
        pairs.emplace_back(int(tile != seed_tile) + 2 * int(option != seed_option), tile, option);
      }
    }
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
    for (const auto& [distance, tile, option] : pairs) {
      for (uint16_t cluster : kClusters) {
        if (int(out.size()) >= limit) return out;
        cublasLtMatmulAlgo_t algo = seed;
        if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option,
                                                 sizeof(option)) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                 sizeof(cluster)) != CUBLAS_STATUS_SUCCESS) {
          continue;
        }
        cublasLtMatmulHeuristicResult_t check;
        if (!seen.insert(AlgoBytes(algo)).second || !AlgoFits(call, algo, &check)) continue;
        check.algo = algo;
        out.push_back(check);
      }
    }
  }
  return out;
}

// Times the heuristic's top kTuneCandidates algorithms on the problem; the fastest as a Choice
// (its variant: the algorithm's bytes), or, with a CostMeter on the Tuner, the cheapest by the meter
// among the fastest few (autotune::PickCheapest; e.g. joules a call at the power limit, each
// candidate run back to back for the meter's window). NotFound when the heuristic has none or all fail.
// The candidates write the caller's d, which the real call overwrites right after (stream order),
// so tuning needs no memory of its own; only a problem accumulating into d in place (beta != 0,
// no separate c) is timed on a zeroed scratch copy of d's extent, as d's contents must survive.
absl::StatusOr<autotune::Choice> TuneAlgo(const MatmulCall& call, const AlgoKey& key) {
  // With a meter, twice as many as it may re-rank are timed, so that it sees the fastest of more.
  const std::shared_ptr<autotune::CostMeter> meter = autotune::Tuner::Global().meter();
  const autotune::RerankPolicy policy = autotune::Tuner::Global().rerank_policy();
  const int n = meter == nullptr ? kTuneCandidates : std::max(kTuneCandidates, 2 * policy.max_candidates);
  SG_ASSIGN_OR_RETURN(std::vector<cublasLtMatmulHeuristicResult_t> candidates, Heuristic(call, key, n));
  if (candidates.empty()) return absl::NotFoundError("cuBLASLt has no algorithm for this GEMM");
  if (meter != nullptr) {
    const std::vector<cublasLtMatmulHeuristicResult_t> variants = AlgoVariants(call, candidates, policy.variants);
    candidates.insert(candidates.end(), variants.begin(), variants.end());
  }
  const LtPlan& l = *call.plan;
  std::optional<Scratch> scratch;
  void* d = const_cast<void*>(l.d.ptr);
  if (l.beta != 0.0f && l.c.ptr == l.d.ptr) {
    const int64_t bytes = ExtentBytes(l.d, l.batch);
    SG_ASSIGN_OR_RETURN(Scratch s, Scratch::Allocate(key.device, bytes));
    SG_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.get(), 0, size_t(bytes), call.stream));
    d = s.get();
    scratch.emplace(std::move(s));
  }
  const void* c_ptr = l.c.ptr == l.d.ptr ? d : l.c.ptr;
  absl::StatusOr<autotune::Choice> choice = autotune::PickCheapest(
      int(candidates.size()), [&](int i) { return TimeAlgo(call, candidates[size_t(i)].algo, d); },
      [&](int i) { return AlgoBytes(candidates[size_t(i)].algo); },
      [&](int i, int64_t calls) -> absl::StatusOr<double> {
        SG_ASSIGN_OR_RETURN(float ms, TimeCalls(call, candidates[size_t(i)].algo, c_ptr, d, int(calls)));
        return double(ms);
      },
      meter.get(), policy);
  // Nothing may still be writing the scratch when it goes back to the allocator.
  if (scratch.has_value()) SG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(call.stream));
  return choice;
}

// A recorded choice's bytes as an algorithm, if cuBLASLt accepts it for this problem (a table
// from another build of the same library version could still disagree).
bool AcceptRecorded(const MatmulCall& call, const std::string& bytes, cublasLtMatmulAlgo_t* algo) {
  cublasLtMatmulHeuristicResult_t check;
  return AlgoFromBytes(bytes, algo) && AlgoFits(call, *algo, &check);
}

// --- choosing the algorithm -----------------------------------------------------------------------

absl::Status NoAlgorithm(const AlgoKey& key) {
  return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for this GEMM (m=", key.m, " n=", key.n,
                                               " k=", key.k, " batch=", key.batch, ")"));
}

// The algorithm for `key`, looked up once per key and process: the heuristic's first, or for a
// tuned key the Tuner's choice (recorded, or measured now). Unimplemented when cuBLASLt has none.
absl::StatusOr<cublasLtMatmulAlgo_t> FindAlgo(const MatmulCall& call, const AlgoKey& key) {
  {
    absl::MutexLock lock(&g_algo_mu);
    auto it = AlgoCache().find(key);
    if (it != AlgoCache().end()) {
      if (!it->second.found) return NoAlgorithm(key);
      return it->second.algo;
    }
  }
  AlgoEntry entry;
  bool cache = true;
  if (key.tuned) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SG_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(call.stream, &capture));
    SG_ASSIGN_OR_RETURN(std::string device_name, DeviceName(key.device));
    const autotune::TuningKey tk{"gemm.cublaslt", device_name, LibraryVersion(), key.ProblemText()};
    std::optional<autotune::Choice> recorded = autotune::Tuner::Global().Find(tk);
    if (!recorded.has_value() && capture == cudaStreamCaptureStatusNone) {
      absl::StatusOr<autotune::Choice> tuned =
          autotune::Tuner::Global().GetOrTune(tk, [&] { return TuneAlgo(call, key); });
      if (!tuned.ok() && tuned.status().code() != absl::StatusCode::kNotFound) return tuned.status();
      if (tuned.ok()) recorded = *tuned;
    }
    entry.found = recorded.has_value() && AcceptRecorded(call, recorded->variant, &entry.algo);
    // Inside a capture an untuned problem runs the heuristic's choice, uncached: the next eager
    // call still tunes it.
    cache = capture == cudaStreamCaptureStatusNone;
  }
  if (!entry.found) {
    SG_ASSIGN_OR_RETURN(std::vector<cublasLtMatmulHeuristicResult_t> best, Heuristic(call, key, 1));
    entry.found = !best.empty();
    if (entry.found) entry.algo = best[0].algo;
  }
  if (cache) {
    absl::MutexLock lock(&g_algo_mu);
    AlgoCache().emplace(key, entry);
  }
  if (!entry.found) return NoAlgorithm(key);
  return entry.algo;
}

absl::Status RunPlan(const LtPlan& l, int device, bool tuned, cudaStream_t stream) {
  SG_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Enter(device));
  SG_ASSIGN_OR_RETURN(cublasLtHandle_t handle, Handle(device));
  SG_ASSIGN_OR_RETURN(void* workspace, Workspace(device, stream));

  cublasLtMatmulDesc_t raw_desc = nullptr;
  SG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DescPtr desc(raw_desc, &cublasLtMatmulDescDestroy);
  SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(l.op_a)));
  SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(l.op_b)));
  if (l.sm_count > 0) SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t(l.sm_count)));
  if (l.bias != nullptr) {
    SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS)));
    SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, l.bias));
    SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(l.bias_type)));
  }
  if (l.alpha_vector != nullptr) {
    SG_RETURN_IF_ERROR(SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_POINTER_MODE,
                               int32_t(CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO)));
  }
  SG_ASSIGN_OR_RETURN(LayoutPtr a, MakeLayout(l.a, l.batch));
  SG_ASSIGN_OR_RETURN(LayoutPtr b, MakeLayout(l.b, l.batch));
  SG_ASSIGN_OR_RETURN(LayoutPtr d, MakeLayout(l.d, l.batch));
  LayoutPtr c_owned(nullptr, &cublasLtMatrixLayoutDestroy);
  cublasLtMatrixLayout_t c = d.get();
  if (l.c.ptr != l.d.ptr) {
    SG_ASSIGN_OR_RETURN(c_owned, MakeLayout(l.c, l.batch));
    c = c_owned.get();
  }

  const void* alpha = l.alpha_vector != nullptr ? static_cast<const void*>(l.alpha_vector) : &l.alpha;
  const MatmulCall call{handle, raw_desc, a.get(), b.get(), c, d.get(), &l, alpha, workspace, stream};
  SG_ASSIGN_OR_RETURN(cublasLtMatmulAlgo_t algo, FindAlgo(call, KeyOf(l, device, tuned)));
  SG_CUBLAS_RETURN_IF_ERROR(call.Run(algo, l.c.ptr, const_cast<void*>(l.d.ptr)));
  return absl::OkStatus();
}

}  // namespace

std::string DescribeAlgoCuda(const std::string& variant) {
  cublasLtMatmulAlgo_t algo;
  if (!AlgoFromBytes(variant, &algo)) return "";
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, option = 0, stages = 0;
  uint16_t cluster = 0;
  if (!GetConfig(algo, CUBLASLT_ALGO_CONFIG_ID, &id) || !GetConfig(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile) ||
      !GetConfig(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster) ||
      !GetConfig(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option) ||
      !GetConfig(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages) ||
      !GetConfig(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk)) {
    return "";
  }
  return absl::StrCat("algo ", id, " tile ", tile, " cluster ", cluster, " option ", option, " stages ", stages,
                      " splitk ", splitk);
}

void ResetAlgoCacheCuda() {
  absl::MutexLock lock(&g_algo_mu);
  AlgoCache().clear();
}

absl::Status GemmCuda(const Problem& p, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.row_scale == nullptr) return RunPlan(SwappedPlan(p), device, p.tuned, s);
  if (p.row_scale_in_epilogue && p.alpha == 1.0f) {
    // Any failure here happens before cuBLASLt writes d; the swapped plan below rewrites all of d
    // (beta is 0 with a row scale) and reports a real error (bad pointer, bad stream) itself.
    if (RunPlan(RowScalePlan(p), device, p.tuned, s).ok()) return absl::OkStatus();
  }
  SG_RETURN_IF_ERROR(RunPlan(SwappedPlan(p), device, p.tuned, s));
  return ScaleRowsCuda(const_cast<void*>(p.d.data), p.d_dtype, p.batch, p.m, p.n, p.d.ld, p.d.batch_stride,
                       p.row_scale, stream);
}

}  // namespace sg::kernels::gemm_internal

#endif  // SG_WITH_CUDA
