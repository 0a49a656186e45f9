// A loss-curve picture as a self-contained SVG (no scripts, fonts or external references) that a
// browser or image viewer opens: axes with "nice" tick values, axis labels, a title, a legend,
// one polyline per series.
//
//   PlotSeries train{"train loss", {{1, 5.5}, {2, 4.1}, ...}};
//   PlotSeries val{"validation loss", {{100, 2.9}, ...}};
//   SG_RETURN_IF_ERROR(WriteLossCurveSvg("runs/x/loss.svg", {train, val}, PlotOptions{}));
#ifndef SGTRAIN_TRAINER_PROGRESS_LOSS_CURVE_SVG_H_
#define SGTRAIN_TRAINER_PROGRESS_LOSS_CURVE_SVG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace sg::trainer {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are skipped
  std::string color;                              // empty: picked from a fixed palette
};

struct PlotOptions {
  std::string title = "Training loss";
  std::string x_label = "step";
  std::string y_label = "loss (nats/token)";
  int width = 800;
  int height = 500;
};

// The SVG text. Any input is drawn (empty series, a single point, constant values): the axis
// ranges are widened where they would be empty. Text is XML-escaped.
std::string LossCurveSvg(const std::vector<PlotSeries>& series, const PlotOptions& options = PlotOptions{});

// Writes LossCurveSvg atomically.
absl::Status WriteLossCurveSvg(const std::string& path, const std::vector<PlotSeries>& series,
                               const PlotOptions& options = PlotOptions{});

// Tick values at 1, 2 or 5 times a power of ten covering [lo, hi], about `target` of them.
std::vector<double> NiceTicks(double lo, double hi, int target = 6);

}  // namespace sg::trainer

#endif  // SGTRAIN_TRAINER_PROGRESS_LOSS_CURVE_SVG_H_
