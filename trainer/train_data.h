// What a run trains on: the corpus (default Debian fortunes, user text files/directories, or llm.c
// .bin token shards), the tokenizer (bytes, a SentencePiece model file, or one trained on the
// corpus) and the train/validation token split.
//
//   DataOptions d;  d.tokenizer = "sentencepiece";  d.out_dir = "runs/x";
//   SG_ASSIGN_OR_RETURN(TrainingData data, LoadTrainingData(d));
//   // data.split.train / data.split.val, data.tokenizer (null for .bin shards)
#ifndef SGTRAIN_TRAINER_TRAIN_DATA_H_
#define SGTRAIN_TRAINER_TRAIN_DATA_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/data_loader.h"
#include "trainer/data/tokenizer.h"

namespace sg::trainer {

struct DataOptions {
  // Text files or directories, or .bin shards (all of one kind); empty: the default corpus.
  std::vector<std::string> paths;
  // "bytes", "sentencepiece" (load `tokenizer_model`, or train one of `sp_vocab` pieces into
  // `out_dir`/tokenizer.model when it is empty), ignored for .bin shards.
  std::string tokenizer = "bytes";
  std::string tokenizer_model;
  int sp_vocab = 2048;
  std::string out_dir;
  double val_fraction = 0.05;
  // Shards: every token must be below this (the model's vocab_size); 0 = unchecked.
  int64_t vocab_size = 0;
};

struct TrainingData {
  std::shared_ptr<const Tokenizer> tokenizer;  // null for pre-tokenized shards
  std::string tokenizer_file;                  // the SentencePiece model to keep with checkpoints
  TokenSplit split;
  std::string description;                     // one line for the console
};

// Errors name the path and what was wrong with it (missing, empty, binary, a bad shard header, a
// token outside the vocabulary, a mix of shards and text, an unknown tokenizer name).
absl::StatusOr<TrainingData> LoadTrainingData(const DataOptions& o);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_TRAIN_DATA_H_
