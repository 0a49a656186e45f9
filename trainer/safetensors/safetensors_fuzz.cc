// Fuzz entry: arbitrary bytes as a safetensors file. Open must either refuse with a status or
// return entries whose every tensor loads with exactly numel * itemsize bytes.
#include <cstdlib>

#include "fuzz/mem_file.h"
#include "fuzz/replay.h"
#include "trainer/safetensors/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<sg::trainer::SafetensorsFile> f =
      sg::trainer::SafetensorsFile::Open(sg::fuzz::MemFile(data, size));
  if (!f.ok()) return 0;
  for (const sg::trainer::SafetensorsEntry& e : f->entries()) {
    absl::StatusOr<absl::string_view> bytes = f->Bytes(e.name);
    if (!bytes.ok() || int64_t(bytes->size()) != e.end - e.begin) std::abort();
    if (e.end - e.begin > (64 << 20)) continue;  // valid, but not worth copying per input
    absl::StatusOr<sg::Tensor> t = f->Load(e.name);
    if (!t.ok() || t->nbytes() != e.end - e.begin || t->shape() != e.shape) std::abort();
  }
  return 0;
}
