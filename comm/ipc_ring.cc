#include "comm/ipc_ring.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/core/status.h"

#ifdef SG_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/ipc_kernels.h"
#endif

namespace sg::comm::internal {

#ifdef SG_WITH_CUDA

namespace {

constexpr int kSlots = 2;        // signal slots: kReady (predecessor -> successor), kDone (back)
constexpr int kReady = 0, kDone = 1;
constexpr int kMailbox = 64;     // mailbox entries per member and channel (operations in flight)
constexpr int kChannels = 2;     // collectives (numbered by the group's sequence) and SendRecv
constexpr int kMaxMembers = 32;  // kMailbox bounds the host lag between members for up to 32

// One member's buffers for one collective, as the peers need them to map the memory.
struct MailboxEntry {
  std::atomic<int64_t> seq;  // written last (release); -1 never matches
  int64_t offset[2];
  int64_t bytes[2];  // what the caller said the buffer holds (SendRecv checks it against the receive)
  cudaIpcMemHandle_t handle[2];
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the mailbox lives in shared memory");

// Two driver queries, through the runtime's entry-point lookup (no link-time libcuda dependency).
using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using GetPointerAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);

template <typename Fn>
absl::StatusOr<Fn> DriverFn(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  SG_CUDA_RETURN_IF_ERROR(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
  if (p == nullptr || q != cudaDriverEntryPointSuccess) {
    return absl::InternalError(absl::StrCat("ipc: the CUDA driver has no ", name));
  }
  return reinterpret_cast<Fn>(p);
}

std::string HandleKey(const cudaIpcMemHandle_t& h) { return std::string(h.reserved, sizeof(h.reserved)); }

}  // namespace

struct IpcRing::Impl {
  Device device;
  IpcConfig config;
  int prev = 0, next = 0;
  // This rank's signal memory: flags[kSlots][size] (peers write), then sent and waited counts.
  uint64_t* signals = nullptr;
  uint64_t* flags = nullptr;
  uint64_t* sent = nullptr;
  uint64_t* waited = nullptr;
  // Each member's flags, mapped (only the ring neighbours are opened).
  std::vector<uint64_t*> peer_flags;
  // Host-mapped words: abort (int) and error (int64[4]).
  int* abort_host = nullptr;
  int64_t* error_host = nullptr;
  int* abort_dev = nullptr;
  int64_t* error_dev = nullptr;
  // The shared mailbox: size x kMailbox entries.
  MailboxEntry* mailbox = nullptr;
  size_t mailbox_bytes = 0;
  absl::flat_hash_map<std::string, char*> opened;  // a peer allocation's handle -> its mapping
  // Our allocations' handles by the driver's process-wide unique buffer id (a freed and reused
  // address gets a new id, so a cached handle is never stale). After the first collective on a
  // buffer, publishing it makes no call that a CUDA graph capture could refuse.
  absl::flat_hash_map<uint64_t, cudaIpcMemHandle_t> exported;
  GetAddressRange address_range = nullptr;
  GetPointerAttribute pointer_attribute = nullptr;
  bool failed = false;  // a wait failed: leave device memory alone at destruction
  // Streams and events for split copies (config.copy_splits - 1 of each, plus the fork event).
  std::vector<cudaStream_t> side;
  std::vector<cudaEvent_t> joined;
  cudaEvent_t fork = nullptr;

