// A reusable in-memory file (memfd) for fuzz entry points whose API takes a path: each call
// replaces the contents and returns "/proc/self/fd/<n>", which open() and mmap() accept.
//
//   std::string path = sg::fuzz::MemFile(data, size);
//   (void)sg::trainer::SafetensorsFile::Open(path);
#ifndef SGTRAIN_FUZZ_MEM_FILE_H_
#define SGTRAIN_FUZZ_MEM_FILE_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace sg::fuzz {

inline std::string MemFile(const void* data, size_t size) {
  static const int fd = ::memfd_create("sg_fuzz_input", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    ssize_t n = ::pwrite(fd, p + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace sg::fuzz

#endif  // SGTRAIN_FUZZ_MEM_FILE_H_
