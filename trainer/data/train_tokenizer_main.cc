// Trains a SentencePiece tokenizer on text files (or the default corpus) and reports its
// compression, so a run can reuse the model with the trainer's --tokenizer flag.
//
//   bazel run //trainer/data:train_tokenizer -- OUT_DIR VOCAB_SIZE [TEXT_PATH...]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR VOCAB_SIZE [TEXT_PATH...]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int vocab = std::atoi(argv[2]);
  std::vector<std::string> paths(argv + 3, argv + argc);
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
