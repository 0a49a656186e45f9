// Named Llama configurations for the planner and the `plan` report: tiny, 124m, 1b, 7b.
//
//   SG_ASSIGN_OR_RETURN(graph::LlamaConfig c, LlamaConfigByName("7b"));
//
// Shapes (dim / layers / heads / kv heads / ffn / vocab): 124m 768/12/12/12/2048/32000,
// 1b 2048/16/32/8/8192/32000, 7b 4096/32/32/32/11008/32000; tiny is graph's LlamaConfig::Tiny().
#ifndef SGTRAIN_SHARDING_MODELS_H_
#define SGTRAIN_SHARDING_MODELS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/models/llama.h"

namespace sg::sharding {

// InvalidArgument listing the known names otherwise.
absl::StatusOr<graph::LlamaConfig> LlamaConfigByName(absl::string_view name);

}  // namespace sg::sharding

#endif  // SGTRAIN_SHARDING_MODELS_H_
