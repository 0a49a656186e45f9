// Per-step metrics as JSON Lines: one object per line, flushed as written, so a crashed run keeps
// every completed step and `jq`/pandas read the file directly.
//
//   SG_ASSIGN_OR_RETURN(auto log, MetricsLog::Open("runs/x/metrics.jsonl"));
//   SG_RETURN_IF_ERROR(log->Write(step, {{"loss", 2.31}, {"lr", 3e-4}, {"tokens_per_s", 1.2e4}}));
#ifndef SGTRAIN_TRAINER_PROGRESS_METRICS_LOG_H_
#define SGTRAIN_TRAINER_PROGRESS_METRICS_LOG_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sg::trainer {

class MetricsLog {
 public:
  // Creates (or, with append, continues: a resumed run) the file. Errors name the path.
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(const std::string& path, bool append = false);
  ~MetricsLog();

  // Writes {"step": step, <name>: <value>, ...}; keys in name order; a NaN or infinite value is
  // written as null (JSON has no NaN).
  absl::Status Write(int64_t step, const std::map<std::string, double>& values);

 private:
  MetricsLog(std::string path, FILE* f) : path_(std::move(path)), file_(f) {}
  std::string path_;
  FILE* file_;
};

// Reads a metrics file back: (step, value of `key`) for each line that has a number for it.
// InvalidArgument naming the file and line for a line that is not a JSON object.
absl::StatusOr<std::vector<std::pair<double, double>>> ReadMetric(const std::string& path, const std::string& key);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_PROGRESS_METRICS_LOG_H_
