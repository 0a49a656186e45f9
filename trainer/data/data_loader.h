// Batches of token windows for training: deterministic, sharded by data-parallel rank, resumable.
//
// The token stream is cut into windows of seq_len + 1 tokens that start every seq_len tokens
// (inputs are window[0:seq_len], targets window[1:seq_len+1]). Each epoch visits the windows in a
// permutation fixed by (seed, epoch). A global step takes batch_size * world_size consecutive
// windows of that permutation; rank r gets the r-th block of batch_size. The position is the
// number of windows consumed globally, so a checkpoint resumes exactly at the same world size and
// at the same place in the data at a different one.
//
//   SG_ASSIGN_OR_RETURN(TokenSplit split, TokenizeCorpus(corpus, tokenizer, /*val_fraction=*/0.05));
//   DataLoaderOptions o;  o.batch_size = 8;  o.seq_len = 128;  o.rank = rank;  o.world_size = world;
//   SG_ASSIGN_OR_RETURN(DataLoader train, DataLoader::Create(split.train, o));
//   SG_ASSIGN_OR_RETURN(Tensor batch, train.Next());   // host i32 [8, 129]
//   state.data = train.position();  ...  SG_RETURN_IF_ERROR(train.Seek(state.data));
#ifndef SGTRAIN_TRAINER_DATA_DATA_LOADER_H_
#define SGTRAIN_TRAINER_DATA_DATA_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/tensor.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"

namespace sg::trainer {

using TokenStream = std::shared_ptr<const std::vector<int32_t>>;

struct TokenSplit {
  TokenStream train;
  TokenStream val;
};

// Tokenizes every document as BOS + Encode(text) + EOS into one stream, cuts it into chunks of
// kValChunkTokens (shorter when the stream has fewer than k such chunks) and sends every k-th chunk
// (k = round(1 / val_fraction)) to validation: both splits sample the whole corpus, whatever the
// number of documents (one long file works as well as 15,000 fortunes), and the split depends only
// on the tokens. val_fraction 0 puts everything in train. InvalidArgument when val_fraction is
// outside [0, 0.5] or the stream has fewer than k tokens. Whether a split holds a whole batch is
// DataLoader::Create's check.
inline constexpr int64_t kValChunkTokens = 2048;
absl::StatusOr<TokenSplit> TokenizeCorpus(const TextCorpus& corpus, const Tokenizer& tokenizer,
                                          double val_fraction);

// Where a loader is: `epoch` and the number of windows consumed (globally) within it.
struct DataPosition {
  int64_t epoch = 0;
  int64_t window = 0;
  friend bool operator==(const DataPosition& a, const DataPosition& b) {
    return a.epoch == b.epoch && a.window == b.window;
  }
};

struct DataLoaderOptions {
  int64_t batch_size = 1;  // per rank
  int64_t seq_len = 128;
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;  // false: windows in stream order (validation)
};

class DataLoader {
 public:
  // InvalidArgument when an option is out of range, or the stream has fewer windows than one
  // global batch (the message gives the token count and what one batch needs).
  static absl::StatusOr<DataLoader> Create(TokenStream tokens, const DataLoaderOptions& options);

  // This rank's next batch: host int32 [batch_size, seq_len + 1]. Moves to the next epoch (a new
  // permutation) when fewer windows than a global batch remain.
  absl::StatusOr<Tensor> Next();

  DataPosition position() const { return position_; }
  // Continues from `p` (taken from position(), possibly under another world size). InvalidArgument
  // when p.window is not within an epoch.
  absl::Status Seek(const DataPosition& p);

  int64_t num_windows() const { return num_windows_; }
  // Global steps per epoch (the windows that do not fill a last global batch are skipped).
  int64_t steps_per_epoch() const;
  const DataLoaderOptions& options() const { return options_; }

 private:
  DataLoader(TokenStream tokens, DataLoaderOptions options, int64_t num_windows);
  // The window index at position `i` of epoch `epoch`'s order.
  int64_t WindowAt(int64_t epoch, int64_t i);

  TokenStream tokens_;
  DataLoaderOptions options_;
  int64_t num_windows_;
  DataPosition position_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_DATA_DATA_LOADER_H_
