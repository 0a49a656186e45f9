#include "trainer/data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/status.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

namespace fs = std::filesystem;

// Regular files under `dir`, recursively, sorted; hidden entries skipped.
absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list directory '", dir, "': ", ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<TextDocument> ReadTextFile(const std::string& path) {
  SG_ASSIGN_OR_RETURN(std::string text, ReadFile(path, int64_t(1) << 34));
  const size_t nul = text.find('\0');
  if (nul != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text file '", path,
                                                   "': expected text, found binary data (a NUL byte at offset ", nul,
                                                   ")"));
  }
  return TextDocument{path, std::move(text)};
}

std::string Megabytes(int64_t bytes) { return absl::StrFormat("%.1f MB", double(bytes) / 1e6); }

}  // namespace

int64_t TextCorpus::total_bytes() const {
  int64_t n = 0;
  for (const TextDocument& d : documents) n += int64_t(d.text.size());
  return n;
}

absl::StatusOr<TextCorpus> LoadTextFiles(const std::vector<std::string>& paths) {
  SG_CHECK_ARG(!paths.empty(), "no text files given: expected at least one file or directory");
  TextCorpus corpus;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) return absl::NotFoundError(absl::StrCat("text path '", path, "' does not exist"));
    std::vector<std::string> files;
    if (fs::is_directory(st)) {
      SG_ASSIGN_OR_RETURN(files, ListFiles(path));
      if (files.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("text directory '", path, "' holds no files"));
      }
    } else {
      files.push_back(path);
    }
    for (const std::string& f : files) {
      SG_ASSIGN_OR_RETURN(TextDocument d, ReadTextFile(f));
      if (d.text.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("text file '", f, "' is empty: expected some text"));
      }
      corpus.documents.push_back(std::move(d));
    }
  }
  corpus.description = absl::StrCat(corpus.documents.size(), " text file(s), ", Megabytes(corpus.total_bytes()));
  return corpus;
}

std::vector<std::string> SplitFortunes(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    absl::string_view line(text.data() + pos, end - pos);
    if (line == "%") {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
    } else {
      current.append(line.data(), line.size());
      current.push_back('\n');
    }
    pos = end + 1;
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

absl::StatusOr<TextCorpus> LoadFortunes(const std::string& dir) {
  const std::string install = absl::StrCat("install Debian's '", kDefaultCorpusPackage,
                                           "' package (./bazelw installs it, or: apt-get install -y ",
                                           kDefaultCorpusPackage, ")");
  if (!fs::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("default corpus directory '", dir, "' does not exist; ", install));
  }
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || e.is_symlink() || absl::EndsWith(name, ".dat") || absl::EndsWith(name, ".u8") ||
        name[0] == '.') {
      continue;
    }
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  TextCorpus corpus;
  for (const std::string& f : files) {
    SG_ASSIGN_OR_RETURN(TextDocument d, ReadTextFile(f));
    std::vector<std::string> fortunes = SplitFortunes(d.text);
    for (size_t i = 0; i < fortunes.size(); ++i) {
      corpus.documents.push_back({absl::StrCat(f, "#", i), std::move(fortunes[i])});
    }
  }
  if (corpus.documents.empty()) {
    return absl::NotFoundError(absl::StrCat("no fortunes found in '", dir, "'; ", install));
  }
  corpus.description = absl::StrCat("Debian package ", kDefaultCorpusPackage, " (", dir, "): ",
                                    corpus.documents.size(), " documents, ", Megabytes(corpus.total_bytes()));
  return corpus;
}

absl::StatusOr<TextCorpus> LoadDefaultCorpus() {
  absl::StatusOr<TextCorpus> fortunes = LoadFortunes();
  if (fortunes.ok()) return fortunes;
  absl::StatusOr<TextCorpus> licenses = LoadTextFiles({kFallbackCorpusDir});
  if (!licenses.ok()) {
    return absl::NotFoundError(absl::StrCat(fortunes.status().message(), "; the fallback also failed: ",
                                            licenses.status().message()));
  }
  licenses->description = absl::StrCat("license texts in ", kFallbackCorpusDir, " (", licenses->description,
                                       "); for the larger default corpus install Debian's '", kDefaultCorpusPackage,
                                       "' package (", fortunes.status().message(), ")");
  return licenses;
}

}  // namespace sg::trainer