  // A pull of `bytes` from a peer's memory, on `s` (and the side streams when split).
  absl::Status Copy(char* out, const char* theirs, int64_t bytes, cudaStream_t s) {
    const int k = int(side.size()) + 1;
    if (k == 1 || !config.copy_engine || bytes < (int64_t(16) << 20)) {
      return ipc::LaunchPullCopy(out, theirs, bytes, config.blocks, config.copy_engine, s);
    }
    const int64_t piece = ((bytes + k - 1) / k + 255) / 256 * 256;
    SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork, s));
    for (int i = 1; i < k; ++i) {
      const int64_t begin = std::min(bytes, i * piece), end = std::min(bytes, begin + piece);
      cudaStream_t t = side[size_t(i - 1)];
      SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(t, fork, 0));
      if (end > begin) {
        SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out + begin, theirs + begin, size_t(end - begin),
                                                cudaMemcpyDeviceToDevice, t));
      }
      SG_CUDA_RETURN_IF_ERROR(cudaEventRecord(joined[size_t(i - 1)], t));
    }
    SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, theirs, size_t(std::min(bytes, piece)), cudaMemcpyDeviceToDevice, s));
    for (cudaEvent_t e : joined) SG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, e, 0));
    return absl::OkStatus();
  }

  MailboxEntry& Entry(int member, int channel, int64_t seq) {
    return mailbox[(size_t(member) * kChannels + size_t(channel)) * kMailbox + size_t(seq % kMailbox)];
  }

  // Publishes our buffers for operation `seq` of `channel` (up to two; null entries are skipped).
  absl::Status Publish(int64_t seq, const void* a, const void* b, int channel = 0, int64_t a_bytes = 0,
                       int64_t b_bytes = 0) {
    MailboxEntry& e = Entry(rank, channel, seq);
    e.bytes[0] = a_bytes;
    e.bytes[1] = b_bytes;
    const void* ptrs[2] = {a, b};
    for (int i = 0; i < 2; ++i) {
      if (ptrs[i] == nullptr) continue;
      const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(ptrs[i]);
      CUdeviceptr base = 0;
      size_t bytes = 0;
      uint64_t id = 0;
      CUresult rc = address_range(&base, &bytes, ptr);
      if (rc == CUDA_SUCCESS) rc = pointer_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr);
      if (rc != CUDA_SUCCESS) {
        return absl::InvalidArgumentError(absl::StrCat("ipc: buffer ", absl::Hex(uintptr_t(ptr)),
                                                       " is not in a device allocation (CUDA driver error ",
                                                       int(rc), ")"));
      }
      auto it = exported.find(id);
      if (it == exported.end()) {
        cudaIpcMemHandle_t h;
        SG_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
        it = exported.emplace(id, h).first;
      }
      e.handle[i] = it->second;
      e.offset[i] = int64_t(ptr - base);
    }
    e.seq.store(seq, std::memory_order_release);
    return absl::OkStatus();
  }

  // The device pointers `member` published for `seq`, mapped here.
  absl::Status Lookup(int member, int64_t seq, const IpcCheck& check, char* out[2], bool want_second,
                      int channel = 0, int64_t* bytes = nullptr) {
    MailboxEntry& e = Entry(member, channel, seq);
    int spins = 0;
    while (e.seq.load(std::memory_order_acquire) != seq) {
      if (++spins % 1024 == 0) SG_RETURN_IF_ERROR(check());
      std::this_thread::yield();
    }
    for (int i = 0; i < (want_second ? 2 : 1); ++i) {
      const std::string k = HandleKey(e.handle[i]);
      auto it = opened.find(k);
      if (it == opened.end()) {
        void* p = nullptr;
        SG_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&p, e.handle[i], cudaIpcMemLazyEnablePeerAccess));
        it = opened.emplace(k, static_cast<char*>(p)).first;
      }
      out[i] = it->second + e.offset[i];
    }
    if (bytes != nullptr) {
      bytes[0] = e.bytes[0];
      bytes[1] = e.bytes[1];
    }
    return absl::OkStatus();
  }

  // Signals and waits, launched as few sync kernels as their number allows.
  struct Sync {
    std::vector<std::pair<int, int>> signals, waits;  // (member, slot)
  };
  absl::Status Launch(const Sync& s, int64_t seq, cudaStream_t stream) {
    size_t si = 0, wi = 0;
    while (si < s.signals.size() || wi < s.waits.size()) {
      ipc::SyncArgs a;
      for (; si < s.signals.size() && a.nsignal < ipc::kMaxSyncs; ++si, ++a.nsignal) {
        const auto [peer, slot] = s.signals[si];
        a.signal_remote[a.nsignal] = peer_flags[size_t(peer)] + slot * size_ + rank;
        a.signal_count[a.nsignal] = sent + slot * size_ + peer;
      }
      for (; wi < s.waits.size() && a.nwait < ipc::kMaxSyncs; ++wi, ++a.nwait) {
        const auto [peer, slot] = s.waits[wi];
        a.wait_flag[a.nwait] = flags + slot * size_ + peer;
        a.wait_count[a.nwait] = waited + slot * size_ + peer;
        a.wait_peer[a.nwait] = peer;
        a.wait_slot[a.nwait] = slot;
      }
      a.abort = abort_dev;
      a.error = error_dev;
      a.seq = seq;
      a.timeout_ns = absl::ToInt64Nanoseconds(config.timeout);
      SG_RETURN_IF_ERROR(ipc::LaunchSync(a, stream));
    }
    return absl::OkStatus();
  }

  int rank = 0, size_ = 1;
};

