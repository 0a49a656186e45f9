#include "trainer/safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "nlohmann/json.hpp"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

using nlohmann::json;

std::string Found(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path, "': ", what));
}

// A non-negative JSON integer that fits in int64.
bool AsNonNegative(const json& v, int64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(INT64_MAX)) return false;
  } else if (v.get<int64_t>() < 0) {
    return false;
  }
  *out = v.get<int64_t>();
  return true;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name, const json& v) {
  const std::string where = absl::StrCat("tensor '", name, "': ");
  if (!v.is_object()) return Bad(path, absl::StrCat(where, "expected an object, found ", Found(v)));
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets") {
      return Bad(path, absl::StrCat(where, "unexpected field '", it.key(),
                                    "' (expected only dtype, shape, data_offsets)"));
    }
  }
  SafetensorsEntry e;
  e.name = name;
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    return Bad(path, absl::StrCat(where, "field 'dtype': expected a string, found ",
                                  dtype == v.end() ? "nothing" : Found(*dtype)));
  }
  auto parsed = ParseSafetensorsDType(dtype->get<std::string>());
  if (!parsed.ok()) return Bad(path, absl::StrCat(where, parsed.status().message()));
  e.dtype = *parsed;

  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) {
    return Bad(path, absl::StrCat(where, "field 'shape': expected an array of non-negative integers, found ",
                                  shape == v.end() ? "nothing" : Found(*shape)));
  }
  int64_t numel = 1;
  bool overflow = false;
  for (const json& d : *shape) {
    int64_t n;
    if (!AsNonNegative(d, &n)) {
      return Bad(path, absl::StrCat(where, "field 'shape': expected non-negative integers, found ", Found(*shape)));
    }
    e.shape.push_back(n);
    if (n != 0 && numel > INT64_MAX / n) overflow = true;
    numel = overflow ? numel : numel * n;
  }
  if (overflow || numel > INT64_MAX / SizeOf(e.dtype)) {
    return Bad(path, absl::StrCat(where, "shape ", Found(*shape), " has more bytes than fit in int64"));
  }

  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !AsNonNegative((*offsets)[0], &e.begin) || !AsNonNegative((*offsets)[1], &e.end) || e.end < e.begin) {
    return Bad(path, absl::StrCat(where, "field 'data_offsets': expected [begin, end] with 0 <= begin <= end, found ",
                                  offsets == v.end() ? "nothing" : Found(*offsets)));
  }
  const int64_t want = numel * SizeOf(e.dtype);
  if (e.end - e.begin != want) {
    return Bad(path, absl::StrCat(where, "data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin,
                                  " bytes, expected ", want, " for ", SafetensorsDTypeName(e.dtype),
                                  ShapeToString(e.shape)));
  }
  return e;
}

// The whole file, memory-mapped read-only.
struct MappedFile {
  std::shared_ptr<const char> bytes;  // unmapped with the last copy
  int64_t size = 0;
};

// Maps `path` after checking it is a regular file long enough to hold the header length.
absl::StatusOr<MappedFile> MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string msg = absl::StrCat("cannot open safetensors file '", path, "': ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Bad(path, "not a regular file");
  }
  const int64_t size = st.st_size;
  if (size < 8) {
    ::close(fd);
    return Bad(path, absl::StrCat("expected at least 8 bytes (the header length), found ", size));
  }
  void* p = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot mmap '", path, "': ", std::strerror(map_errno)));

  MappedFile file;
  file.size = size;
  file.bytes = std::shared_ptr<const char>(static_cast<const char*>(p),
                                           [size](const char* q) { ::munmap(const_cast<char*>(q), size_t(size)); });
  return file;
}

// The JSON header's bytes, as the 8-byte little-endian length at the start of `file` delimits them: the length is
// checked against the reader's bound and the file before anything is read past it.
absl::StatusOr<absl::string_view> HeaderText(const std::string& path, const MappedFile& file) {
  const int64_t size = file.size;
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(file.bytes.get());
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(bytes[i]) << (8 * i);
  if (header_len < 2 || header_len > uint64_t(kMaxSafetensorsHeaderBytes) || header_len > uint64_t(size - 8)) {
    return Bad(path, absl::StrCat("header length ", header_len, " is not in [2, min(", kMaxSafetensorsHeaderBytes,
                                  ", file size - 8 = ", size - 8, ")]"));
  }
  const char* text = file.bytes.get() + 8;
  if (text[0] != '{') {
    return Bad(path, absl::StrCat("header must start with '{', found byte 0x", absl::Hex(uint8_t(text[0]))));
  }
  return absl::string_view(text, size_t(header_len));
}

// The header text as a JSON object.
absl::StatusOr<json> ParseHeader(const std::string& path, absl::string_view text) {
  json header;
  try {
    header = json::parse(text.data(), text.data() + text.size());
  } catch (const json::exception& e) {
    return Bad(path, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return Bad(path, absl::StrCat("header: expected a JSON object, found ", Found(header)));
  return header;
}

// The "__metadata__" object: string -> string.
absl::Status ParseMetadata(const std::string& path, const json& v, std::map<std::string, std::string>* metadata) {
  if (!v.is_object()) return Bad(path, absl::StrCat("'__metadata__': expected an object, found ", Found(v)));
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m->is_string()) {
      return Bad(path, absl::StrCat("'__metadata__' field '", m.key(), "': expected a string, found ", Found(*m)));
    }
    (*metadata)[m.key()] = m->get<std::string>();
  }
  return absl::OkStatus();
}

