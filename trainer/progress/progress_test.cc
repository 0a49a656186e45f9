#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "nlohmann/json.hpp"
#include "trainer/io/file_io.h"
#include "trainer/progress/loss_curve_svg.h"
#include "trainer/progress/metrics_log.h"
#include "trainer/progress/progress_bar.h"

namespace sg::trainer {
namespace {

std::string TmpPath(const std::string& name) { return JoinPath(std::getenv("TEST_TMPDIR"), name); }

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ProgressBarTest, LineShowsEveryField) {
  ProgressUpdate u;
  u.step = 50;
  u.total_steps = 200;
  u.loss = 2.34567;
  u.tokens_per_s = 12345;
  u.elapsed_s = 10;
  u.memory_bytes = int64_t(1.5 * (1 << 30));
  const std::string line = FormatProgressLine(u);
  EXPECT_TRUE(Contains(line, "step  50/200 [#####...............]")) << line;
  EXPECT_TRUE(Contains(line, "loss 2.3457")) << line;
  EXPECT_TRUE(Contains(line, "12.3k tok/s")) << line;
  EXPECT_TRUE(Contains(line, "00:10 elapsed")) << line;
  EXPECT_TRUE(Contains(line, "ETA 00:30")) << line;  // 10 s for 50 steps, 150 to go
  EXPECT_TRUE(Contains(line, "mem 1.5 GiB")) << line;
  u.step = 0;
  EXPECT_TRUE(Contains(FormatProgressLine(u), "ETA --:--"));
  EXPECT_EQ(FormatDuration(3725), "1:02:05");
  EXPECT_EQ(FormatDuration(59.6), "01:00");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(FormatRate(950), "950");
  EXPECT_EQ(FormatRate(4.56e6), "4.56M");
  EXPECT_GT(CurrentRssBytes(), 1 << 20);
}

std::string Capture(bool tty, double interval, int steps) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  {
    ProgressBar bar(f, tty, interval);
    for (int s = 1; s <= steps; ++s) {
      ProgressUpdate u;
      u.step = s;
      u.total_steps = steps;
      u.loss = 5.0 / s;
      u.elapsed_s = 0.5 * s;
      bar.Update(u);
    }
    bar.Finish();
  }
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

TEST(ProgressBarTest, RedrawsOnATerminalAndPrintsPeriodicLinesOtherwise) {
  const std::string tty = Capture(true, 10, 40);
  EXPECT_EQ(std::count(tty.begin(), tty.end(), '\r'), 40);
  EXPECT_EQ(std::count(tty.begin(), tty.end(), '\n'), 1);  // only Finish's
  EXPECT_TRUE(Contains(tty, "\x1b[K"));
  EXPECT_TRUE(Contains(tty, "step 40/40 [####################]"));

  // 40 steps of 0.5 s with a 5 s interval: steps 1, 11, 21, 31, and the last.
  const std::string plain = Capture(false, 5, 40);
  EXPECT_EQ(plain.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), '\n'), 5) << plain;
  EXPECT_TRUE(Contains(plain, "step  1/40"));
  EXPECT_TRUE(Contains(plain, "step 11/40"));
  EXPECT_TRUE(Contains(plain, "step 40/40"));
}

TEST(MetricsLogTest, OneJsonObjectPerStep) {
  const std::string path = TmpPath("metrics.jsonl");
  auto& rng = testing::Rng();
  std::vector<double> losses;
  {
    auto log = MetricsLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status();
    for (int s = 1; s <= 20; ++s) {
      losses.push_back(1.0 + double(rng() % 1000) / 100.0);
      ASSERT_TRUE((*log)->Write(s, {{"loss", losses.back()}, {"lr", 3e-4 * s}, {"grad_norm", s == 7 ? NAN : 1.0}}).ok());
    }
  }
  {
    auto more = MetricsLog::Open(path, /*append=*/true);  // a resumed run continues the file
    ASSERT_TRUE(more.ok());
    ASSERT_TRUE((*more)->Write(21, {{"loss", 0.5}}).ok());
  }
  const std::string text = *ReadFile(path);
  size_t lines = 0, pos = 0;
  while ((pos = text.find('\n', pos)) != std::string::npos) ++lines, ++pos;
  EXPECT_EQ(lines, 21u);
  const nlohmann::json first = nlohmann::json::parse(text.substr(0, text.find('\n')));
  EXPECT_EQ(first["step"], 1);
  EXPECT_TRUE(Contains(text, "\"grad_norm\":null"));
  auto loss = ReadMetric(path, "loss");
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_EQ(loss->size(), 21u);
  for (int s = 0; s < 20; ++s) {
    EXPECT_EQ((*loss)[size_t(s)].first, s + 1);
    EXPECT_EQ((*loss)[size_t(s)].second, losses[size_t(s)]);  // round-trips exactly
  }
  ASSERT_TRUE(WriteFileAtomic(TmpPath("broken.jsonl"), "{\"step\": 1}\n{oops\n").ok());
  auto broken = ReadMetric(TmpPath("broken.jsonl"), "loss");
  ASSERT_FALSE(broken.ok());
  EXPECT_TRUE(Contains(std::string(broken.status().message()), "broken.jsonl:2:")) << broken.status();
  EXPECT_FALSE(MetricsLog::Open(TmpPath("no/dir/m.jsonl")).ok());
}

