// File helpers for the trainer's formats: read a whole file, write one atomically, and make a
// rename durable. Every error names the path and the system's reason.
//
//   SG_ASSIGN_OR_RETURN(std::string bytes, sg::trainer::ReadFile("/ckpt/config.json"));
//   SG_RETURN_IF_ERROR(sg::trainer::WriteFileAtomic("/ckpt/config.json", json_text));
//   SG_RETURN_IF_ERROR(sg::trainer::FsyncDirectory("/ckpt"));
#ifndef SGTRAIN_TRAINER_IO_FILE_IO_H_
#define SGTRAIN_TRAINER_IO_FILE_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sg::trainer {

// The whole file. NotFound when it does not exist; `max_bytes` guards against reading something
// huge by mistake (FailedPrecondition naming the size found).
absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = int64_t(1) << 40);

// Writes `contents` to `path` so that a reader sees either the old file or the complete new one:
// writes `path.tmp.<pid>`, fsyncs it, renames it over `path`, fsyncs the directory. A crash at any
// point leaves the previous `path` intact (and at worst a stray temp file).
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);

// Flushes a directory's entries (after creating, renaming or removing files in it).
absl::Status FsyncDirectory(const std::string& dir);

// Creates `dir` and missing parents (like `mkdir -p`); OK if it exists as a directory.
absl::Status MakeDirectories(const std::string& dir);

// Removes a file or a directory tree; OK if it does not exist.
absl::Status RemoveAll(const std::string& path);

// The directory part of a path ("a/b/c" -> "a/b", "c" -> ".").
std::string DirName(const std::string& path);

// "a" + "/" + "b", without doubling the slash.
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_IO_FILE_IO_H_