absl::StatusOr<std::unique_ptr<IpcRing>> IpcRing::Create(StoreClient& store, const std::string& key, int rank,
                                                         int size, Device device, bool wanted, IpcConfig config,
                                                         absl::Time deadline, std::string* why_not) {
  SG_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "ipc ring: rank ", rank, " of ", size);
  SG_CHECK_ARG(device.is_cuda(), "ipc ring: device must be CUDA, found ", device.ToString());
  auto ring = std::unique_ptr<IpcRing>(new IpcRing());
  ring->rank_ = rank;
  ring->size_ = size;
  ring->impl_ = std::make_unique<Impl>();
  Impl& m = *ring->impl_;
  m.device = device;
  m.config = config;
  m.rank = rank;
  m.size_ = size;
  m.prev = (rank + size - 1) % size;
  m.next = (rank + 1) % size;
  SG_ASSIGN_OR_RETURN(m.address_range, DriverFn<GetAddressRange>("cuMemGetAddressRange"));
  SG_ASSIGN_OR_RETURN(m.pointer_attribute, DriverFn<GetPointerAttribute>("cuPointerGetAttribute"));
  int prev_dev = 0;
  SG_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev_dev));
  SG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.ordinal));
  struct Restore {
    int d;
    ~Restore() { cudaSetDevice(d); }
  } restore{prev_dev};

  // 1. Signal memory and host-mapped words (every member, so the exchange below is uniform).
  const size_t words = size_t(3) * kSlots * size_t(size);
  SG_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&m.signals), words * sizeof(uint64_t)));
  SG_CUDA_RETURN_IF_ERROR(cudaMemset(m.signals, 0, words * sizeof(uint64_t)));
  SG_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  m.flags = m.signals;
  m.sent = m.signals + kSlots * size;
  m.waited = m.signals + 2 * kSlots * size;
  SG_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&m.abort_host), 64, cudaHostAllocMapped));
  std::memset(m.abort_host, 0, 64);
  m.error_host = reinterpret_cast<int64_t*>(m.abort_host) + 2;
  SG_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.abort_dev), m.abort_host, 0));
  m.error_dev = reinterpret_cast<int64_t*>(m.abort_dev) + 2;
  cudaIpcMemHandle_t flags_handle;
  SG_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&flags_handle, m.signals));

  // Split copies' streams and events.
  for (int i = 1; i < std::max(1, config.copy_splits); ++i) {
    cudaStream_t t = nullptr;
    cudaEvent_t e = nullptr;
    SG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    m.side.push_back(t);
    SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    m.joined.push_back(e);
  }
  SG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.fork, cudaEventDisableTiming));

  // 2. Who we are: host, device, whether we want the path, our flags' handle, process. Keys carry
  // the number of rings this rank made under `key` (the same on every member), so a group made
  // again under the same name does not read the last one's entries.
  SG_ASSIGN_OR_RETURN(const int64_t generation, store.Add(absl::StrCat(key, "/made/", rank), 1, deadline));
  const std::string k = absl::StrCat(key, "/", generation);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  SG_RETURN_IF_ERROR(store.Set(absl::StrCat(k, "/info/", rank),
                               absl::StrCat(host, ";", device.ordinal, ";", wanted ? 1 : 0, ";",
                                            absl::BytesToHexString(HandleKey(flags_handle)), ";", getpid()),
                               deadline));
  std::vector<std::vector<std::string>> info(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    SG_ASSIGN_OR_RETURN(std::string v, store.Get(absl::StrCat(k, "/info/", r), deadline));
    info[size_t(r)] = absl::StrSplit(v, ';');
    if (info[size_t(r)].size() != 5) {
      return absl::InternalError(absl::StrCat("ipc ring: malformed member info from rank ", r, ": '", v, "'"));
    }
  }
  // 3. The verdict, the same on every member: each checks its own pulls (from prev), publishes,
  // and all read every verdict.
  std::string mine = "ok";
  if (size > std::min(kMaxMembers, config.max_members)) {
    mine = absl::StrCat(size, " members: the IPC ring is used for up to ", std::min(kMaxMembers, config.max_members),
                        " (IpcConfig::max_members)");
  }
  for (int r = 0; r < size && mine == "ok"; ++r) {
    if (info[size_t(r)][2] != "1") mine = absl::StrCat("rank ", r, " did not ask for the IPC path");
    if (info[size_t(r)][0] != info[0][0]) mine = absl::StrCat("ranks 0 and ", r, " are on different hosts");
    if (r != rank && info[size_t(r)][4] == info[size_t(rank)][4]) {
      mine = absl::StrCat("ranks ", rank, " and ", r, " are one process (CUDA IPC maps other processes' memory)");
    }
  }
  int prev_ordinal = 0;
  if (mine == "ok" && !absl::SimpleAtoi(info[size_t(m.prev)][1], &prev_ordinal)) mine = "bad device ordinal";
  if (mine == "ok" && prev_ordinal != device.ordinal) {
    int can = 0;
    SG_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device.ordinal, prev_ordinal));
    if (!can) mine = absl::StrCat("cuda:", device.ordinal, " cannot access cuda:", prev_ordinal);
  }
  SG_RETURN_IF_ERROR(store.Set(absl::StrCat(k, "/verdict/", rank), mine, deadline));
  for (int r = 0; r < size; ++r) {
    SG_ASSIGN_OR_RETURN(std::string v, store.Get(absl::StrCat(k, "/verdict/", r), deadline));
    if (v != "ok") {
      *why_not = absl::StrCat("rank ", r, ": ", v);
      return std::unique_ptr<IpcRing>();  // the destructor frees what step 1 made
    }
  }

  // 4. The mailbox: member 0 creates the shared memory, the others open it, member 0 unlinks it
  // once everyone has (nothing is left in /dev/shm, even if a rank dies later).
  m.mailbox_bytes = size_t(size) * kChannels * kMailbox * sizeof(MailboxEntry);
  std::string shm_name;
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    shm_name = absl::StrCat("/sg-ipc-", getpid(), "-", absl::Hex(uint64_t(rd()) << 32 | rd()));
    fd = shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("ipc ring: shm_open ", shm_name, ": ", strerror(errno)));
    if (ftruncate(fd, off_t(m.mailbox_bytes)) != 0) {
      close(fd);
      shm_unlink(shm_name.c_str());
      return absl::InternalError(absl::StrCat("ipc ring: ftruncate ", shm_name, ": ", strerror(errno)));
    }
    SG_RETURN_IF_ERROR(store.Set(absl::StrCat(k, "/shm"), shm_name, deadline));
  } else {
    SG_ASSIGN_OR_RETURN(shm_name, store.Get(absl::StrCat(k, "/shm"), deadline));
    fd = shm_open(shm_name.c_str(), O_RDWR, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("ipc ring: shm_open ", shm_name, ": ", strerror(errno)));
  }
  void* map = mmap(nullptr, m.mailbox_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("ipc ring: mmap ", shm_name, ": ", strerror(errno)));
  m.mailbox = static_cast<MailboxEntry*>(map);
  if (rank == 0) {
    for (size_t i = 0; i < size_t(size) * kChannels * kMailbox; ++i) {
      m.mailbox[i].seq.store(-1, std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    SG_RETURN_IF_ERROR(store.Set(absl::StrCat(k, "/shm_ready"), "1", deadline));
  } else {
    SG_RETURN_IF_ERROR(store.Get(absl::StrCat(k, "/shm_ready"), deadline).status());
  }
  SG_ASSIGN_OR_RETURN(int64_t opened, store.Add(absl::StrCat(k, "/shm_opened"), 1, deadline));
  (void)opened;
  if (rank == 0) {
    while (true) {
      SG_ASSIGN_OR_RETURN(int64_t n, store.Add(absl::StrCat(k, "/shm_opened"), 0, deadline));
      if (n >= size) break;
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("ipc ring: members did not open the mailbox");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    shm_unlink(shm_name.c_str());
  }

  // 5. The neighbours' signal memory.
  m.peer_flags.assign(size_t(size), nullptr);
  for (int p : {m.prev, m.next}) {
    if (p == rank || m.peer_flags[size_t(p)] != nullptr) continue;
    cudaIpcMemHandle_t h;
    const std::string bytes = absl::HexStringToBytes(info[size_t(p)][3]);
    if (bytes.size() != sizeof(h.reserved)) {
      return absl::InternalError(absl::StrCat("ipc ring: rank ", p, "'s signal handle has ", bytes.size(),
                                              " bytes, expected ", sizeof(h.reserved)));
    }
    std::memcpy(h.reserved, bytes.data(), sizeof(h.reserved));
    void* ptr = nullptr;
    SG_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
    m.peer_flags[size_t(p)] = static_cast<uint64_t*>(ptr);
  }
  // Every member has mapped its neighbours before anyone signals.
  SG_ASSIGN_OR_RETURN(int64_t arrived, store.Add(absl::StrCat(k, "/mapped"), 1, deadline));
  while (arrived < size) {
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("ipc ring: members did not map their neighbours");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    SG_ASSIGN_OR_RETURN(arrived, store.Add(absl::StrCat(k, "/mapped"), 0, deadline));
  }
  return ring;
}

IpcRing::~IpcRing() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (m.mailbox != nullptr) munmap(m.mailbox, m.mailbox_bytes);
  // After a failed wait a peer's kernels may still be stuck reading our memory, and freeing device
  // memory waits for the device: leave it (the process is going down with the error).
  if (m.failed || (m.error_host != nullptr && m.error_host[0] != ipc::kNoError)) return;
  int prev_dev = 0;
  cudaGetDevice(&prev_dev);
  cudaSetDevice(m.device.ordinal);
  for (auto& [k, p] : m.opened) cudaIpcCloseMemHandle(p);
  for (uint64_t* p : m.peer_flags) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
  }
  for (cudaStream_t t : m.side) cudaStreamDestroy(t);
  for (cudaEvent_t e : m.joined) cudaEventDestroy(e);
  if (m.fork != nullptr) cudaEventDestroy(m.fork);
  if (m.signals != nullptr) cudaFree(m.signals);
  if (m.abort_host != nullptr) cudaFreeHost(m.abort_host);
  cudaSetDevice(prev_dev);
}

