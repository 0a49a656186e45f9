// Internal: the store's wire format. Every message is a frame: a 4-byte little-endian payload length,
// then the payload. A payload is an opcode byte followed by fields: integers are little-endian
// fixed-width, strings are a u32 length then bytes. Readers are bounds-checked, so a truncated or
// garbage payload fails to parse instead of reading past the end.
//
//   WireWriter w; w.U8(uint8_t(StoreOp::kSet)); w.Str(key); w.Str(value);
//   std::string frame = w.Frame();
//   WireReader r(payload); uint8_t op; std::string key; bool ok = r.U8(&op) && r.Str(&key);
#ifndef SGTRAIN_COMM_STORE_WIRE_H_
#define SGTRAIN_COMM_STORE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace sg::comm {

inline constexpr char kStoreMagic[4] = {'S', 'G', 'S', 'T'};
inline constexpr uint8_t kStoreProtocolVersion = 1;
inline constexpr size_t kStoreNonceBytes = 32;

// Request opcodes. Replies start with a StoreReply byte.
enum class StoreOp : uint8_t {
  kAuth = 1,         // str mac                         -> OK | kDenied
  kSet = 2,          // str key, str value              -> OK
  kGet = 3,          // str key, i64 wait_ms            -> OK str value | kNotFound | kTimeout
  kAdd = 4,          // str key, i64 delta              -> OK i64 new_value
  kCompareSet = 5,   // str key, str expected, str desired -> OK str current_value
  kWait = 6,         // u32 n, n x str key, i64 wait_ms -> OK | kTimeout
  kCheck = 7,        // u32 n, n x str key              -> OK u8 all_present
  kDelete = 8,       // str key                         -> OK u8 existed
};

enum class StoreReply : uint8_t {
  kOk = 0,
  kNotFound = 1,
  kTimeout = 2,
  kBadRequest = 3,  // followed by str message; the server then closes the connection
  kDenied = 4,      // authentication failed; followed by str message; connection closed
  kError = 5,       // a valid request that cannot be done (store full, add on a non-counter);
                    // followed by str message; the connection stays open
};

class WireWriter {
 public:
  void U8(uint8_t v) { buf_.push_back(char(v)); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void I64(int64_t v) { Raw(&v, 8); }
  void Str(absl::string_view s) {
    U32(uint32_t(s.size()));
    buf_.append(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }  // LE host
  const std::string& payload() const { return buf_; }
  // Length prefix + payload.
  std::string Frame() const {
    std::string f(4, '\0');
    uint32_t n = uint32_t(buf_.size());
    std::memcpy(&f[0], &n, 4);
    return f + buf_;
  }

 private:
  std::string buf_;
};

class WireReader {
 public:
  explicit WireReader(absl::string_view data) : data_(data) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool I64(int64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > data_.size() - pos_) return false;
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Raw(void* p, size_t n) {
    if (n > data_.size() - pos_) return false;
    std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == data_.size(); }

 private:
  absl::string_view data_;
  size_t pos_ = 0;
};

}  // namespace sg::comm

#endif  // SGTRAIN_COMM_STORE_WIRE_H_
