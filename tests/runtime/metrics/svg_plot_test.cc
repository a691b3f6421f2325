// The SVG line charts: nice ticks, tick labels, and the document's structure (panels, polylines,
// legends, escaping). Well-formedness as XML is checked by the `strata plot` CLI test with a real
// XML parser.
#include "runtime/metrics/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace strata::metrics {
namespace {

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Whether `step` is 1, 2 or 5 times a power of ten.
bool IsNice(double step) {
  const double f = step / std::pow(10.0, std::floor(std::log10(step)));
  return std::fabs(f - 1) < 1e-9 || std::fabs(f - 2) < 1e-9 || std::fabs(f - 5) < 1e-9;
}

TEST(NiceAxisTest, CoversTheRangeWithNiceSteps) {
  struct Case {
    double lo, hi;
  };
  for (const Case& c : std::vector<Case>{{0.13, 0.87},
                                         {2.31, 5.62},
                                         {1e-5, 6e-4},
                                         {0, 3.2e9},
                                         {-4, 17},
                                         {1000, 1001},
                                         {0.5, 0.5}}) {
    const NiceAxis a = MakeNiceAxis(c.lo, c.hi, 6);
    EXPECT_TRUE(IsNice(a.step)) << c.lo << ".." << c.hi << " step " << a.step;
    EXPECT_LE(a.first, c.lo) << c.lo << ".." << c.hi;
    EXPECT_GE(a.last, c.hi) << c.lo << ".." << c.hi;
    EXPECT_LT(a.first, a.last);
    ASSERT_GE(a.ticks.size(), 2u);
    EXPECT_LE(a.ticks.size(), 12u) << c.lo << ".." << c.hi;
    EXPECT_DOUBLE_EQ(a.ticks.front(), a.first);
    EXPECT_DOUBLE_EQ(a.ticks.back(), a.last);
  }
  const NiceAxis a = MakeNiceAxis(0.13, 0.87, 6);
  EXPECT_DOUBLE_EQ(a.step, 0.2);
  EXPECT_DOUBLE_EQ(a.first, 0);
  EXPECT_DOUBLE_EQ(a.last, 1);
}

TEST(NiceAxisTest, IntegerAxesStepByWholeNumbers) {
  const NiceAxis a = MakeNiceAxis(1, 5, 8, /*integer=*/true);
  EXPECT_EQ(a.ticks, (std::vector<double>{1, 2, 3, 4, 5}));
  const NiceAxis one = MakeNiceAxis(3, 3, 8, /*integer=*/true);
  EXPECT_GE(one.step, 1);
  EXPECT_LE(one.first, 3);
  EXPECT_GE(one.last, 3);
}

// Any finite range gives a bounded number of finite ticks and finite positions: denormals (before,
// ±5e-324 gave a step of 0 and an endless loop of ticks), ranges wider than a double holds, huge
// integer steps. Nothing renders as nan.
TEST(NiceAxisTest, ExtremeRangesGiveFewFiniteTicks) {
  const double max = std::numeric_limits<double>::max();
  const double tiny = std::numeric_limits<double>::denorm_min();
  struct Case {
    double lo, hi;
    bool integer;
  };
  for (const Case& c : std::vector<Case>{{-tiny, tiny, false},
                                         {tiny, tiny, false},
                                         {0, tiny, false},
                                         {1e-300, 3e-300, false},
                                         {-max, max, false},
                                         {-1e308, 1e308, false},
                                         {max, max, false},
                                         {-max, -max, false},
                                         {0, 9.2e18, true},
                                         {-9.2e18, 9.2e18, true},
                                         {1, 1.8e19, true}}) {
    SCOPED_TRACE(std::to_string(c.lo) + ".." + std::to_string(c.hi));
    const NiceAxis a = MakeNiceAxis(c.lo, c.hi, 6, c.integer);
    ASSERT_GE(a.ticks.size(), 2u);
    ASSERT_LE(a.ticks.size(), 24u);
    EXPECT_LE(a.first, c.lo);
    EXPECT_GE(a.last, c.hi);
    for (double t : a.ticks) {
      EXPECT_TRUE(std::isfinite(t));
      const std::string label =
          FormatTick(t, a.step, std::max(std::fabs(a.first), std::fabs(a.last)));
      EXPECT_EQ(label.find("nan"), std::string::npos) << label;
      EXPECT_LT(label.size(), 16u) << label;
    }
    for (double v : {c.lo, c.hi, c.lo / 2 + c.hi / 2}) {
      const double f = AxisFraction(a, v);
      EXPECT_TRUE(std::isfinite(f)) << v;
      EXPECT_GE(f, 0) << v;
      EXPECT_LE(f, 1) << v;
    }
  }
  const NiceAxis junk = MakeNiceAxis(NAN, INFINITY, 6);
  EXPECT_EQ(junk.first, junk.first);  // not nan
  EXPECT_EQ(FormatTick(INFINITY, 1, 1), "inf");
}

TEST(FormatTickTest, ShortLabels) {
  EXPECT_EQ(FormatTick(0, 0.2, 1), "0");
  EXPECT_EQ(FormatTick(0.4, 0.2, 1), "0.4");
  EXPECT_EQ(FormatTick(3, 0.5, 6), "3.0");
  EXPECT_EQ(FormatTick(250, 50, 300), "250");
  EXPECT_EQ(FormatTick(20000, 5000, 40000), "20k");
  EXPECT_EQ(FormatTick(1.5e9, 5e8, 2e9), "1.5G");
  EXPECT_EQ(FormatTick(3e-5, 1e-5, 6e-5), "3e-05");
  EXPECT_EQ(FormatTick(2.5e-4, 5e-5, 6e-4), "2.5e-04");
}

TEST(RenderSvgTest, PanelsSeriesAndLegends) {
  std::vector<PlotPanel> panels(3);
  panels[0].title = "Loss";
  panels[0].series = {{.name = "train loss", .x = {1, 2, 3, 4, 5}, .y = {5, 4, 3.5, 3, 2.9}},
                      {.name = "eval loss", .x = {3, 5}, .y = {3.3, 3.1}, .markers = true}};
  panels[1].title = "Learning <rate> & \"more\"";
  panels[1].series = {{.name = "lr", .x = {1, 2}, .y = {1e-4, 2e-4}}};
  panels[2].title = "Empty";
  panels[2].series = {{.name = "nothing"}};
  const std::string svg = RenderSvg("a & b", panels);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(Count(svg, "<g class=\"panel\""), 3);
  EXPECT_EQ(Count(svg, "<polyline"), 3);            // the empty series draws nothing
  EXPECT_EQ(Count(svg, "<g class=\"legend\""), 1);  // only the loss panel has two series
  EXPECT_EQ(Count(svg, "<circle"), 2);  // eval loss: markers; lr has two points and none
  EXPECT_NE(svg.find(">no data<"), std::string::npos);
  EXPECT_NE(svg.find("Learning &lt;rate&gt; &amp; &quot;more&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("<rate>"), std::string::npos);
  EXPECT_NE(svg.find("<title>a &amp; b</title>"), std::string::npos);
  // The train loss polyline: five points, x increasing, y decreasing downwards on screen (SVG y
  // grows downwards, so a falling loss rises in y).
  const size_t at = svg.find("data-series=\"train loss\"");
  ASSERT_NE(at, std::string::npos);
  const size_t p = svg.find("points=\"", at) + 8;
  const std::string points = svg.substr(p, svg.find('"', p) - p);
  std::vector<std::pair<double, double>> xy;
  for (size_t i = 0; i < points.size();) {
    size_t end = points.find(' ', i);
    if (end == std::string::npos) end = points.size();
    const std::string pair = points.substr(i, end - i);
    xy.emplace_back(std::stod(pair.substr(0, pair.find(','))),
                    std::stod(pair.substr(pair.find(',') + 1)));
    i = end + 1;
  }
  ASSERT_EQ(xy.size(), 5u) << points;
  for (size_t i = 1; i < xy.size(); ++i) {
    EXPECT_GT(xy[i].first, xy[i - 1].first);
    EXPECT_GT(xy[i].second, xy[i - 1].second);
  }
}

}  // namespace
}  // namespace strata::metrics
