#include "trainer/progress/progress_bar.h"

#include <unistd.h>

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sg::trainer {

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "--:--";
  const int64_t s = int64_t(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%02d:%02d", s / 60, s % 60);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

std::string FormatRate(double per_s) {
  if (!std::isfinite(per_s) || per_s < 0) return "-";
  if (per_s < 1e3) return absl::StrFormat("%.0f", per_s);
  if (per_s < 1e6) return absl::StrFormat("%.1fk", per_s / 1e3);
  if (per_s < 1e9) return absl::StrFormat("%.2fM", per_s / 1e6);
  return absl::StrFormat("%.2fG", per_s / 1e9);
}

std::string FormatProgressLine(const ProgressUpdate& u) {
  constexpr int kBarWidth = 20;
  const double frac = u.total_steps > 0 ? std::min(1.0, std::max(0.0, double(u.step) / double(u.total_steps))) : 0;
  const int filled = int(frac * kBarWidth);
  const std::string bar = std::string(size_t(filled), '#') + std::string(size_t(kBarWidth - filled), '.');
  const int digits = int(std::to_string(u.total_steps).size());
  const double eta = u.step > 0 ? u.elapsed_s / double(u.step) * double(u.total_steps - u.step) : -1;
  std::string line = absl::StrFormat("step %*d/%d [%s]  loss %.4f | %s tok/s | %s elapsed | ETA %s", digits, u.step,
                                     u.total_steps, bar, u.loss, FormatRate(u.tokens_per_s),
                                     FormatDuration(u.elapsed_s), FormatDuration(eta));
  if (u.memory_bytes >= 0) absl::StrAppend(&line, " | ", u.memory_label, " ", FormatBytes(u.memory_bytes));
  return line;
}

int64_t CurrentRssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return -1;
  return resident_pages * int64_t(::sysconf(_SC_PAGESIZE));
}

ProgressBar ProgressBar::ForStderr(double plain_interval_s) {
  return ProgressBar(stderr, ::isatty(::fileno(stderr)) == 1, plain_interval_s);
}

void ProgressBar::Update(const ProgressUpdate& u) {
  const std::string line = FormatProgressLine(u);
  if (tty_) {
    // \r back to the start, the line, then erase whatever a longer previous line left.
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    line_open_ = true;
  } else if (u.elapsed_s - last_plain_s_ >= interval_s_ || u.step >= u.total_steps) {
    std::fprintf(out_, "%s\n", line.c_str());
    last_plain_s_ = u.elapsed_s;
  }
  std::fflush(out_);
}

void ProgressBar::Finish() {
  if (tty_ && line_open_) std::fputc('\n', out_);
  line_open_ = false;
  std::fflush(out_);
}

}  // namespace sg::trainer
