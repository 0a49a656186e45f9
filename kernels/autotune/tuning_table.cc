#include "kernels/autotune/tuning_table.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sg::kernels::autotune {
namespace {

constexpr const char* kFormat = "sg-tuning-1";

bool IsHex(absl::string_view s) {
  if (s.size() % 2 != 0) return false;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::optional<Choice> TuningTable::Find(const TuningKey& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TuningTable::Put(const TuningKey& key, Choice choice) { entries_[key] = std::move(choice); }

void TuningTable::Merge(const TuningTable& other) {
  for (const auto& [k, c] : other.entries_) entries_.emplace(k, c);
}

std::string TuningTable::Serialize() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [k, c] : entries_) {
    entries.push_back({{"kernel", k.kernel},
                       {"device", k.device},
                       {"library", k.library},
                       {"problem", k.problem},
                       {"variant", absl::BytesToHexString(c.variant)},
                       {"us", c.microseconds},
                       {"candidates", c.candidates}});
  }
  nlohmann::json j = {{"format", kFormat}, {"entries", std::move(entries)}};
  return j.dump(1);
}

absl::StatusOr<TuningTable> TuningTable::Parse(absl::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("tuning table: expected a JSON object, found text that does not parse");
  }
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat("tuning table: expected format \"", kFormat, "\", found ",
                                                   j.contains("format") ? j["format"].dump() : "none"));
  }
  if (!j.contains("entries") || !j["entries"].is_array()) {
    return absl::InvalidArgumentError("tuning table: expected an \"entries\" array");
  }
  TuningTable t;
  int index = 0;
  for (const nlohmann::json& e : j["entries"]) {
    for (const char* f : {"kernel", "device", "library", "problem", "variant"}) {
      if (!e.is_object() || !e.contains(f) || !e[f].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tuning table: entry ", index, " needs a string field \"", f, "\""));
      }
    }
    if (!e.contains("us") || !e["us"].is_number() || !e.contains("candidates") || !e["candidates"].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tuning table: entry ", index, " needs numbers \"us\" and \"candidates\""));
    }
    const std::string hex = e["variant"].get<std::string>();
    if (!IsHex(hex)) {
      return absl::InvalidArgumentError(absl::StrCat("tuning table: entry ", index, " variant is not hex: ", hex));
    }
    TuningKey k{e["kernel"].get<std::string>(), e["device"].get<std::string>(), e["library"].get<std::string>(),
                e["problem"].get<std::string>()};
    t.Put(k, Choice{absl::HexStringToBytes(hex), e["us"].get<double>(), e["candidates"].get<int>()});
    ++index;
  }
  return t;
}

absl::StatusOr<Choice> PickFastest(int n, const std::function<absl::StatusOr<double>(int)>& measure,
                                   const std::function<std::string(int)>& variant) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("PickFastest: expected >= 1 candidate, found ", n));
  int best = -1, ok = 0;
  double best_us = 0;
  absl::Status first_error;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<double> us = measure(i);
    if (!us.ok()) {
      if (first_error.ok()) first_error = us.status();
      continue;
    }
    ++ok;
    if (best < 0 || *us < best_us) {
      best = i;
      best_us = *us;
    }
  }
  if (best < 0) {
    return absl::NotFoundError(absl::StrCat("autotune: all ", n, " candidates failed; first: ", first_error.message()));
  }
  return Choice{variant(best), best_us, ok};
}

Tuner& Tuner::Global() {
  static Tuner* t = new Tuner();
  return *t;
}

absl::StatusOr<Choice> Tuner::GetOrTune(const TuningKey& key, const TuneFn& tune) {
  if (std::optional<Choice> c = Find(key)) return *c;
  absl::StatusOr<Choice> c = tune();
  if (!c.ok()) return c.status();
  absl::MutexLock l(&mu_);
  if (std::optional<Choice> first = table_.Find(key)) return *first;
  table_.Put(key, *c);
  ++tunings_;
  ++generation_;
  return c;
}

std::optional<Choice> Tuner::Find(const TuningKey& key) const {
  absl::MutexLock l(&mu_);
  return table_.Find(key);
}

bool Tuner::enabled() const {
  absl::MutexLock l(&mu_);
  return enabled_;
}

void Tuner::set_enabled(bool on) {
  absl::MutexLock l(&mu_);
  enabled_ = on;
}

void Tuner::Install(const TuningTable& table) {
  absl::MutexLock l(&mu_);
  const size_t before = table_.size();
  table_.Merge(table);
  if (table_.size() != before) ++generation_;
}

TuningTable Tuner::Snapshot() const {
  absl::MutexLock l(&mu_);
  return table_;
}

int64_t Tuner::tunings() const {
  absl::MutexLock l(&mu_);
  return tunings_;
}

int64_t Tuner::generation() const {
  absl::MutexLock l(&mu_);
  return generation_;
}

void Tuner::Clear() {
  absl::MutexLock l(&mu_);
  table_ = TuningTable();
  tunings_ = 0;
  ++generation_;
}

bool AutotuneAllowedByEnv() {
  const char* v = std::getenv("SG_AUTOTUNE");
  if (v == nullptr) return true;
  const std::string s = absl::AsciiStrToLower(v);
  return !(s == "0" || s == "false" || s == "off");
}

}  // namespace sg::kernels::autotune
