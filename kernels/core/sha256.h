// SHA-256 (FIPS 180-4), for stable content hashes that agree across processes and machines
// (the compile cache's keys and checksums, the store's HMAC authentication). absl::Hash is
// per-process and must not be persisted.
//
//   std::string hex = sg::Sha256Hex("abc");  // "ba7816bf8f01cfea..."
//   Sha256 h; h.Update(part1); h.Update(part2); std::string digest = h.Finish();  // 32 bytes
#ifndef SGTRAIN_KERNELS_CORE_SHA256_H_
#define SGTRAIN_KERNELS_CORE_SHA256_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace sg {

class Sha256 {
 public:
  Sha256();
  void Update(absl::string_view data);
  // The 32-byte digest. The object must not be updated afterwards.
  std::string Finish();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

// The 32-byte digest of `data`, and its lower-case hex.
std::string Sha256Digest(absl::string_view data);
std::string Sha256Hex(absl::string_view data);
std::string ToHex(absl::string_view bytes);

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_SHA256_H_
