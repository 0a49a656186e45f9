#include "trainer/progress/loss_curve_svg.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (uint8_t(c) >= 0x20 || c == '\t' || c == '\n') out.push_back(c);  // XML forbids other controls
    }
  }
  return out;
}

std::string TickLabel(double v, double step) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3) return absl::StrFormat("%.3g", v);
  const int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  return absl::StrFormat("%.*f", decimals, v);
}

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string LossCurveSvg(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  const double left = 70, right = 20, top = 40, bottom = 55;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const PlotSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // nothing to draw: an empty frame
  if (x1 - x0 <= 0) x0 -= 0.5, x1 += 0.5;
  if (y1 - y0 <= 0) y0 -= 0.5, y1 += 0.5;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (y1 - y) / (y1 - y0) * ph; };

  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">%s</text>\n",
      o.width, o.height, o.width, o.height, left + pw / 2, Escape(o.title));
  absl::StrAppendFormat(&svg, "<rect id=\"plot-area\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"none\" stroke=\"#444\"/>\n", left, top, pw, ph);
  const std::vector<double> xt = NiceTicks(x0, x1), yt = NiceTicks(y0, y1);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  svg += "<g class=\"x-ticks\" text-anchor=\"middle\">\n";
  for (double t : xt) {
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", px(t), top, px(t), top + ph, px(t),
                          top + ph + 16, TickLabel(t, xstep));
  }
  svg += "</g>\n<g class=\"y-ticks\" text-anchor=\"end\">\n";
  for (double t : yt) {
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", left, py(t), left + pw, py(t), left - 6,
                          py(t) + 4, TickLabel(t, ystep));
  }
  svg += "</g>\n";
  absl::StrAppendFormat(&svg, "<text class=\"x-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        left + pw / 2, double(o.height) - 12, Escape(o.x_label));
  absl::StrAppendFormat(&svg, "<text class=\"y-label\" transform=\"translate(16 %.1f) rotate(-90)\" "
                        "text-anchor=\"middle\">%s</text>\n", top + ph / 2, Escape(o.y_label));
  for (size_t i = 0; i < series.size(); ++i) {
    const PlotSeries& s = series[i];
    const std::string color = s.color.empty() ? kPalette[i % 6] : Escape(s.color);
    std::string points;
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(x) && std::isfinite(y)) absl::StrAppendFormat(&points, "%.2f,%.2f ", px(x), py(y));
    }
    if (!points.empty()) points.pop_back();
    absl::StrAppendFormat(&svg, "<polyline class=\"series\" data-name=\"%s\" fill=\"none\" stroke=\"%s\" "
                          "stroke-width=\"1.5\" points=\"%s\"/>\n", Escape(s.name), color, points);
    const double ly = top + 14 + 16 * double(i);
    absl::StrAppendFormat(&svg, "<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"%s\" stroke-width=\"3\"/><text x=\"%.1f\" y=\"%.1f\">%s</text></g>\n",
                          left + pw - 150, ly, left + pw - 130, ly, color, left + pw - 124, ly + 4, Escape(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

absl::Status WriteLossCurveSvg(const std::string& path, const std::vector<PlotSeries>& series,
                               const PlotOptions& options) {
  return WriteFileAtomic(path, LossCurveSvg(series, options));
}

}  // namespace sg::trainer
