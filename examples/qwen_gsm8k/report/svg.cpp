// render_svg: one chart as a standalone SVG document. Layout, in pixels: title band, legend rows, plot area (grid,
// series), tick labels and the x label below it; the y label runs up the left edge. Text widths are estimated from
// character counts (no font metrics here).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "qwen_gsm8k/report/axis.hpp"
#include "qwen_gsm8k/report/markup.hpp"
#include "qwen_gsm8k/report/report.hpp"

namespace qwen {
namespace {

using detail::Axis;
using detail::escape_markup;
using detail::general;
using detail::pixel;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// matplotlib's tab10, which most readers of training curves know; past ten series the colours repeat dashed.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr std::size_t kPaletteSize = std::size(kPalette);
constexpr const char* kDashes[] = {"", "6 3", "2 3"};

constexpr std::size_t kMarkerLimit = 24;  // series with at most this many points get a marker per point
constexpr int kLegendRow = 18;
constexpr double kTitleBand = 30.0, kLegendGap = 6.0, kBottomBand = 44.0, kRightMargin = 20.0;
constexpr double kTickLabelCharWidth = 6.4, kLegendCharWidth = 7.0;  // at font sizes 11 and 12
constexpr const char* kFontFamily = "DejaVu Sans, Helvetica, Arial, sans-serif";

using Points = std::vector<std::pair<double, double>>;

// The finite points of every series, sorted by x, and their bounds.
struct PlotData {
  std::vector<Points> points;  // per series of the chart
  double x_min = kInfinity, x_max = -kInfinity, y_min = kInfinity, y_max = -kInfinity;
  bool integral_x = true;  // every x a whole number: the x ticks are too

  bool has_data() const { return x_min <= x_max; }
};

Points finite_points(const ChartSeries& series) {
  Points points;
  for (const auto& [x, y] : series.points) {
    if (std::isfinite(x) && std::isfinite(y)) points.emplace_back(x, y);
  }
  std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return points;
}

PlotData collect_points(const Chart& chart) {
  PlotData data;
  for (const ChartSeries& series : chart.series) {
    data.points.push_back(finite_points(series));
    for (const auto& [x, y] : data.points.back()) {
      data.x_min = std::min(data.x_min, x), data.x_max = std::max(data.x_max, x);
      data.y_min = std::min(data.y_min, y), data.y_max = std::max(data.y_max, y);
      data.integral_x = data.integral_x && x == std::floor(x) && std::abs(x) < 1e15;
    }
  }
  return data;
}

struct LegendEntry {
  double x = 0.0;
  int row = 0;
};

// Entries left to right from `left`, wrapping before `right`.
std::vector<LegendEntry> layout_legend(const std::vector<std::string>& labels, double left, double right) {
  std::vector<LegendEntry> entries;
  double x = left;
  int row = 0;
  for (const std::string& label : labels) {
    const double entry_width = 24.0 + kLegendCharWidth * static_cast<double>(detail::display_length(label)) + 16.0;
    if (x > left && x + entry_width > right) x = left, ++row;
    entries.push_back({x, row});
    x += entry_width;
  }
  return entries;
}

// Where everything goes: the plot area [left, right] x [top, bottom], its axes, and the legend above it.
struct Layout {
  int width = 0, document_height = 0;
  double left = 0.0, right = 0.0, top = 0.0, bottom = 0.0;
  Axis x_axis, y_axis;
  std::vector<std::string> legend_labels;  // per series
  std::vector<LegendEntry> legend;         // per series

