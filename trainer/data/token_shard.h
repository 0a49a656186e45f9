// Pre-tokenized shards in llm.c's .bin format: a header of 256 little-endian int32 (magic,
// version, token count, then zeros) followed by the tokens. llm.c (dev/data/data_common.py) uses
// two header kinds, and both are read and written here:
//   magic 20240520, version 1: uint16 tokens (GPT-2's 50257-token vocabulary)
//   magic 20240801, version 7: uint32 tokens (Llama 3's 128256-token vocabulary)
//
//   SG_RETURN_IF_ERROR(WriteTokenShard("/data/train_000.bin", tokens, TokenWidth::kU16));
//   SG_ASSIGN_OR_RETURN(std::vector<int32_t> t, ReadTokenShard("/data/train_000.bin", vocab_size));
#ifndef SGTRAIN_TRAINER_DATA_TOKEN_SHARD_H_
#define SGTRAIN_TRAINER_DATA_TOKEN_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sg::trainer {

enum class TokenWidth { kU16, kU32 };

inline constexpr int kShardHeaderInts = 256;
inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;

// Writes a shard atomically. InvalidArgument if a token is negative or does not fit the width.
absl::Status WriteTokenShard(const std::string& path, absl::Span<const int32_t> tokens, TokenWidth width);

// Reads and validates a shard: size at least the header, a known (magic, version) pair, a
// non-negative count, file size == header + count * width, and (when vocab_size > 0) every token
// below vocab_size. Errors name the file, the field or token position, expected and found.
// Tokens are returned as int32 (uint32 tokens above INT32_MAX are refused).
absl::StatusOr<std::vector<int32_t>> ReadTokenShard(const std::string& path, int64_t vocab_size = 0);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_DATA_TOKEN_SHARD_H_
