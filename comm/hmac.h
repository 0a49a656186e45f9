// Internal: HMAC-SHA-256 (RFC 2104) over kernels/core/sha256.h, for the store's challenge-response
// authentication. Not a general crypto library: inputs are in memory.
//
//   std::string mac = HmacSha256(secret, nonce);   // 32 raw bytes
//   bool same = ConstantTimeEqual(mac, received);
#ifndef SGTRAIN_COMM_HMAC_H_
#define SGTRAIN_COMM_HMAC_H_

#include <string>

#include "absl/strings/string_view.h"

namespace sg::comm {

// The 32-byte HMAC-SHA-256 of `message` under `key` (raw bytes).
std::string HmacSha256(absl::string_view key, absl::string_view message);

// True when a == b, in time that depends only on the sizes.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b);

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_HMAC_H_