// Every field of the header object, in the object's order: "__metadata__" into `metadata`, each other one a
// tensor's entry appended to `entries`. The first bad field is the error.
absl::Status ParseHeaderFields(const std::string& path, const json& header,
                               std::map<std::string, std::string>* metadata, std::vector<SafetensorsEntry>* entries) {
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      SG_RETURN_IF_ERROR(ParseMetadata(path, *it, metadata));
      continue;
    }
    SG_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(path, it.key(), *it));
    entries->push_back(std::move(e));
  }
  return absl::OkStatus();
}

// `entries`, sorted by offsets, must tile the data section of `data_size` bytes exactly: the first starts at 0, each
// next one where the previous ends, none past the end, and the last ends at the end.
absl::Status CheckTensorsTileData(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                  int64_t data_size) {
  int64_t expected_begin = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin != expected_begin) {
      return Bad(path, absl::StrCat("tensor '", e.name, "' starts at data offset ", e.begin, ", expected ",
                                    expected_begin,
                                    previous ? absl::StrCat(" (the end of '", previous->name, "'): tensors ",
                                                            e.begin < expected_begin ? "overlap" : "leave a hole")
                                             : std::string(" (the first tensor starts at 0)")));
    }
    if (e.end > data_size) {
      return Bad(path, absl::StrCat("tensor '", e.name, "' ends at data offset ", e.end,
                                    ", past the end of the data section (", data_size, " bytes): file truncated?"));
    }
    expected_begin = e.end;
    previous = &e;
  }
  if (expected_begin != data_size) {
    return Bad(path, absl::StrCat("data section has ", data_size, " bytes, expected ", expected_begin,
                                  " (the end of the last tensor)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view SafetensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64}) {
    if (name == SafetensorsDTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("field 'dtype': expected one of F32, BF16, F16, I32, I64, found \"", name, "\""));
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::set<std::string> names;
  int64_t offset = 0;
  for (const NamedTensorView& t : tensors) {
    const std::string what = absl::StrCat("WriteSafetensors '", path, "': tensor '", t.name, "' ");
    SG_CHECK_ARG(!t.name.empty() && t.name != "__metadata__", what, "has a reserved or empty name");
    SG_CHECK_ARG(names.insert(t.name).second, what, "appears twice");
    SG_CHECK_ARG(t.view.device().is_cpu(), what, "must be on the host, found ", t.view.ToString());
    SG_CHECK_ARG(t.view.is_contiguous(), what, "must be contiguous, found ", t.view.ToString());
    SG_CHECK_ARG(t.view.numel() == 0 || t.view.raw() != nullptr, what, "has no data");
    json shape = json::array();
    for (int64_t d : t.view.shape()) shape.push_back(d);
    header[t.name] = {{"dtype", std::string(SafetensorsDTypeName(t.view.dtype()))},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + t.view.nbytes()}}};
    offset += t.view.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);

  SG_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Open(path));
  SG_RETURN_IF_ERROR(w->Append(len, 8));
  SG_RETURN_IF_ERROR(w->Append(text));
  for (const NamedTensorView& t : tensors) SG_RETURN_IF_ERROR(w->Append(t.view.raw(), size_t(t.view.nbytes())));
  return w->Commit();
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  SG_ASSIGN_OR_RETURN(const MappedFile file, MapFile(path));
  f.mapping_ = file.bytes;
  SG_ASSIGN_OR_RETURN(const absl::string_view text, HeaderText(path, file));
  f.data_start_ = 8 + int64_t(text.size());
  SG_ASSIGN_OR_RETURN(const json header, ParseHeader(path, text));
  SG_RETURN_IF_ERROR(ParseHeaderFields(path, header, &f.metadata_, &f.entries_));
  // Offset order is what entries() promises, and what the tiling check walks.
  std::sort(f.entries_.begin(), f.entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  SG_RETURN_IF_ERROR(CheckTensorsTileData(path, f.entries_, file.size - f.data_start_));
  return f;
}

const SafetensorsEntry* SafetensorsFile::Find(absl::string_view name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<absl::string_view> SafetensorsFile::Bytes(absl::string_view name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("safetensors file '", path_, "' has no tensor '", name, "'"));
  }
  return absl::string_view(mapping_.get() + data_start_ + e->begin, size_t(e->end - e->begin));
}

absl::StatusOr<Tensor> SafetensorsFile::Load(absl::string_view name) const {
  SG_ASSIGN_OR_RETURN(absl::string_view bytes, Bytes(name));
  const SafetensorsEntry* e = Find(name);
  SG_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(e->shape, e->dtype, Device::Cpu()));
  if (!bytes.empty()) std::memcpy(t.view().raw(), bytes.data(), bytes.size());
  return t;
}

absl::StatusOr<std::vector<NamedTensor>> SafetensorsFile::LoadAll() const {
  std::vector<NamedTensor> out;
  for (const SafetensorsEntry& e : entries_) {
    SG_ASSIGN_OR_RETURN(Tensor t, Load(e.name));
    out.push_back({e.name, std::move(t)});
  }
  return out;
}

}  // namespace sg::trainer
