#include "trainer/checkpoint/content_hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sg::trainer {
namespace {

constexpr uint64_t kP1 = 0x9e3779b185ebca87ull;
constexpr uint64_t kP2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kP3 = 0x165667b19e3779f9ull;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Load64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);  // little-endian on every host
  return v;
}
inline uint64_t Mix(uint64_t lane, uint64_t word) { return Rotl(lane + word * kP2, 31) * kP1; }

}  // namespace

ContentHasher::ContentHasher() : lanes_{kP1 + kP2, kP2, 0, 0 - kP1} {}

void ContentHasher::Update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (pending_size_ > 0) {
    const size_t take = std::min(n, 32 - pending_size_);
    std::memcpy(pending_ + pending_size_, p, take);
    pending_size_ += take;
    p += take;
    n -= take;
    if (pending_size_ < 32) return;
    for (int i = 0; i < 4; ++i) lanes_[i] = Mix(lanes_[i], Load64(pending_ + 8 * i));
    pending_size_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32) {
    for (int i = 0; i < 4; ++i) lanes_[i] = Mix(lanes_[i], Load64(p + 8 * i));
  }
  std::memcpy(pending_, p, n);
  pending_size_ = n;
}

uint64_t ContentHasher::Finish() const {
  uint64_t h = Rotl(lanes_[0], 1) + Rotl(lanes_[1], 7) + Rotl(lanes_[2], 12) + Rotl(lanes_[3], 18);
  for (int i = 0; i < 4; ++i) h = (h ^ Mix(0, lanes_[i])) * kP1 + kP3;
  h += total_;
  size_t i = 0;
  for (; i + 8 <= pending_size_; i += 8) h = Rotl(h ^ Mix(0, Load64(pending_ + i)), 27) * kP1 + kP3;
  for (; i < pending_size_; ++i) h = Rotl(h ^ (uint64_t(pending_[i]) * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t ContentHash(const void* data, size_t n) {
  ContentHasher h;
  h.Update(data, n);
  return h.Finish();
}

absl::StatusOr<std::string> HashFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string msg = absl::StrCat("cannot open '", path, "' to hash it: ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  ContentHasher h;
  std::vector<char> buf(size_t(4) << 20);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot read '", path, "': ", std::strerror(err)));
    }
    if (n == 0) break;
    h.Update(buf.data(), size_t(n));
  }
  ::close(fd);
  return absl::StrFormat("sg64:%016x", h.Finish());
}

}  // namespace sg::trainer
