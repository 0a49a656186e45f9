// The training progress line: step/total with a bar, loss, tokens/s, elapsed, ETA and memory.
// On a terminal it redraws one line in place (\r); otherwise (a log file, CI) it prints a plain
// line every `plain_interval_s` seconds of training time, and always for the last step.
//
//   ProgressBar bar = ProgressBar::ForStderr();
//   ProgressUpdate u;  u.step = s;  u.total_steps = n;  u.loss = l;  u.tokens_per_s = tps;
//   u.elapsed_s = t;  u.memory_bytes = CurrentRssBytes();
//   bar.Update(u);  ...  bar.Finish();
#ifndef SGTRAIN_TRAINER_PROGRESS_PROGRESS_BAR_H_
#define SGTRAIN_TRAINER_PROGRESS_PROGRESS_BAR_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace sg::trainer {

struct ProgressUpdate {
  int64_t step = 0;  // steps done, 1-based after the first step
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_s = 0;
  double elapsed_s = 0;       // since training started
  int64_t memory_bytes = -1;  // -1: not shown (e.g. peak device memory, or CurrentRssBytes())
  std::string memory_label = "mem";  // "mem" (host RSS) or e.g. "gpu"
};

// "step   50/200 [#####...............]  loss 2.3456 | 12.3k tok/s | 00:10 elapsed | ETA 00:30 | mem 1.5 GiB".
// The ETA extrapolates the average time per step so far.
std::string FormatProgressLine(const ProgressUpdate& u);

// "45s" style durations as "mm:ss", or "h:mm:ss" from an hour up; "--:--" for negative/unknown.
std::string FormatDuration(double seconds);
// "512 B", "1.5 KiB", "1.5 MiB", "1.5 GiB".
std::string FormatBytes(int64_t bytes);
// "950", "12.3k", "4.56M".
std::string FormatRate(double per_s);

// This process's resident memory from /proc/self/statm, or -1 when unavailable.
int64_t CurrentRssBytes();

class ProgressBar {
 public:
  ProgressBar(FILE* out, bool is_tty, double plain_interval_s = 10.0)
      : out_(out), tty_(is_tty), interval_s_(plain_interval_s) {}
  // stderr, redrawing when stderr is a terminal.
  static ProgressBar ForStderr(double plain_interval_s = 10.0);

  void Update(const ProgressUpdate& u);
  // Ends the redrawn line (prints the newline a terminal needs). Safe to call more than once.
  void Finish();
  bool is_tty() const { return tty_; }

 private:
  FILE* out_;
  bool tty_;
  double interval_s_;
  double last_plain_s_ = -1e300;
  bool line_open_ = false;
};

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_PROGRESS_PROGRESS_BAR_H_
