// The SVG renderer (svg_plot.h). Ticks follow Heckbert's "nice numbers" (Graphics Gems, 1990):
// the tick step is the 1-2-5 number nearest range / (ticks - 1), and the axis is widened to whole
// steps, so labels are short and the data fill most of the panel.
#include "runtime/metrics/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>

namespace strata::metrics {
namespace {

// Geometry of one panel, in SVG user units.
constexpr double kPanelWidth = 520, kPanelHeight = 330;
constexpr double kLeft = 72, kRight = 18, kTop = 34, kBottom = 48;  // plot area inside a panel
constexpr double kTitleHeight = 40;                                 // the document's title
constexpr int kColumns = 2;
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};
// The narrowest axis span: finer ones (denormal values) have no tick step a double holds.
constexpr double kFinest = 1e-290;

std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? n : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

std::string Escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The 1-2-5 number near `x` (> 0): the nearest when `round`, else the smallest not below it.
double NiceNumber(double x, bool round) {
  const double exponent = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, exponent);
  double nice;
  if (round) {
    nice = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  } else {
    nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  }
  return nice * std::pow(10.0, exponent);
}

void AppendPanel(const PlotPanel& panel, double x0, double y0, std::string* svg) {
  std::string& s = *svg;
  s += Format("<g class=\"panel\" transform=\"translate(%.0f,%.0f)\" ", x0, y0);
  s += "data-title=\"" + Escape(panel.title) + "\">\n";
  s += Format("<text class=\"title\" x=\"%.1f\" y=\"20\" text-anchor=\"middle\" font-size=\"14\" ",
              kLeft + (kPanelWidth - kLeft - kRight) / 2);
  s += "font-weight=\"bold\">" + Escape(panel.title) + "</text>\n";
  const double w = kPanelWidth - kLeft - kRight, h = kPanelHeight - kTop - kBottom;
  s += Format(
      "<rect class=\"frame\" x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
      "stroke=\"#888\"/>\n",
      kLeft, kTop, w, h);

  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  int drawn = 0;
  for (const PlotSeries& series : panel.series) {
    if (series.x.empty()) continue;
    ++drawn;
    for (size_t i = 0; i < series.x.size(); ++i) {
      xlo = std::min(xlo, series.x[i]);
      xhi = std::max(xhi, series.x[i]);
      ylo = std::min(ylo, series.y[i]);
      yhi = std::max(yhi, series.y[i]);
    }
  }
  if (drawn == 0) {
    s += Format(
        "<text class=\"empty\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no "
        "data</text>\n</g>\n",
        kLeft + w / 2, kTop + h / 2);
    return;
  }
  const NiceAxis xa = MakeNiceAxis(xlo, xhi, 8, /*integer=*/true);
  const NiceAxis ya = MakeNiceAxis(ylo, yhi, 6);
  auto px = [&](double x) { return kLeft + AxisFraction(xa, x) * w; };
  auto py = [&](double y) { return kTop + h - AxisFraction(ya, y) * h; };

  // Grid lines, tick marks and labels.
  const double xmax = std::max(std::fabs(xa.first), std::fabs(xa.last));
  const double ymax = std::max(std::fabs(ya.first), std::fabs(ya.last));
  s += "<g class=\"ticks\" font-size=\"11\" fill=\"#333\">\n";
  for (double t : xa.ticks) {
    const double x = px(t);
    s += Format("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#eee\"/>", x, kTop,
                x, kTop + h);
    s += Format("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#333\"/>", x,
                kTop + h, x, kTop + h + 5);
    s += Format("<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">", x, kTop + h + 18) +
         Escape(FormatTick(t, xa.step, xmax)) + "</text>\n";
  }
  for (double t : ya.ticks) {
    const double y = py(t);
    s += Format("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#eee\"/>", kLeft, y,
                kLeft + w, y);
    s += Format("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#333\"/>",
                kLeft - 5, y, kLeft, y);
    s += Format("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">", kLeft - 8, y + 4) +
         Escape(FormatTick(t, ya.step, ymax)) + "</text>\n";
  }
  s += "</g>\n";
  s += Format(
      "<g class=\"axes\" stroke=\"#333\"><line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\"/>"
      "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\"/></g>\n",
      kLeft, kTop + h, kLeft + w, kTop + h, kLeft, kTop, kLeft, kTop + h);
  s += Format("<text class=\"x-label\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">",
              kLeft + w / 2, kPanelHeight - 8) +
       Escape(panel.x_label) + "</text>\n";

  // The series, then the legend over them.
  int color = 0;
  std::vector<std::pair<std::string, const char*>> legend;
  for (const PlotSeries& series : panel.series) {
    const char* stroke = kColors[color++ % std::size(kColors)];
    if (series.x.empty()) continue;
    legend.emplace_back(series.name, stroke);
    s += "<polyline class=\"series\" data-series=\"" + Escape(series.name) +
         "\" fill=\"none\" stroke=\"" + stroke + "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < series.x.size(); ++i) {
      s += Format("%s%.1f,%.1f", i == 0 ? "" : " ", px(series.x[i]), py(series.y[i]));
    }
    s += "\"/>\n";
    if (series.markers || series.x.size() == 1) {
      s += "<g class=\"markers\" fill=\"" + std::string(stroke) + "\">";
      for (size_t i = 0; i < series.x.size(); ++i) {
        s += Format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>", px(series.x[i]), py(series.y[i]));
      }
      s += "</g>\n";
    }
  }
  if (legend.size() >= 2) {
    const double lx = kLeft + w - 130, ly = kTop + 8;
    s += Format(
        "<g class=\"legend\"><rect x=\"%.0f\" y=\"%.0f\" width=\"124\" height=\"%zu\" "
        "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n",
        lx, ly, 8 + 16 * legend.size());
    for (size_t i = 0; i < legend.size(); ++i) {
      const double y = ly + 14 + 16 * static_cast<double>(i);
      s += Format(
          "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
          "stroke-width=\"2\"/>",
          lx + 6, y - 4, lx + 26, y - 4, legend[i].second);
      s += Format("<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">", lx + 32, y) +
           Escape(legend[i].first) + "</text>\n";
    }
    s += "</g>\n";
  }
  s += "</g>\n";
}

}  // namespace

NiceAxis MakeNiceAxis(double lo, double hi, int max_ticks, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) lo = hi = 0;
  const double mag = std::max(std::fabs(lo), std::fabs(hi));
  // One value, or a span too fine for a tick step that doubles hold (denormals such as 5e-324):
  // a band around it, at least kFinest wide.
  if (hi - lo <= mag * 1e-12 || hi - lo < kFinest) {
    const double pad = std::max(mag == 0 ? 1.0 : mag * 0.1, kFinest);
    lo = std::max(lo - pad, -std::numeric_limits<double>::max());
    hi = std::min(hi + pad, std::numeric_limits<double>::max());
  }
  NiceAxis axis;
  const double width = hi - lo;
  if (std::isfinite(width)) {
    const double range = NiceNumber(width, /*round=*/false);
    axis.step = NiceNumber(range / std::max(1, max_ticks - 1), /*round=*/true);
    if (integer) axis.step = std::max(axis.step, 1.0);
    const double first = std::floor(lo / axis.step), last = std::ceil(hi / axis.step);
    axis.first = first * axis.step;
    axis.last = last * axis.step;
    if (std::isfinite(axis.first) && std::isfinite(axis.last) && axis.step > 0 &&
        last - first <= 4.0 * std::max(1, max_ticks)) {
      // Multiples of the step, not repeated sums: no drift (0.30000000000000004).
      for (double i = first; i <= last; ++i) axis.ticks.push_back(i * axis.step);
      return axis;
    }
  }
  // A span wider than a double holds (values near -1e308 and 1e308 together): the ends alone.
  axis.first = lo;
  axis.last = hi;
  axis.step = std::isfinite(width) ? width : std::numeric_limits<double>::max();
  axis.ticks = {lo, hi};
  return axis;
}

