// A fast 64-bit content hash for detecting corrupted checkpoint files (a flipped byte, a truncated
// or swapped file). Not cryptographic: it guards against accidents, not against an attacker.
//
//   ContentHasher h;  h.Update(data, n);  uint64_t v = h.Finish();
//   SG_ASSIGN_OR_RETURN(std::string hex, HashFile("/ckpt/model.safetensors"));  // "sg64:0123...ef"
#ifndef SGTRAIN_TRAINER_CHECKPOINT_CONTENT_HASH_H_
#define SGTRAIN_TRAINER_CHECKPOINT_CONTENT_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sg::trainer {

// Streaming: the result depends only on the concatenated bytes, not on how Update splits them.
// Four independent multiply-rotate lanes over 32-byte stripes, then a final avalanche, so every
// input bit affects every output bit.
class ContentHasher {
 public:
  ContentHasher();
  void Update(const void* data, size_t n);
  uint64_t Finish() const;

 private:
  uint64_t lanes_[4];
  unsigned char pending_[32];
  size_t pending_size_ = 0;
  uint64_t total_ = 0;
};

uint64_t ContentHash(const void* data, size_t n);

// "sg64:" + 16 hex digits of the file's content hash; NotFound etc. name the path.
absl::StatusOr<std::string> HashFile(const std::string& path);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_CHECKPOINT_CONTENT_HASH_H_