absl::Status IpcRing::Error() const {
  const Impl& m = *impl_;
  const volatile int64_t* e = m.error_host;
  if (e == nullptr || e[0] == ipc::kNoError) return absl::OkStatus();
  const int64_t code = e[0], seq = e[1], peer = e[2], slot = e[3];
  const std::string what = slot == kReady ? "its data" : "it to finish reading ours";
  if (code == ipc::kAborted) {
    return absl::AbortedError(absl::StrCat("ipc collective #", seq, " on rank ", rank_, ": aborted while waiting for rank ",
                                           peer, " (", what, ")"));
  }
  return absl::DeadlineExceededError(absl::StrCat("ipc collective #", seq, " on rank ", rank_, ": rank ", peer,
                                                  " did not arrive within ", absl::FormatDuration(m.config.timeout),
                                                  " (waiting in the device for ", what, ")"));
}

void IpcRing::Abort() {
  Impl& m = *impl_;
  if (m.abort_host == nullptr) return;
  *reinterpret_cast<volatile int*>(m.abort_host) = 1;
  m.failed = true;
}

absl::Status IpcRing::AllReduce(char* buf, DType dtype, const std::vector<int64_t>& counts, ReduceOp op,
                                float final_scale, int64_t seq, const Stream& stream, const IpcCheck& check) {
  SG_RETURN_IF_ERROR(Error());  // a failed group fails fast
  Impl& m = *impl_;
  const int n = size_, r = rank_;
  SG_CHECK_ARG(int(counts.size()) == n, "ipc all_reduce: ", counts.size(), " segment counts for ", n, " ranks");
  const int64_t esize = SizeOf(dtype);
  std::vector<int64_t> offset(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) offset[size_t(i) + 1] = offset[size_t(i)] + counts[size_t(i)];
  SG_RETURN_IF_ERROR(m.Publish(seq, buf, nullptr));
  char* theirs[2] = {nullptr, nullptr};
  SG_RETURN_IF_ERROR(m.Lookup(m.prev, seq, check, theirs, false));
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  auto seg = [&](int i) { return ((i % n) + n) % n; };
  // Steps (see ipc_ring.h): our input ready -> successor; predecessor's ready.
  Impl::Sync sync{{{m.next, kReady}}, {{m.prev, kReady}}};
  SG_RETURN_IF_ERROR(m.Launch(sync, seq, s));
  // Reduce-scatter: at step k pull-reduce segment r-k-2 of the predecessor (its partial sum of
  // step k-1) into ours; we end owning segment r, scaled.
  for (int k = 0; k < n - 1; ++k) {
    const int g = seg(r - k - 2);
    const bool last = k == n - 2;
    char* p = buf + offset[size_t(g)] * esize;
    SG_RETURN_IF_ERROR(ipc::LaunchPullReduce(dtype, op, p, p, theirs[0] + offset[size_t(g)] * esize,
                                             counts[size_t(g)], last ? final_scale : 1.0f, m.config.blocks, s));
    sync = Impl::Sync{{{m.next, kReady}}, {{m.prev, kReady}}};
    if (last) {  // the successor must be done reading our partial sums before all-gather writes them
      sync.signals.push_back({m.prev, kDone});
      sync.waits.push_back({m.next, kDone});
    }
    SG_RETURN_IF_ERROR(m.Launch(sync, seq, s));
  }
  // All-gather: at step k copy segment r-k-1 from the predecessor (which owns or received it).
  for (int k = 0; k < n - 1; ++k) {
    const int g = seg(r - k - 1);
    SG_RETURN_IF_ERROR(m.Copy(buf + offset[size_t(g)] * esize, theirs[0] + offset[size_t(g)] * esize,
                              counts[size_t(g)] * esize, s));
    if (k < n - 2) SG_RETURN_IF_ERROR(m.Launch(Impl::Sync{{{m.next, kReady}}, {{m.prev, kReady}}}, seq, s));
  }
  // The successor has finished reading our buffer before the caller may touch it.
  return m.Launch(Impl::Sync{{{m.prev, kDone}}, {{m.next, kDone}}}, seq, s);
}

