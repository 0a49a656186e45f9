// Fuzz entry: arbitrary bytes as a Hugging Face config.json. An accepted config must validate and
// survive a write/read round trip unchanged.
#include <cstdlib>

#include "fuzz/replay.h"
#include "trainer/config/llama_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sg::trainer::LlamaConfig> c = sg::trainer::ParseHfConfig(text, "fuzz");
  if (!c.ok()) return 0;
  if (!sg::trainer::ValidateLlamaConfig(*c).ok()) std::abort();
  absl::StatusOr<std::string> json = sg::trainer::HfConfigJson(*c);
  if (!json.ok()) std::abort();
  absl::StatusOr<sg::trainer::LlamaConfig> again = sg::trainer::ParseHfConfig(*json, "round trip");
  if (!again.ok()) std::abort();
  if (sg::trainer::HfConfigJson(*again).value() != *json) std::abort();
  return 0;
}
