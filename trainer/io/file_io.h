// File helpers for the trainer's formats: read a whole file, write one atomically, and make a
// rename durable. Every error names the path and the system's reason.
//
//   SG_ASSIGN_OR_RETURN(std::string bytes, sg::trainer::ReadFile("/ckpt/config.json"));
//   SG_RETURN_IF_ERROR(sg::trainer::WriteFileAtomic("/ckpt/config.json", json_text));
//   SG_RETURN_IF_ERROR(sg::trainer::FsyncDirectory("/ckpt"));
#ifndef SGTRAIN_TRAINER_IO_FILE_IO_H_
#define SGTRAIN_TRAINER_IO_FILE_IO_H_

#include <cstdint>
#include <memory>
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

// Streams a file that appears at `path` only when Commit() succeeds (same temp + fsync + rename
// protocol as WriteFileAtomic), for outputs too large to build in memory. Destroying an uncommitted
// writer removes the temp file.
//
//   SG_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Open(path));
//   SG_RETURN_IF_ERROR(w->Append(header)); SG_RETURN_IF_ERROR(w->Append(data, n));
//   SG_RETURN_IF_ERROR(w->Commit());
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Open(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Append(const void* data, size_t n);
  absl::Status Append(absl::string_view s) { return Append(s.data(), s.size()); }
  int64_t bytes_written() const { return written_; }
  // fsync, rename over `path`, fsync the directory. The writer is finished afterwards.
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd) : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_, tmp_;
  int fd_;
  int64_t written_ = 0;
};

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