  double to_x(double x) const { return left + x_axis.fraction(x) * (right - left); }
  double to_y(double y) const { return bottom - y_axis.fraction(y) * (bottom - top); }
};

// The legend comes first: its rows decide where the plot starts. The left margin fits the widest y tick label.
Layout layout_chart(const Chart& chart, const PlotData& data, int width, int height) {
  Layout layout;
  layout.width = width;
  layout.y_axis = detail::make_axis(data.y_min, data.y_max, 6, false);
  std::size_t widest_label = 1;
  for (const std::string& label : layout.y_axis.labels) widest_label = std::max(widest_label, label.size());
  layout.left = 30.0 + kTickLabelCharWidth * static_cast<double>(widest_label);
  layout.right = width - kRightMargin;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    layout.legend_labels.push_back(chart.series[i].name + (data.points[i].empty() ? " (no data)" : ""));
  }
  layout.legend = layout_legend(layout.legend_labels, layout.left, layout.right);
  const int legend_rows = layout.legend.empty() ? 1 : layout.legend.back().row + 1;
  layout.document_height = height + (legend_rows - 1) * kLegendRow;
  layout.top = kTitleBand + legend_rows * kLegendRow + kLegendGap;
  layout.bottom = layout.document_height - kBottomBand;
  const int x_ticks = std::max(3, static_cast<int>((layout.right - layout.left) / 70.0));
  layout.x_axis = detail::make_axis(data.x_min, data.x_max, x_ticks, data.integral_x);
  return layout;
}

std::string series_style(std::size_t index) {
  std::string style = std::string("stroke=\"") + kPalette[index % kPaletteSize] + "\"";
  const char* dashes = kDashes[(index / kPaletteSize) % std::size(kDashes)];
  if (*dashes != '\0') style += std::string(" stroke-dasharray=\"") + dashes + "\"";
  return style;
}

// The <svg> element, its title, the white background and the visible title.
std::string draw_header(const Chart& chart, const Layout& layout) {
  const std::string w = std::to_string(layout.width), h = std::to_string(layout.document_height);
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h +
                    "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"" + kFontFamily +
                    "\" font-size=\"12\" role=\"img\">\n";
  svg += "<title>" + escape_markup(chart.title) + "</title>\n";
  svg += "<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"" + pixel(layout.width / 2.0) +
         "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\"" + " fill=\"#222222\">" +
         escape_markup(chart.title) + "</text>\n";
  return svg;
}

// Grid lines and tick labels; the zero line, when in range, a shade darker.
std::string draw_grid(const Layout& layout) {
  const Axis &x_axis = layout.x_axis, &y_axis = layout.y_axis;
  std::string svg = "<g stroke-width=\"1\">\n";
  for (const double tick : y_axis.ticks) {
    const std::string colour = tick == 0.0 && y_axis.ticks.size() > 2 ? "#bbbbbb" : "#e6e6e6";
    svg += "<line x1=\"" + pixel(layout.left) + "\" x2=\"" + pixel(layout.right) + "\" y1=\"" +
           pixel(layout.to_y(tick)) + "\" y2=\"" + pixel(layout.to_y(tick)) + "\" stroke=\"" + colour + "\"/>\n";
  }
  for (const double tick : x_axis.ticks) {
    svg += "<line x1=\"" + pixel(layout.to_x(tick)) + "\" x2=\"" + pixel(layout.to_x(tick)) + "\" y1=\"" +
           pixel(layout.top) + "\" y2=\"" + pixel(layout.bottom + 4) + "\" stroke=\"#eeeeee\"/>\n";
  }
  svg += "</g>\n<g font-size=\"11\" fill=\"#555555\">\n";
  for (std::size_t i = 0; i < y_axis.ticks.size(); ++i) {
    svg += "<text x=\"" + pixel(layout.left - 6) + "\" y=\"" + pixel(layout.to_y(y_axis.ticks[i]) + 4) +
           "\" text-anchor=\"end\">" + y_axis.labels[i] + "</text>\n";
  }
  for (std::size_t i = 0; i < x_axis.ticks.size(); ++i) {
    svg += "<text x=\"" + pixel(layout.to_x(x_axis.ticks[i])) + "\" y=\"" + pixel(layout.bottom + 17) +
           "\" text-anchor=\"middle\">" + x_axis.labels[i] + "</text>\n";
  }
  return svg + "</g>\n";
}

// The plot area's border, the axis labels, and "no data" across an empty chart.
std::string draw_frame(const Chart& chart, const Layout& layout, bool has_data) {
  const double left = layout.left, right = layout.right, top = layout.top, bottom = layout.bottom;
  std::string svg = "<rect x=\"" + pixel(left) + "\" y=\"" + pixel(top) + "\" width=\"" + pixel(right - left) +
                    "\" height=\"" + pixel(bottom - top) + "\" fill=\"none\" stroke=\"#999999\"/>\n";
  svg += "<text x=\"" + pixel((left + right) / 2) + "\" y=\"" + pixel(layout.document_height - 8) +
         "\" text-anchor=\"middle\" fill=\"#333333\">" + escape_markup(chart.x_label) + "</text>\n";
  svg += "<text transform=\"translate(14 " + pixel((top + bottom) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\" fill=\"#333333\">" + escape_markup(chart.y_label) + "</text>\n";
  if (!has_data) {
    svg += "<text x=\"" + pixel((left + right) / 2) + "\" y=\"" + pixel((top + bottom) / 2 + 5) +
           "\" text-anchor=\"middle\" font-size=\"14\" fill=\"#888888\">no data</text>\n";
  }
  return svg;
}

// One polyline per series with two or more points; a marker per point, with a tooltip, for short series.
std::string draw_series(const Chart& chart, const PlotData& data, const Layout& layout) {
  std::string svg;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const Points& series = data.points[i];
    if (series.empty()) continue;
    svg += "<g " + series_style(i) + " fill=\"" + kPalette[i % kPaletteSize] + "\">\n";
    if (series.size() > 1) {
      svg += "<polyline fill=\"none\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"";
      for (std::size_t p = 0; p < series.size(); ++p) {
        if (p > 0) svg += ' ';
        svg += pixel(layout.to_x(series[p].first)) + "," + pixel(layout.to_y(series[p].second));
      }
      svg += "\"/>\n";
    }
    if (series.size() <= kMarkerLimit) {
      const std::string name = escape_markup(chart.series[i].name);
      for (const auto& [x, y] : series) {
        svg += "<circle cx=\"" + pixel(layout.to_x(x)) + "\" cy=\"" + pixel(layout.to_y(y)) +
               "\" r=\"3\" stroke=\"none\"><title>" + name + ": " + general(x) + ", " + general(y) +
               "</title></circle>\n";
      }
    }
    svg += "</g>\n";
  }
  return svg;
}

// A sample line (and marker) and the label of each series, in the legend rows above the plot.
std::string draw_legend(const PlotData& data, const Layout& layout) {
  std::string svg;
  for (std::size_t i = 0; i < layout.legend.size(); ++i) {
    const LegendEntry& entry = layout.legend[i];
    const Points& points = data.points[i];
    const double y = kTitleBand + entry.row * kLegendRow + kLegendRow / 2.0;
    // A series without data keeps its place in the palette but shows grey, like its label.
    svg += points.empty() ? std::string("<g stroke=\"#bbbbbb\">")
                          : "<g " + series_style(i) + " fill=\"" + kPalette[i % kPaletteSize] + "\">";
    svg += "<line x1=\"" + pixel(entry.x) + "\" x2=\"" + pixel(entry.x + 18) + "\" y1=\"" + pixel(y) + "\" y2=\"" +
           pixel(y) + "\" stroke-width=\"2.5\"/>";
    if (!points.empty() && points.size() <= kMarkerLimit) {
      svg += "<circle cx=\"" + pixel(entry.x + 9) + "\" cy=\"" + pixel(y) + "\" r=\"3\" stroke=\"none\"/>";
    }
    svg += "<text x=\"" + pixel(entry.x + 24) + "\" y=\"" + pixel(y + 4) + "\" stroke=\"none\" fill=\"" +
           (points.empty() ? "#888888" : "#333333") + "\">" + escape_markup(layout.legend_labels[i]) + "</text></g>\n";
  }
  return svg;
}

}  // namespace

std::string render_svg(const Chart& chart, int width, int height) {
  if (width < 240) throw std::invalid_argument("render_svg: width is " + std::to_string(width) + ", expected >= 240");
  if (height < 160) {
    throw std::invalid_argument("render_svg: height is " + std::to_string(height) + ", expected >= 160");
  }
  const PlotData data = collect_points(chart);
  const Layout layout = layout_chart(chart, data, width, height);
  return draw_header(chart, layout) + draw_grid(layout) + draw_frame(chart, layout, data.has_data()) +
         draw_series(chart, data, layout) + draw_legend(data, layout) + "</svg>\n";
}

}  // namespace qwen