double AxisFraction(const NiceAxis& axis, double v) {
  // Halved first: last - first may exceed the largest double.
  const double span = axis.last / 2 - axis.first / 2;
  return span > 0 ? (v / 2 - axis.first / 2) / span : 0.5;
}

std::string FormatTick(double value, double step, double axis_max) {
  if (!std::isfinite(value)) return value > 0 ? "inf" : value < 0 ? "-inf" : "nan";
  if (std::fabs(value) < step * 1e-6) return "0";
  // Beyond what fixed notation reads (or a step that is not a plain positive number): %g.
  if (!(step > 0) || !std::isfinite(step) || axis_max >= 1e18 || axis_max < 1e-290) {
    return Format("%.4g", value);
  }
  if (axis_max < 1e-3) {
    // Learning rates: 3e-05 reads better than 0.00003. Digits enough to tell ticks apart.
    const int digits = static_cast<int>(
        std::max(0.0, std::floor(std::log10(axis_max)) - std::floor(std::log10(step) + 1e-9)));
    return Format("%.*e", digits, value);
  }
  const char* suffix = "";
  double scale = 1;
  if (axis_max >= 1e4) {
    static constexpr const char* kSuffixes[] = {"k", "M", "G", "T", "P"};
    const int k = std::min(5, static_cast<int>(std::floor(std::log10(axis_max) / 3)));
    scale = std::pow(1e3, k);
    suffix = kSuffixes[k - 1];
  }
  const int decimals =
      static_cast<int>(std::max(0.0, -std::floor(std::log10(step / scale) + 1e-9)));
  return Format("%.*f%s", decimals, value / scale, suffix);
}

std::string RenderSvg(std::string_view title, const std::vector<PlotPanel>& panels) {
  const int rows = static_cast<int>((panels.size() + kColumns - 1) / kColumns);
  const double width = kColumns * kPanelWidth, height = kTitleHeight + rows * kPanelHeight;
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += Format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 "
      "%.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height, width, height);
  s += "<title>" + Escape(title) + "</title>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += Format("<text x=\"%.0f\" y=\"26\" text-anchor=\"middle\" font-size=\"16\">", width / 2) +
       Escape(title) + "</text>\n";
  for (size_t i = 0; i < panels.size(); ++i) {
    AppendPanel(panels[i], static_cast<double>(i % kColumns) * kPanelWidth,
                kTitleHeight + static_cast<double>(i / kColumns) * kPanelHeight, &s);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace strata::metrics
