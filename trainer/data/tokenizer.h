// Tokenizers: byte-level (256 byte ids + BOS + EOS, the fallback that needs no file) and
// SentencePiece (a Llama `tokenizer.model`, or one trained on the corpus).
//
//   ByteTokenizer bytes;                                         // vocab 258, BOS 256, EOS 257
//   SG_ASSIGN_OR_RETURN(auto sp, SentencePieceTokenizer::Load("/models/llama/tokenizer.model"));
//   SG_ASSIGN_OR_RETURN(auto trained, SentencePieceTokenizer::Train(corpus, 2048, "/run/tokenizer"));
//   std::vector<int32_t> ids = sp->Encode("Hello");  std::string text = sp->Decode(ids);
#ifndef SGTRAIN_TRAINER_DATA_TOKENIZER_H_
#define SGTRAIN_TRAINER_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/data/text_corpus.h"

namespace sg::trainer {

namespace spshim {
class Processor;
}

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids are in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Text -> ids, without BOS/EOS.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const = 0;
  // Ids -> text; BOS/EOS and other control ids are dropped. InvalidArgument for an id out of range.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;
  // "bytes" or "sentencepiece(<path>, vocab N)".
  virtual std::string Describe() const = 0;
};

// Each byte is its own id; BOS = 256, EOS = 257. Decoding drops BOS/EOS; bytes that are not valid
// UTF-8 come back as they are.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  int64_t vocab_size() const override { return 258; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  std::string Describe() const override { return "bytes (vocab 258: 256 bytes + BOS + EOS)"; }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads a SentencePiece model (Llama's tokenizer.model). Errors name the file and SentencePiece's
  // reason; a model without BOS/EOS pieces is refused (the data loader needs both).
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);

  // Trains a BPE model with byte fallback (every byte string is encodable) on `corpus` and writes
  // `out_dir`/tokenizer.model; ids: unk 0, BOS 1, EOS 2 (Llama's layout). Deterministic for the
  // same corpus and vocab_size. Documents are split into lines of at most 4096 bytes for training.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Train(const TextCorpus& corpus, int vocab_size,
                                                                       const std::string& out_dir);

  ~SentencePieceTokenizer() override;
  int64_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  std::string Describe() const override;
  const std::string& model_path() const { return path_; }

 private:
  SentencePieceTokenizer(std::unique_ptr<spshim::Processor> sp, std::string path);
  std::unique_ptr<spshim::Processor> sp_;
  std::string path_;
};

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_DATA_TOKENIZER_H_
