#include "kernels/autotune/tuning_table.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

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
    if (!c.cost_unit.empty()) {
      entries.back()["cost_unit"] = c.cost_unit;
      entries.back()["cost"] = c.cost;
      entries.back()["fastest_cost"] = c.fastest_cost;
    }
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
    Choice c{absl::HexStringToBytes(hex), e["us"].get<double>(), e["candidates"].get<int>()};
    if (e.contains("cost_unit")) {
      if (!e["cost_unit"].is_string() || !e.contains("cost") || !e["cost"].is_number() || !e.contains("fastest_cost") ||
          !e["fastest_cost"].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tuning table: entry ", index, " has \"cost_unit\" and needs a string unit and numbers \"cost\" and \"fastest_cost\""));
      }
      c.cost_unit = e["cost_unit"].get<std::string>();
      c.cost = e["cost"].get<double>();
      c.fastest_cost = e["fastest_cost"].get<double>();
    }
    t.Put(k, std::move(c));
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

absl::StatusOr<Choice> PickCheapest(int n, const std::function<absl::StatusOr<double>(int)>& measure,
                                    const std::function<std::string(int)>& variant,
                                    const std::function<absl::StatusOr<double>(int i, int64_t calls)>& run,
                                    CostMeter* meter, const RerankPolicy& policy) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("PickCheapest: expected >= 1 candidate, found ", n));
  std::vector<std::pair<double, int>> timed;  // (us, index) of the candidates that ran
  absl::Status first_error;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<double> us = measure(i);
    if (us.ok()) {
      timed.emplace_back(*us, i);
    } else if (first_error.ok()) {
      first_error = us.status();
    }
  }
  if (timed.empty()) {
    return absl::NotFoundError(absl::StrCat("autotune: all ", n, " candidates failed; first: ", first_error.message()));
  }
  // Stable: equal times keep the heuristic's order, as PickFastest's ties do.
  std::stable_sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  Choice fastest{variant(timed[0].second), timed[0].first, int(timed.size())};
  if (meter == nullptr || timed[0].first < policy.min_us) return fastest;
  int best = -1;
  double best_cost = 0, fastest_cost = 0;
  absl::Status meter_error;
  for (size_t r = 0; r < timed.size() && int(r) < policy.max_candidates; ++r) {
    const auto [us, i] = timed[r];
    if (us > timed[0].first * policy.within) break;
    absl::StatusOr<double> cost = meter->CostPerCall([&, i = i](int64_t calls) { return run(i, calls); }, us);
    if (!cost.ok()) {
      if (meter_error.ok()) meter_error = cost.status();
      continue;
    }
    if (r == 0) fastest_cost = *cost;
    if (best < 0 || *cost < best_cost) {
      best = int(r);
      best_cost = *cost;
    }
  }
  if (best < 0) return meter_error;
  Choice c{variant(timed[size_t(best)].second), timed[size_t(best)].first, int(timed.size())};
  c.cost_unit = meter->unit();
  c.cost = best_cost;
  c.fastest_cost = fastest_cost;
  return c;
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

void Tuner::set_meter(std::shared_ptr<CostMeter> meter, RerankPolicy policy) {
  absl::MutexLock l(&mu_);
  meter_ = std::move(meter);
  policy_ = policy;
}

std::shared_ptr<CostMeter> Tuner::meter() const {
  absl::MutexLock l(&mu_);
  return meter_;
}

RerankPolicy Tuner::rerank_policy() const {
  absl::MutexLock l(&mu_);
  return policy_;
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
