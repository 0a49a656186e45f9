// Includes SentencePiece and no Abseil header (see sentencepiece_shim.h).
#include "trainer/data/sentencepiece_shim.h"

#include <unordered_map>

#include "sentencepiece_processor.h"
#include "sentencepiece_trainer.h"

namespace sg::trainer::spshim {

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Processor::Processor() : impl_(std::make_unique<Impl>()) {}
Processor::~Processor() = default;

bool Processor::Load(const std::string& path, std::string* error) {
  const auto status = impl_->sp.Load(path);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool Processor::LoadFromSerialized(const std::string& bytes, std::string* error) {
  const auto status = impl_->sp.LoadFromSerializedProto(bytes);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int Processor::vocab_size() const { return impl_->sp.GetPieceSize(); }
int Processor::bos_id() const { return impl_->sp.bos_id(); }
int Processor::eos_id() const { return impl_->sp.eos_id(); }

bool Processor::Encode(const std::string& text, std::vector<int>* ids, std::string* error) const {
  const auto status = impl_->sp.Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool Processor::Decode(const std::vector<int>& ids, std::string* text, std::string* error) const {
  const auto status = impl_->sp.Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool Train(const std::map<std::string, std::string>& flags, std::string* model, std::string* error) {
  const std::unordered_map<std::string, std::string> kwargs(flags.begin(), flags.end());
  const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, nullptr, model);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

}  // namespace sg::trainer::spshim
