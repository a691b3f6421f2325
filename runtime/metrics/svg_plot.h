// Line charts as one self-contained SVG document (no scripts, fonts or stylesheets from
// elsewhere): what `strata plot` draws from a --log-json file for people without TensorBoard.
//
// The document is a grid of panels, two per row. Each panel is a
//   <g class="panel" data-title="...">
// holding its title, a frame, axes with tick marks and labels at "nice" values (1, 2 or 5 times a
// power of ten, via NiceAxis), an x-axis label, one
//   <polyline class="series" data-series="NAME" points="x,y x,y ...">
// per series with at least one point (in the order given; a series may also get circles at its
// points), and a legend naming the series when two or more have points. A panel without any point
// says "no data". Text is XML-escaped; numbers are written in the C locale.
//
// Pure functions of their input; any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::metrics {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // same length; finite values only (the caller drops the others)
  bool markers = false;      // a circle at each point (sparse series such as an eval loss)
};

struct PlotPanel {
  std::string title;
  std::string x_label = "step";
  std::vector<PlotSeries> series;
};

// Ticks covering [lo, hi]: at most about `max_ticks` multiples of `step`, where step is 1, 2 or 5
// times a power of ten (at least 1 when `integer`), from `first` (<= lo) to `last` (>= hi). An
// empty or zero-width range, or one narrower than 1e-290 (denormals), is widened around its value
// first; a range wider than a double holds (-1e308 to 1e308) gets its two ends as ticks. Any
// finite lo <= hi gives finite ticks, at most 4 x max_ticks of them; anything else is [0, 0].
struct NiceAxis {
  double first = 0, last = 1, step = 1;
  std::vector<double> ticks;
};
NiceAxis MakeNiceAxis(double lo, double hi, int max_ticks, bool integer = false);
// Where `v` falls on `axis`, 0 at first and 1 at last (finite for any finite v on a MakeNiceAxis
// axis, also one wider than a double holds).
double AxisFraction(const NiceAxis& axis, double v);

// A tick value as a label: as many decimals as `step` needs; k/M/G/T suffixes once the axis
// reaches 10^4 (byte and token counts); scientific notation below 10^-3 (learning rates); %g
// beyond 10^18 or below 10^-290; "inf"/"nan" for a value that is not finite.
// `axis_max` is the largest magnitude on the axis.
std::string FormatTick(double value, double step, double axis_max);

// The whole SVG document: `title` above the grid of `panels`.
std::string RenderSvg(std::string_view title, const std::vector<PlotPanel>& panels);

}  // namespace strata::metrics
