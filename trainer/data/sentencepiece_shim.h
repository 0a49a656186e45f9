// A std-only wrapper around SentencePiece. Internal to the tokenizer target: SentencePiece 0.1.97's
// header declares `absl::string_view` as std::string_view, which clashes with Debian's Abseil (its
// own class), so the one file that includes SentencePiece includes no Abseil header.
#ifndef SGTRAIN_TRAINER_DATA_SENTENCEPIECE_SHIM_H_
#define SGTRAIN_TRAINER_DATA_SENTENCEPIECE_SHIM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sg::trainer::spshim {

class Processor {
 public:
  Processor();
  ~Processor();
  // False with `error` set when the file is missing or is not a SentencePiece model.
  bool Load(const std::string& path, std::string* error);
  bool LoadFromSerialized(const std::string& bytes, std::string* error);
  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;
  bool Encode(const std::string& text, std::vector<int>* ids, std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SentencePieceTrainer::Train with these flags (e.g. {"input", path}, {"vocab_size", "512"});
// the serialized model is returned in `model`.
bool Train(const std::map<std::string, std::string>& flags, std::string* model, std::string* error);

}  // namespace sg::trainer::spshim

#endif  // SGTRAIN_TRAINER_DATA_SENTENCEPIECE_SHIM_H_
