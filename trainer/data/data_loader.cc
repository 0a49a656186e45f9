#include "trainer/data/data_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace sg::trainer {
namespace {

// SplitMix64: a small generator whose output is fixed by its definition, so the window order is
// the same on every platform and standard library (std::shuffle's is not specified).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<TokenSplit> TokenizeCorpus(const TextCorpus& corpus, const Tokenizer& tokenizer,
                                          double val_fraction) {
  SG_CHECK_ARG(val_fraction >= 0.0 && val_fraction <= 0.5, "val_fraction is ", val_fraction,
               ", expected a value in [0, 0.5]");
  std::vector<int32_t> all;
  for (const TextDocument& d : corpus.documents) {
    SG_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(d.text));
    all.push_back(tokenizer.bos_id());
    all.insert(all.end(), ids.begin(), ids.end());
    all.push_back(tokenizer.eos_id());
  }
  const int64_t n = int64_t(all.size());
  if (val_fraction == 0) {
    SG_CHECK_ARG(n > 0, "the corpus (", corpus.description, ") gave no training tokens");
    return TokenSplit{std::make_shared<const std::vector<int32_t>>(std::move(all)),
                      std::make_shared<const std::vector<int32_t>>()};
  }
  const int64_t every = std::max<int64_t>(2, std::llround(1.0 / val_fraction));
  // Chunks of kValChunkTokens, or shorter when the stream holds fewer than `every` of them.
  const int64_t chunk = std::min<int64_t>(kValChunkTokens, n / every);
  SG_CHECK_ARG(chunk > 0, "the corpus (", corpus.description, ") has only ", n, " tokens: too few for a ",
               "validation split of ", val_fraction, " (expected at least ", every, ")");
  auto train = std::make_shared<std::vector<int32_t>>();
  auto val = std::make_shared<std::vector<int32_t>>();
  train->reserve(size_t(n - n / every));
  val->reserve(size_t(n / every + chunk));
  for (int64_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    std::vector<int32_t>& out = (c % every == every - 1) ? *val : *train;
    out.insert(out.end(), all.begin() + begin, all.begin() + std::min(n, begin + chunk));
  }
  return TokenSplit{train, val};
}

DataLoader::DataLoader(TokenStream tokens, DataLoaderOptions options, int64_t num_windows)
    : tokens_(std::move(tokens)), options_(options), num_windows_(num_windows) {}

absl::StatusOr<DataLoader> DataLoader::Create(TokenStream tokens, const DataLoaderOptions& o) {
  SG_CHECK_ARG(tokens != nullptr, "DataLoader: no token stream");
  SG_CHECK_ARG(o.batch_size > 0 && o.seq_len > 0, "DataLoader: batch_size (", o.batch_size, ") and seq_len (",
               o.seq_len, ") must be positive");
  SG_CHECK_ARG(o.world_size > 0 && o.rank >= 0 && o.rank < o.world_size, "DataLoader: rank ", o.rank,
               " is not in [0, world_size = ", o.world_size, ")");
  const int64_t n = int64_t(tokens->size());
  const int64_t windows = n > o.seq_len ? (n - 1) / o.seq_len : 0;
  const int64_t global_batch = o.batch_size * o.world_size;
  SG_CHECK_ARG(windows >= global_batch, "DataLoader: the token stream has ", n, " tokens = ", windows,
               " windows of seq_len + 1 = ", o.seq_len + 1, ", fewer than one global batch of ", global_batch,
               " (batch_size ", o.batch_size, " x world_size ", o.world_size,
               "); use more text, a smaller batch or a shorter sequence");
  return DataLoader(std::move(tokens), o, windows);
}

int64_t DataLoader::steps_per_epoch() const {
  return num_windows_ / (options_.batch_size * options_.world_size);
}

int64_t DataLoader::WindowAt(int64_t epoch, int64_t i) {
  if (!options_.shuffle) return i;
  if (order_epoch_ != epoch) {
    order_.resize(size_t(num_windows_));
    std::iota(order_.begin(), order_.end(), 0);
    uint64_t state = options_.seed * 0x100000001b3ull ^ uint64_t(epoch);
    for (int64_t k = num_windows_ - 1; k > 0; --k) {  // Fisher-Yates
      const int64_t j = int64_t(SplitMix64(state) % uint64_t(k + 1));
      std::swap(order_[size_t(k)], order_[size_t(j)]);
    }
    order_epoch_ = epoch;
  }
  return order_[size_t(i)];
}

absl::StatusOr<Tensor> DataLoader::Next() {
  const int64_t global_batch = options_.batch_size * options_.world_size;
  if (position_.window + global_batch > num_windows_) position_ = {position_.epoch + 1, 0};
  const int64_t len = options_.seq_len + 1;
  SG_ASSIGN_OR_RETURN(Tensor batch, Tensor::Empty({options_.batch_size, len}, DType::kI32, Device::Cpu()));
  int32_t* out = batch.data<int32_t>();
  const int64_t first = position_.window + int64_t(options_.rank) * options_.batch_size;
  for (int64_t b = 0; b < options_.batch_size; ++b) {
    const int64_t w = WindowAt(position_.epoch, first + b);
    std::memcpy(out + b * len, tokens_->data() + w * options_.seq_len, size_t(len) * sizeof(int32_t));
  }
  position_.window += global_batch;
  return batch;
}

absl::Status DataLoader::Seek(const DataPosition& p) {
  SG_CHECK_ARG(p.epoch >= 0 && p.window >= 0 && p.window <= num_windows_, "DataLoader::Seek: position (epoch ",
               p.epoch, ", window ", p.window, ") is outside the stream's ", num_windows_, " windows per epoch");
  position_ = p;
  return absl::OkStatus();
}

}  // namespace sg::trainer
