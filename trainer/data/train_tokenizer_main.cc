// Trains a SentencePiece tokenizer on text files (or the default corpus) and reports its
// compression, so a run can reuse the model with the trainer's --tokenizer flag.
//
//   bazel run //trainer/data:train_tokenizer -- OUT_DIR VOCAB_SIZE [TEXT_PATH...]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Trains a SentencePiece tokenizer.\n  train_tokenizer OUT_DIR VOCAB_SIZE [TEXT_PATH...]");
  // No flags of its own: parsing still answers --help and rejects a mistyped flag.
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 3) {
    std::fprintf(stderr, "usage: train_tokenizer OUT_DIR VOCAB_SIZE [TEXT_PATH...]\n");
    return 2;
  }
  const std::string out = args[1];
  int vocab = 0;
  if (!absl::SimpleAtoi(args[2], &vocab) || vocab < 1) {
    std::fprintf(stderr, "error: VOCAB_SIZE: expected a positive integer, found '%s'\n", args[2]);
    return 2;
  }
  std::vector<std::string> paths(args.begin() + 3, args.end());
  auto corpus = paths.empty() ? sg::trainer::LoadDefaultCorpus() : sg::trainer::LoadTextFiles(paths);
  if (!corpus.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(corpus.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "corpus: %s\n", corpus->description.c_str());
  const auto start = std::chrono::steady_clock::now();
  auto tok = sg::trainer::SentencePieceTokenizer::Train(*corpus, vocab, out);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t tokens = 0;
  for (const auto& d : corpus->documents) tokens += int64_t((*tok)->Encode(d.text)->size());
  std::printf("%s trained in %.1f s; %.2f bytes per token over the corpus\n", (*tok)->Describe().c_str(), seconds,
              double(corpus->total_bytes()) / double(tokens));
  return 0;
}