TEST(LossCurveSvgTest, TicksAreNiceAndCoverTheRange) {
  const std::vector<double> t = NiceTicks(0.13, 5.61);
  ASSERT_GE(t.size(), 4u);
  EXPECT_DOUBLE_EQ(t[0], 1.0);
  EXPECT_DOUBLE_EQ(t[1] - t[0], 1.0);
  EXPECT_LE(t.back(), 5.61);
  const std::vector<double> steps = NiceTicks(1, 2000);
  EXPECT_DOUBLE_EQ(steps[1] - steps[0], 500);
}

// Parses the SVG with Python's XML parser (independent of how it was written) and checks its
// structure and the geometry of the curve.
TEST(LossCurveSvgTest, WellFormedSvgWithAxesLabelsAndTheCurve) {
  auto& rng = testing::Rng();
  PlotSeries train{"train <loss> & co", {}, ""};
  const int n = 50 + int(rng() % 100);
  for (int s = 1; s <= n; ++s) train.points.emplace_back(s, 5.5 * std::exp(-s / 40.0) + 2 + double(rng() % 100) / 1000);
  train.points.emplace_back(n + 1, NAN);  // skipped
  PlotSeries val{"validation", {{n / 2.0, 3.1}, {double(n), 2.4}}, ""};
  const std::string path = TmpPath("loss.svg");
  ASSERT_TRUE(WriteLossCurveSvg(path, {train, val}).ok());

  const std::string script = R"PY(
import sys, xml.etree.ElementTree as ET
ns = '{http://www.w3.org/2000/svg}'
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == ns + 'svg', root.tag
area = [e for e in root.iter(ns + 'rect') if e.get('id') == 'plot-area'][0]
x0, y0 = float(area.get('x')), float(area.get('y'))
x1, y1 = x0 + float(area.get('width')), y0 + float(area.get('height'))
texts = [''.join(t.itertext()) for t in root.iter(ns + 'text')]
lines = [p for p in root.iter(ns + 'polyline')]
print('texts', len(texts))
print('title', 'Training loss' in texts)
print('labels', 'step' in texts, 'loss (nats/token)' in texts)
print('legend', 'train <loss> & co' in texts, 'validation' in texts)
for p in lines:
    pts = [tuple(map(float, q.split(','))) for q in p.get('points').split()]
    inside = all(x0 - 0.01 <= x <= x1 + 0.01 and y0 - 0.01 <= y <= y1 + 0.01 for x, y in pts)
    increasing = all(a[0] < b[0] for a, b in zip(pts, pts[1:]))
    print('series', p.get('data-name'), len(pts), inside, increasing, pts[0][1] < pts[-1][1])
)PY";
  ASSERT_TRUE(WriteFileAtomic(TmpPath("check_svg.py"), script).ok());
  FILE* p = popen(("python3 " + TmpPath("check_svg.py") + " " + path + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_TRUE(Contains(out, "title True")) << out;
  EXPECT_TRUE(Contains(out, "labels True True")) << out;
  EXPECT_TRUE(Contains(out, "legend True True")) << out;
  // All points inside the plot area, x increasing, and the falling loss drawn going down: SVG's y
  // grows downwards, so the first (high) loss has a smaller y than the last (low) one.
  EXPECT_TRUE(Contains(out, "series train <loss> & co " + std::to_string(n) + " True True True")) << out;
  EXPECT_TRUE(Contains(out, "series validation 2 True True True")) << out;

  // Degenerate input still gives a valid picture.
  for (const std::vector<PlotSeries>& s : {std::vector<PlotSeries>{}, std::vector<PlotSeries>{{"one", {{3, 2.0}}, ""}}}) {
    const std::string svg = LossCurveSvg(s);
    EXPECT_TRUE(Contains(svg, "</svg>"));
    EXPECT_FALSE(Contains(svg, "nan"));
    EXPECT_FALSE(Contains(svg, "inf"));
  }
}

}  // namespace
}  // namespace sg::trainer
