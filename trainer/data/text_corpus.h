// Text for training: any user files or directories, or the default corpus that README's set-up
// installs (Debian's `fortunes` package: about 2.4 MB of English quotations and prose in
// /usr/share/games/fortunes, one document per fortune).
//
//   SG_ASSIGN_OR_RETURN(TextCorpus c, LoadDefaultCorpus());           // c.description says what
//   SG_ASSIGN_OR_RETURN(TextCorpus mine, LoadTextFiles({"notes/", "book.txt"}));
#ifndef SGTRAIN_TRAINER_DATA_TEXT_CORPUS_H_
#define SGTRAIN_TRAINER_DATA_TEXT_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sg::trainer {

struct TextDocument {
  std::string source;  // file (and, for fortunes, the index inside it), for messages
  std::string text;
};

struct TextCorpus {
  std::string description;  // "Debian package fortunes (/usr/share/games/fortunes): 15713 documents, 2.4 MB"
  std::vector<TextDocument> documents;
  int64_t total_bytes() const;
};

// Where the default corpus lives and which Debian package provides it.
inline constexpr char kDefaultCorpusPackage[] = "fortunes";
inline constexpr char kDefaultCorpusDir[] = "/usr/share/games/fortunes";
// Always present on Debian (base-files), but only ~0.3 MB: the fallback.
inline constexpr char kFallbackCorpusDir[] = "/usr/share/common-licenses";

// Each path is a text file (one document) or a directory (its regular files, recursively, in
// sorted order; hidden files skipped). Errors name the path: missing, unreadable, empty, or binary
// (a NUL byte, with its offset). An empty list or a corpus with no text is refused.
absl::StatusOr<TextCorpus> LoadTextFiles(const std::vector<std::string>& paths);

// Splits fortune-file text into its entries (separated by lines holding only "%"); empty entries
// are dropped.
std::vector<std::string> SplitFortunes(const std::string& text);

// Reads fortune files (`dir`'s files except the *.dat indexes and *.u8 links) as one document per
// fortune. NotFound naming the package when `dir` is missing or empty.
absl::StatusOr<TextCorpus> LoadFortunes(const std::string& dir = kDefaultCorpusDir);

// The fortunes, or when they are not installed, the license texts in kFallbackCorpusDir (the
// description says so, naming the package to install).
absl::StatusOr<TextCorpus> LoadDefaultCorpus();

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_DATA_TEXT_CORPUS_H_
