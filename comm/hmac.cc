#include "comm/hmac.h"

#include "kernels/core/sha256.h"

namespace sg::comm {

std::string HmacSha256(absl::string_view key, absl::string_view message) {
  std::string k = key.size() > 64 ? Sha256Digest(key) : std::string(key);
  k.resize(64, '\0');
  std::string inner(64, '\0'), outer(64, '\0');
  for (int i = 0; i < 64; ++i) {
    inner[i] = char(k[i] ^ 0x36);
    outer[i] = char(k[i] ^ 0x5c);
  }
  inner.append(message.data(), message.size());
  outer += Sha256Digest(inner);
  return Sha256Digest(outer);
}

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace sg::comm