absl::Status IpcRing::ReduceScatter(const char* input, char* out, DType dtype, int64_t count, ReduceOp op,
                                    float scale, int64_t seq, const Stream& stream, const IpcCheck& check,
                                    DType out_dtype) {
  SG_RETURN_IF_ERROR(Error());  // a failed group fails fast
  SG_CHECK_ARG(size_ == 2, "ipc reduce_scatter: two members only, found ", size_);
  const bool widen = dtype == DType::kBF16 && out_dtype == DType::kF32;
  SG_CHECK_ARG(widen || out_dtype == dtype, "ipc reduce_scatter: the output must have the input's dtype ",
               DTypeName(dtype), " (or f32 for bf16), found ", DTypeName(out_dtype));
  Impl& m = *impl_;
  const int64_t off = rank_ * count * SizeOf(dtype);
  SG_RETURN_IF_ERROR(m.Publish(seq, input, nullptr));
  char* theirs[2] = {nullptr, nullptr};
  SG_RETURN_IF_ERROR(m.Lookup(m.prev, seq, check, theirs, false));
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  const int peer = m.prev;
  SG_RETURN_IF_ERROR(m.Launch(Impl::Sync{{{peer, kReady}}, {{peer, kReady}}}, seq, s));
  if (widen) {
    SG_RETURN_IF_ERROR(ipc::LaunchPullReduceWiden(op, reinterpret_cast<float*>(out), input + off, theirs[0] + off,
                                                  count, scale, m.config.blocks, s));
  } else {
    SG_RETURN_IF_ERROR(ipc::LaunchPullReduce(dtype, op, out, input + off, theirs[0] + off, count, scale,
                                             m.config.blocks, s));
  }
  return m.Launch(Impl::Sync{{{peer, kDone}}, {{peer, kDone}}}, seq, s);
}

