// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// header, then the tensor bytes. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets relative to the byte after the header) and may hold a
// "__metadata__" object of string -> string.
//
//   SG_RETURN_IF_ERROR(sg::trainer::WriteSafetensors(path, {{"w", w.view()}}, {{"format", "pt"}}));
//   SG_ASSIGN_OR_RETURN(sg::trainer::SafetensorsFile f, sg::trainer::SafetensorsFile::Open(path));
//   SG_ASSIGN_OR_RETURN(sg::Tensor w, f.Load("w"));   // a host tensor
#ifndef SGTRAIN_TRAINER_SAFETENSORS_SAFETENSORS_H_
#define SGTRAIN_TRAINER_SAFETENSORS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/tensor.h"

namespace sg::trainer {

// A name and a host tensor, the unit the readers and writers exchange.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};
struct NamedTensorView {
  std::string name;
  TensorView view;
};

// The header's dtype strings: "F32", "BF16", "F16", "I32", "I64".
absl::string_view SafetensorsDTypeName(DType t);
absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name);

// Writes `tensors` (host, contiguous, unique non-empty names, not "__metadata__") in the given
// order, atomically: the file at `path` is either the previous one or the complete new one. The
// header is padded with spaces to a multiple of 8 bytes, as Hugging Face's writer does.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// One tensor's entry in the header.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin = 0;  // byte offsets into the data section
  int64_t end = 0;
};

// An opened, fully validated safetensors file, memory-mapped read-only. Open checks everything
// before returning: header length (>= 2, <= 100 MiB, inside the file), JSON syntax and types,
// supported dtypes, non-negative shapes, end - begin == numel * itemsize, offsets inside the data
// section, tensors neither overlapping nor leaving holes, and the data section ending at the last
// tensor. Errors name the file, the tensor (or field), what was expected and what was found.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // Entries in the order of their data offsets.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsEntry* Find(absl::string_view name) const;

  // The tensor's raw bytes inside the mapping (not necessarily aligned for its dtype); valid while
  // this object (or a copy) lives. NotFound names the file and the tensor.
  absl::StatusOr<absl::string_view> Bytes(absl::string_view name) const;
  // A fresh, aligned host tensor holding a copy of the data.
  absl::StatusOr<Tensor> Load(absl::string_view name) const;
  // Every tensor, in offset order.
  absl::StatusOr<std::vector<NamedTensor>> LoadAll() const;

 private:
  std::string path_;
  std::shared_ptr<const char> mapping_;  // the whole file; unmapped with the last copy
  int64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Largest header the reader accepts (the same bound as Hugging Face's reader).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100 << 20;

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_SAFETENSORS_SAFETENSORS_H_
