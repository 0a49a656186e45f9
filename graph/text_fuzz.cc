// Fuzz entry: arbitrary bytes as the graph text form. An accepted graph must print and re-parse to
// the same text (the parser's round-trip contract, text.h).
#include <cstdlib>
#include <iostream>

#include "fuzz/replay.h"
#include "graph/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sg::graph::Graph> g = sg::graph::ParseText(text);
  if (!g.ok()) return 0;
  const std::string printed = sg::graph::ToText(*g);
  absl::StatusOr<sg::graph::Graph> again = sg::graph::ParseText(printed);
  if (!again.ok()) {
    std::cerr << "printed graph does not parse: " << again.status() << "\n" << printed;
    std::abort();
  }
  if (sg::graph::ToText(*again) != printed) {
    std::cerr << "text round trip differs:\n" << printed << "----\n" << sg::graph::ToText(*again);
    std::abort();
  }
  return 0;
}
