#include "kernels/core/status.h"

namespace sg {

absl::Status LibraryError(absl::StatusCode status_code, const char* library, long long code,
                          const char* text, const char* call, const char* file, int line) {
  return absl::Status(status_code, absl::StrCat(library, " error ", code, " (", text, ") in `",
                                                call, "` at ", file, ":", line));
}

}  // namespace sg
