// Fuzz entry: arbitrary bytes as an llm.c token shard, read without and with a vocabulary bound;
// an accepted shard's tokens must respect the bound.
#include <cstdlib>

#include "fuzz/mem_file.h"
#include "fuzz/replay.h"
#include "trainer/data/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sg::fuzz::MemFile(data, size);
  (void)sg::trainer::ReadTokenShard(path);
  absl::StatusOr<std::vector<int32_t>> t = sg::trainer::ReadTokenShard(path, 50257);
  if (t.ok()) {
    for (int32_t tok : *t) {
      if (tok < 0 || tok >= 50257) std::abort();
    }
  }
  return 0;
}
