#include "trainer/progress/metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "nlohmann/json.hpp"
#include "trainer/io/file_io.h"

namespace sg::trainer {

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(const std::string& path, bool append) {
  FILE* f = std::fopen(path.c_str(), append ? "a" : "w");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot open metrics file '", path, "': ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsLog>(new MetricsLog(path, f));
}

MetricsLog::~MetricsLog() { std::fclose(file_); }

absl::Status MetricsLog::Write(int64_t step, const std::map<std::string, double>& values) {
  nlohmann::ordered_json j;
  j["step"] = step;
  for (const auto& [name, v] : values) {
    if (std::isfinite(v)) {
      j[name] = v;
    } else {
      j[name] = nullptr;
    }
  }
  const std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat("cannot write metrics file '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<double, double>>> ReadMetric(const std::string& path, const std::string& key) {
  SG_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<std::pair<double, double>> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a JSON object: ", e.what()));
    }
    if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": expected a JSON object"));
    if (j.contains(key) && j[key].is_number() && j.contains("step") && j["step"].is_number()) {
      out.emplace_back(j["step"].get<double>(), j[key].get<double>());
    }
  }
  return out;
}

}  // namespace sg::trainer