absl::Status IpcRing::AllGather(const char* input, char* out, int64_t block_bytes, int64_t seq,
                                const Stream& stream, const IpcCheck& check, bool copy_own) {
  SG_RETURN_IF_ERROR(Error());  // a failed group fails fast
  Impl& m = *impl_;
  const int n = size_, r = rank_;
  SG_RETURN_IF_ERROR(m.Publish(seq, input, out));
  char* theirs[2] = {nullptr, nullptr};
  SG_RETURN_IF_ERROR(m.Lookup(m.prev, seq, check, theirs, true));
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  auto seg = [&](int i) { return ((i % n) + n) % n; };
  SG_RETURN_IF_ERROR(m.Launch(Impl::Sync{{{m.next, kReady}}, {{m.prev, kReady}}}, seq, s));
  // Step k copies block r-k-1: at k = 0 from the predecessor's input (its own block), later from
  // its output (the block it copied at step k-1). Our own block is never read by a peer from our
  // output, so its local copy has no ordering with the pulls.
  for (int k = 0; k < n - 1; ++k) {
    const int g = seg(r - k - 1);
    const char* from = k == 0 ? theirs[0] : theirs[1] + g * block_bytes;
    SG_RETURN_IF_ERROR(m.Copy(out + g * block_bytes, from, block_bytes, s));
    if (k < n - 2) SG_RETURN_IF_ERROR(m.Launch(Impl::Sync{{{m.next, kReady}}, {{m.prev, kReady}}}, seq, s));
  }
  char* own = out + r * block_bytes;
  if (copy_own && own != input) {
    SG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(own, input, size_t(block_bytes), cudaMemcpyDeviceToDevice, s));
  }
  return m.Launch(Impl::Sync{{{m.prev, kDone}}, {{m.next, kDone}}}, seq, s);
}

