#include "trainer/data/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "trainer/data/sentencepiece_shim.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {

absl::StatusOr<std::vector<int32_t>> ByteTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(uint8_t(text[i]));
  return ids;
}

absl::StatusOr<std::string> ByteTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == kBos || ids[i] == kEos) continue;
    SG_CHECK_ARG(ids[i] >= 0 && ids[i] < 256, "byte tokenizer: id ", ids[i], " at position ", i,
                 " is out of range, expected 0..257");
    out.push_back(char(uint8_t(ids[i])));
  }
  return out;
}

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<spshim::Processor> sp, std::string path)
    : sp_(std::move(sp)), path_(std::move(path)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(const std::string& path) {
  // Read the file ourselves so a missing file gets the usual NotFound message with the path.
  SG_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, int64_t(1) << 30));
  auto sp = std::make_unique<spshim::Processor>();
  std::string error;
  if (!sp->LoadFromSerialized(bytes, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer '", path, "': expected a SentencePiece model, SentencePiece says: ", error));
  }
  if (sp->bos_id() < 0 || sp->eos_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer '", path, "': expected BOS and EOS pieces, found bos_id ",
                                                   sp->bos_id(), ", eos_id ", sp->eos_id()));
  }
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(sp), path));
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Train(const TextCorpus& corpus,
                                                                                      int vocab_size,
                                                                                      const std::string& out_dir) {
  SG_CHECK_ARG(vocab_size >= 260, "SentencePiece training: vocab_size ", vocab_size,
               " is too small, expected >= 260 (256 byte-fallback pieces + unk, BOS, EOS + merges)");
  SG_CHECK_ARG(!corpus.documents.empty(), "SentencePiece training: the corpus is empty");
  SG_RETURN_IF_ERROR(MakeDirectories(out_dir));
  // One sentence per line, cut below SentencePiece's max_sentence_length.
  std::string lines;
  for (const TextDocument& d : corpus.documents) {
    size_t pos = 0;
    while (pos < d.text.size()) {
      size_t end = d.text.find('\n', pos);
      if (end == std::string::npos) end = d.text.size();
      for (size_t s = pos; s < end; s += 4096) {
        lines.append(d.text, s, std::min<size_t>(4096, end - s));
        lines.push_back('\n');
      }
      pos = end + 1;
    }
  }
  const std::string input = JoinPath(out_dir, "tokenizer_training_text.txt");
  SG_RETURN_IF_ERROR(WriteFileAtomic(input, lines));
  const std::string model_path = JoinPath(out_dir, "tokenizer.model");
  const std::map<std::string, std::string> flags = {
      {"input", input},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},
      // Keep text as it is (no NFKC, no whitespace folding, no added leading space), so that
      // Decode(Encode(text)) == text and generated samples print what the model produced.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"byte_fallback", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", "0"},  // use every line: no sampling, so training is deterministic
      {"num_threads", "2"},
      {"minloglevel", "2"},
  };
  std::string model, error;
  if (!spshim::Train(flags, &model, &error)) {
    return absl::InternalError(absl::StrCat("SentencePiece training in '", out_dir, "' failed: ", error));
  }
  SG_RETURN_IF_ERROR(RemoveAll(input));
  SG_RETURN_IF_ERROR(WriteFileAtomic(model_path, model));
  return Load(model_path);
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->vocab_size(); }
int32_t SentencePieceTokenizer::bos_id() const { return sp_->bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text) const {
  std::vector<int> ids;
  std::string error;
  if (!sp_->Encode(std::string(text), &ids, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece encode with '", path_, "' failed: ", error));
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::vector<int> v;
  v.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    SG_CHECK_ARG(ids[i] >= 0 && ids[i] < vocab_size(), "SentencePiece tokenizer '", path_, "': id ", ids[i],
                 " at position ", i, " is out of range, expected 0..", vocab_size() - 1);
    v.push_back(ids[i]);
  }
  std::string text, error;
  if (!sp_->Decode(v, &text, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece decode with '", path_, "' failed: ", error));
  }
  return text;
}

std::string SentencePieceTokenizer::Describe() const {
  return absl::StrCat("sentencepiece (", path_, ", vocab ", vocab_size(), ")");
}

}  // namespace sg::trainer
