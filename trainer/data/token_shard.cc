#include "trainer/data/token_shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("token shard '", path, "': ", what));
}

}  // namespace

absl::Status WriteTokenShard(const std::string& path, absl::Span<const int32_t> tokens, TokenWidth width) {
  const int bytes = width == TokenWidth::kU16 ? 2 : 4;
  const int64_t max_token = width == TokenWidth::kU16 ? 65535 : INT32_MAX;
  SG_CHECK_ARG(int64_t(tokens.size()) <= INT32_MAX, "WriteTokenShard '", path, "': ", tokens.size(),
               " tokens, the header's count holds at most ", INT32_MAX);
  std::string out;
  out.reserve(kShardHeaderInts * 4 + tokens.size() * bytes);
  PutLe(out, uint32_t(width == TokenWidth::kU16 ? kShardMagicU16 : kShardMagicU32), 4);
  PutLe(out, uint32_t(width == TokenWidth::kU16 ? kShardVersionU16 : kShardVersionU32), 4);
  PutLe(out, uint32_t(tokens.size()), 4);
  out.append((kShardHeaderInts - 3) * 4, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    SG_CHECK_ARG(tokens[i] >= 0 && tokens[i] <= max_token, "WriteTokenShard '", path, "': token ", i, " is ",
                 tokens[i], ", expected 0..", max_token, " for ", bytes * 8, "-bit tokens");
    PutLe(out, uint32_t(tokens[i]), bytes);
  }
  return WriteFileAtomic(path, out);
}

absl::StatusOr<std::vector<int32_t>> ReadTokenShard(const std::string& path, int64_t vocab_size) {
  SG_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
  const int64_t header_bytes = kShardHeaderInts * 4;
  if (int64_t(raw.size()) < header_bytes) {
    return Bad(path, absl::StrCat("expected at least the ", header_bytes, "-byte header, found ", raw.size(),
                                  " bytes"));
  }
  const int32_t magic = int32_t(GetLe(raw.data(), 4));
  const int32_t version = int32_t(GetLe(raw.data() + 4, 4));
  const int32_t count = int32_t(GetLe(raw.data() + 8, 4));
  int width;
  if (magic == kShardMagicU16 && version == kShardVersionU16) {
    width = 2;
  } else if (magic == kShardMagicU32 && version == kShardVersionU32) {
    width = 4;
  } else {
    return Bad(path, absl::StrCat("header (magic, version) is (", magic, ", ", version, "), expected (",
                                  kShardMagicU16, ", ", kShardVersionU16, ") for uint16 tokens or (", kShardMagicU32,
                                  ", ", kShardVersionU32, ") for uint32 tokens (llm.c's .bin format)"));
  }
  if (count < 0) return Bad(path, absl::StrCat("header token count is ", count, ", expected >= 0"));
  const int64_t want = header_bytes + int64_t(count) * width;
  if (int64_t(raw.size()) != want) {
    return Bad(path, absl::StrCat("file has ", raw.size(), " bytes, expected ", want, " (header + ", count, " ",
                                  width * 8, "-bit tokens)", int64_t(raw.size()) < want ? ": truncated?" : ""));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  const char* p = raw.data() + header_bytes;
  for (int32_t i = 0; i < count; ++i) {
    const uint64_t t = GetLe(p + int64_t(i) * width, width);
    if (t > uint64_t(INT32_MAX) || (vocab_size > 0 && int64_t(t) >= vocab_size)) {
      return Bad(path, absl::StrCat("token ", i, " is ", t, ", expected below the vocabulary size ",
                                    vocab_size > 0 ? vocab_size : int64_t(INT32_MAX) + 1));
    }
    tokens[size_t(i)] = int32_t(t);
  }
  return tokens;
}

}  // namespace sg::trainer