absl::Status IpcRing::Exchange(const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes, int64_t seq,
                               const Stream& stream, const IpcCheck& check) {
  SG_RETURN_IF_ERROR(Error());  // a failed group fails fast
  SG_CHECK_ARG(size_ == 2, "ipc sendrecv: two members only, found ", size_);
  Impl& m = *impl_;
  SG_RETURN_IF_ERROR(m.Publish(seq, send, nullptr, /*channel=*/1, send_bytes, recv_bytes));
  char* theirs[2] = {nullptr, nullptr};
  int64_t their[2] = {0, 0};  // the peer's send and receive sizes
  SG_RETURN_IF_ERROR(m.Lookup(m.prev, seq, check, theirs, false, /*channel=*/1, their));
  // Both members check both directions, so both refuse (and neither launches a wait).
  if (their[0] != recv_bytes || their[1] != send_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc sendrecv #", seq, ": sizes disagree: rank ", rank_, " sends ", send_bytes, " B and receives ", recv_bytes,
        " B, rank ", m.prev, " sends ", their[0], " B and receives ", their[1], " B"));
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  const int peer = m.prev;
  SG_RETURN_IF_ERROR(m.Launch(Impl::Sync{{{peer, kReady}}, {{peer, kReady}}}, seq, s));
  SG_RETURN_IF_ERROR(m.Copy(recv, theirs[0], recv_bytes, s));
  return m.Launch(Impl::Sync{{{peer, kDone}}, {{peer, kDone}}}, seq, s);
}

#else  // !SG_WITH_CUDA

struct IpcRing::Impl {};

absl::StatusOr<std::unique_ptr<IpcRing>> IpcRing::Create(StoreClient&, const std::string&, int, int, Device, bool,
                                                         IpcConfig, absl::Time, std::string* why_not) {
  *why_not = "built without CUDA";
  return std::unique_ptr<IpcRing>();
}
IpcRing::~IpcRing() = default;
absl::Status IpcRing::Error() const { return absl::OkStatus(); }
void IpcRing::Abort() {}
absl::Status IpcRing::AllReduce(char*, DType, const std::vector<int64_t>&, ReduceOp, float, int64_t, const Stream&,
                                const IpcCheck&) {
  return absl::FailedPreconditionError("ipc ring: built without CUDA");
}
absl::Status IpcRing::ReduceScatter(const char*, char*, DType, int64_t, ReduceOp, float, int64_t, const Stream&,
                                    const IpcCheck&, DType) {
  return absl::FailedPreconditionError("ipc ring: built without CUDA");
}
absl::Status IpcRing::AllGather(const char*, char*, int64_t, int64_t, const Stream&, const IpcCheck&, bool) {
  return absl::FailedPreconditionError("ipc ring: built without CUDA");
}
absl::Status IpcRing::Exchange(const char*, int64_t, char*, int64_t, int64_t, const Stream&, const IpcCheck&) {
  return absl::FailedPreconditionError("ipc ring: built without CUDA");
}

#endif

}  // namespace sg::comm::internal
