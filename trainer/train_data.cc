#include "trainer/train_data.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/core/status.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/token_shard.h"

namespace sg::trainer {
namespace {

absl::StatusOr<TrainingData> LoadShards(const DataOptions& o) {
  auto all = std::make_shared<std::vector<int32_t>>();
  for (const std::string& p : o.paths) {
    SG_ASSIGN_OR_RETURN(std::vector<int32_t> t, ReadTokenShard(p, o.vocab_size));
    all->insert(all->end(), t.begin(), t.end());
  }
  const int64_t n = int64_t(all->size());
  const int64_t val = std::max<int64_t>(1, int64_t(double(n) * o.val_fraction));
  if (n < 2 * val) {
    return absl::InvalidArgumentError(absl::StrCat("--data: the shards hold only ", n, " tokens; too few to split"));
  }
  TrainingData d;
  d.split.train = std::make_shared<const std::vector<int32_t>>(all->begin(), all->end() - val);
  d.split.val = std::make_shared<const std::vector<int32_t>>(all->end() - val, all->end());
  d.description = absl::StrFormat("%d token shard(s), %d tokens (last %d for validation)", o.paths.size(), n, val);
  return d;
}

}  // namespace

absl::StatusOr<TrainingData> LoadTrainingData(const DataOptions& o) {
  const auto is_shard = [](const std::string& p) { return absl::EndsWith(p, ".bin"); };
  const int shards = int(std::count_if(o.paths.begin(), o.paths.end(), is_shard));
  if (shards > 0 && shards < int(o.paths.size())) {
    return absl::InvalidArgumentError(
        "--data: expected either .bin token shards or text files/directories, found a mix of both");
  }
  if (shards > 0) return LoadShards(o);

  SG_ASSIGN_OR_RETURN(TextCorpus corpus, o.paths.empty() ? LoadDefaultCorpus() : LoadTextFiles(o.paths));
  TrainingData d;
  if (o.tokenizer == "bytes") {
    d.tokenizer = std::make_shared<ByteTokenizer>();
  } else if (o.tokenizer == "sentencepiece") {
    if (!o.tokenizer_model.empty()) {
      SG_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> sp, SentencePieceTokenizer::Load(o.tokenizer_model));
      d.tokenizer_file = sp->model_path();
      d.tokenizer = std::move(sp);
    } else {
      SG_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> sp,
                          SentencePieceTokenizer::Train(corpus, o.sp_vocab, o.out_dir));
      d.tokenizer_file = sp->model_path();
      d.tokenizer = std::move(sp);
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer: expected 'bytes' or 'sentencepiece', found '", o.tokenizer, "'"));
  }
  SG_ASSIGN_OR_RETURN(d.split, TokenizeCorpus(corpus, *d.tokenizer, o.val_fraction));
  d.description = absl::StrFormat("%s; tokenizer %s; %d train / %d validation tokens", corpus.description,
                                  d.tokenizer->Describe(), d.split.train->size(), d.split.val->size());
  return d;
}

}  // namespace sg::trainer
