// Charts as SVG and the run's report.html; see report.hpp for what each chart shows and which files are written.
// Layout, in pixels: title band, legend rows, plot area (grid, series), tick labels and the x label below it; the
// y label runs up the left edge. Text widths are estimated from character counts (no font metrics here).
#include "qwen_gsm8k/report/report.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace qwen {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// ---- text ------------------------------------------------------------------------------------------------------

// Length of the valid UTF-8 sequence that starts at text[i], or 0 when it is not one (overlong forms and surrogates
// included).
std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  std::uint32_t code_point = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code_point = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code_point = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    const auto byte = static_cast<unsigned char>(text[i + k]);
    if ((byte & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < kSmallest[length] || code_point > 0x10FFFF) return 0;
  if (code_point >= 0xD800 && code_point <= 0xDFFF) return 0;
  return length;
}

// Text for XML and HTML, in element content and in quoted attributes alike. Control characters other than tab and
// newline are not allowed in XML 1.0 and are dropped; bytes that are not UTF-8 become U+FFFD. Either would
// otherwise make the whole SVG unreadable.
std::string escape_markup(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (length > 1) {
      out.append(text.substr(i, length));
      i += length;
      continue;
    }
    const char c = text[i++];
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
        out += "&#39;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

// Characters, not bytes: what the legend and the margins are sized by.
std::size_t display_length(std::string_view text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string print_number(const char* pattern, int precision, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, precision, value);
  return buffer;
}

std::string pixel(double value) {
  return print_number("%.*f", 1, value);
}
std::string general(double value) {
  return print_number("%.*g", 6, value);
}

// ---- axes ------------------------------------------------------------------------------------------------------

struct Axis {
  double low = 0.0, high = 1.0;  // the drawn range: the data's range widened to whole ticks
  double step = 0.0;             // between ticks; 0 when the range is too wide to subdivide
  std::vector<double> ticks;
  std::vector<std::string> labels;  // one per tick

  // Where `value` lies along the axis, 0 at `low` and 1 at `high`. Halved first so that a range near the largest
  // double does not overflow.
  double fraction(double value) const { return (value / 2 - low / 2) / (high / 2 - low / 2); }
};

// The smallest 1, 2 or 5 times a power of ten that is at least `value` (> 0).
double nice_step(double value) {
  const double power = std::pow(10.0, std::floor(std::log10(value)));
  const double mantissa = value / power;
  const double nice = mantissa <= 1.0 ? 1.0 : mantissa <= 2.0 ? 2.0 : mantissa <= 5.0 ? 5.0 : 10.0;
  return nice * power;
}

// Tick labels `step` apart: as many decimals as the step needs, or exponent notation for tiny steps and huge values.
std::string tick_label(double value, double step, double largest_magnitude) {
  if (step == 0.0) return print_number("%.*g", 3, value);
  if (std::abs(value) < step * 1e-6) value = 0.0;  // rounding residue and -0
  const int step_exponent = static_cast<int>(std::floor(std::log10(step)));
  if (largest_magnitude >= 1e6 || step_exponent < -4) {
    const int magnitude =
        largest_magnitude > 0.0 ? static_cast<int>(std::floor(std::log10(largest_magnitude))) : step_exponent;
    return print_number("%.*g", std::clamp(magnitude - step_exponent + 1, 1, 15), value);
  }
  return print_number("%.*f", std::max(0, -step_exponent), value);
}

// Ticks covering [minimum, maximum] (minimum > maximum: no data), about `target_ticks` of them. `integral`: the
// values are whole numbers (steps), so ticks are too.
Axis make_axis(double minimum, double maximum, int target_ticks, bool integral) {
  if (minimum > maximum) minimum = 0.0, maximum = 1.0;
  if (minimum == maximum) {  // one value: a range around it, so the point sits in the middle
    const double pad = integral ? 1.0 : minimum == 0.0 ? 1.0 : std::abs(minimum) * 0.1;
    minimum -= pad, maximum += pad;
  }
  Axis axis;
  const double largest_magnitude = std::max(std::abs(minimum), std::abs(maximum));
  const double span = maximum - minimum;
  if (!std::isfinite(span)) {  // beyond subdividing in doubles: just the two ends
    axis.low = minimum, axis.high = maximum;
    axis.ticks = {minimum, maximum};
  } else {
    // Never finer than the doubles can tell apart, so that tick labels stay distinct.
    double step = std::max(nice_step(span / (target_ticks - 1)), nice_step(largest_magnitude * 1e-12));
    if (integral) step = std::max(step, 1.0);
    axis.step = step;
    axis.low = std::floor(minimum / step) * step;
    axis.high = std::ceil(maximum / step) * step;
    const long count = std::lround((axis.high - axis.low) / step);
    for (long i = 0; i <= count; ++i) axis.ticks.push_back(axis.low + static_cast<double>(i) * step);
  }
  for (const double tick : axis.ticks) axis.labels.push_back(tick_label(tick, axis.step, largest_magnitude));
  return axis;
}

// ---- svg -------------------------------------------------------------------------------------------------------

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

Points finite_points(const ChartSeries& series) {
  Points points;
  for (const auto& [x, y] : series.points) {
    if (std::isfinite(x) && std::isfinite(y)) points.emplace_back(x, y);
  }
  std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return points;
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
    const double entry_width = 24.0 + kLegendCharWidth * static_cast<double>(display_length(label)) + 16.0;
    if (x > left && x + entry_width > right) x = left, ++row;
    entries.push_back({x, row});
    x += entry_width;
  }
  return entries;
}

std::string series_style(std::size_t index) {
  std::string style = std::string("stroke=\"") + kPalette[index % kPaletteSize] + "\"";
  const char* dashes = kDashes[(index / kPaletteSize) % std::size(kDashes)];
  if (*dashes != '\0') style += std::string(" stroke-dasharray=\"") + dashes + "\"";
  return style;
}

// ---- training charts -------------------------------------------------------------------------------------------

std::optional<double> finite_field(const json& row, const std::string& key) {
  if (!row.is_object()) return std::nullopt;
  const auto found = row.find(key);
  if (found == row.end() || !found->is_number()) return std::nullopt;
  const double value = found->get<double>();
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

ChartSeries series_of(const std::vector<json>& rows, const std::string& key, std::string name) {
  ChartSeries series{std::move(name), {}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto value = finite_field(rows[i], key);
    if (value) series.points.emplace_back(finite_field(rows[i], "step").value_or(static_cast<double>(i)), *value);
  }
  return series;
}

void add_if_any(Chart& chart, ChartSeries series) {
  if (!series.points.empty()) chart.series.push_back(std::move(series));
}

// The reward functions the rows report, as the part of "reward_<name>" after the prefix: the GSM8K ones in a fixed
// order, then any others alphabetically. reward_mean and reward_std describe the total, not a function.
std::vector<std::string> reward_functions(const std::vector<json>& metrics) {
  std::vector<std::string> names = {"correctness", "digit", "format", "mark", "overlong"};
  std::vector<std::string> others;
  for (const json& row : metrics) {
    if (!row.is_object()) continue;
    for (const auto& [key, value] : row.items()) {
      if (key.rfind("reward_", 0) != 0 || !value.is_number()) continue;
      const std::string name = key.substr(7);
      if (name == "mean" || name == "std" || name.empty()) continue;
      if (std::find(names.begin(), names.end(), name) == names.end() &&
          std::find(others.begin(), others.end(), name) == others.end()) {
        others.push_back(name);
      }
    }
  }
  std::sort(others.begin(), others.end());
  names.insert(names.end(), others.begin(), others.end());
  return names;
}

// "eval pass@8" when every row that has pass_at_k says the same k; "eval pass@k" otherwise.
std::string pass_at_k_name(const std::vector<json>& evals) {
  std::optional<double> common_k;
  bool same = true;
  for (const json& row : evals) {
    if (!finite_field(row, "pass_at_k")) continue;
    const auto k = finite_field(row, "k");
    if (!k || (common_k && *common_k != *k)) {
      same = false;
      break;
    }
    common_k = k;
  }
  if (!same || !common_k) return "eval pass@k";
  return "eval pass@" + general(*common_k);
}

// ---- html ------------------------------------------------------------------------------------------------------

// A lower-case file name for a chart title: "Response length" -> "response-length".
std::string slug_of(const std::string& title) {
  std::string slug;
  for (const char c : title) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0) {
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  return slug.empty() ? "chart" : slug;
}

// A table cell for a JSON value: numbers right-aligned, strings escaped, arrays and objects as compact JSON.
std::string table_cell(const json& value) {
  if (value.is_number()) {
    const std::string text = value.is_number_float() ? general(value.get<double>()) : value.dump();
    return "<td class=\"num\">" + text + "</td>";
  }
  if (value.is_string()) return "<td>" + escape_markup(value.get<std::string>()) + "</td>";
  if (value.is_null()) return "<td class=\"none\">&mdash;</td>";
  return "<td>" + escape_markup(value.dump(-1, ' ', false, json::error_handler_t::replace)) + "</td>";
}

// Nested objects become dotted keys ("settings.lr"), so every setting gets its own row.
void flatten(const json& value, const std::string& prefix, std::vector<std::pair<std::string, json>>& rows) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, field] : value.items()) flatten(field, prefix.empty() ? key : prefix + "." + key, rows);
  } else {
    rows.emplace_back(prefix, value);
  }
}

std::string summary_table(const json& summary) {
  if (summary.is_null() || (summary.is_object() && summary.empty())) {
    return "<p class=\"empty\">No summary recorded.</p>\n";
  }
  std::vector<std::pair<std::string, json>> rows;
  flatten(summary, summary.is_object() ? "" : "value", rows);
  std::string html = "<table class=\"summary\">\n";
  for (const auto& [key, value] : rows)
    html += "<tr><th>" + escape_markup(key) + "</th>" + table_cell(value) + "</tr>\n";
  return html + "</table>\n";
}

// One row per evaluation; the columns are every key any row has, the usual ones first.
std::string eval_table(const std::vector<json>& evals) {
  std::vector<std::string> columns;
  for (const char* key : {"step", "accuracy", "pass_at_k", "k", "problems"}) {
    if (std::any_of(evals.begin(), evals.end(),
                    [&](const json& row) { return row.is_object() && row.contains(key); })) {
      columns.emplace_back(key);
    }
  }
  for (const json& row : evals) {
    if (!row.is_object()) continue;
    for (const auto& [key, value] : row.items()) {
      if (std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
    }
  }
  if (columns.empty()) return "<p class=\"empty\">No evaluations recorded.</p>\n";
  std::string html = "<table class=\"evals\">\n<tr>";
  for (const std::string& column : columns) html += "<th>" + escape_markup(column) + "</th>";
  html += "</tr>\n";
  for (const json& row : evals) {
    if (!row.is_object()) continue;
    html += "<tr>";
    for (const std::string& column : columns) html += row.contains(column) ? table_cell(row.at(column)) : "<td></td>";
    html += "</tr>\n";
  }
  return html + "</table>\n";
}

// "30 training steps (steps 1 to 30), 3 evaluations."
std::string overview(const std::vector<json>& metrics, const std::vector<json>& evals) {
  std::string text;
  if (metrics.empty()) {
    text = "No training steps recorded";
  } else {
    text = std::to_string(metrics.size()) + (metrics.size() == 1 ? " training step" : " training steps");
    double first = kInfinity, last = -kInfinity;
    for (const json& row : metrics) {
      if (const auto step = finite_field(row, "step")) first = std::min(first, *step), last = std::max(last, *step);
    }
    if (first < last) text += " (steps " + general(first) + " to " + general(last) + ")";
    if (first == last) text += " (step " + general(first) + ")";
  }
  text += ", " + std::to_string(evals.size()) + (evals.size() == 1 ? " evaluation." : " evaluations.");
  return text;
}

constexpr const char* kStyle = R"(body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;
color:#222;background:#f7f7f7;max-width:1340px;margin:2rem auto;padding:0 1rem;line-height:1.4}
h1{font-size:1.6rem;margin:0 0 .2rem}
h2{font-size:1.2rem;margin:2rem 0 .8rem;padding-bottom:.2rem;border-bottom:1px solid #ddd}
.overview{color:#555;margin:0}
table{border-collapse:collapse;background:#fff;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.3rem .7rem;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.none,.empty{color:#888}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
figure{margin:0;background:#fff;border:1px solid #ddd;padding:.4rem}
figure svg{display:block;max-width:100%;height:auto}
figcaption{font-size:.8rem;text-align:right}
figcaption a{color:#777}
)";

// Writes `content` to "<path>.tmp" and renames it over `path`, so a reader sees the old file or the whole new one.
void write_atomically(const fs::path& path, const std::string& content) {
  fs::path temporary = path;
  temporary += ".tmp";
  std::error_code ignored;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(temporary.string() + ": cannot open for writing (is the directory writable?)");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (!out) {
      fs::remove(temporary, ignored);
      throw std::runtime_error(temporary.string() + ": write failed (disk full?)");
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    fs::remove(temporary, ignored);
    throw std::runtime_error(path.string() + ": cannot move " + temporary.filename().string() +
                             " into place: " + error.message());
  }
}

}  // namespace

std::string render_svg(const Chart& chart, int width, int height) {
  if (width < 240) throw std::invalid_argument("render_svg: width is " + std::to_string(width) + ", expected >= 240");
  if (height < 160)
    throw std::invalid_argument("render_svg: height is " + std::to_string(height) + ", expected >= 160");

  std::vector<Points> points;
  double x_min = kInfinity, x_max = -kInfinity, y_min = kInfinity, y_max = -kInfinity;
  bool integral_x = true;
  for (const ChartSeries& series : chart.series) {
    points.push_back(finite_points(series));
    for (const auto& [x, y] : points.back()) {
      x_min = std::min(x_min, x), x_max = std::max(x_max, x);
      y_min = std::min(y_min, y), y_max = std::max(y_max, y);
      integral_x = integral_x && x == std::floor(x) && std::abs(x) < 1e15;
    }
  }
  const bool has_data = x_min <= x_max;

  // Legend first: its rows decide where the plot starts. The left margin fits the widest y tick label.
  const Axis y_axis = make_axis(y_min, y_max, 6, false);
  std::size_t widest_label = 1;
  for (const std::string& label : y_axis.labels) widest_label = std::max(widest_label, label.size());
  const double left = 30.0 + kTickLabelCharWidth * static_cast<double>(widest_label);
  const double right = width - kRightMargin;
  std::vector<std::string> legend_labels;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    legend_labels.push_back(chart.series[i].name + (points[i].empty() ? " (no data)" : ""));
  }
  const std::vector<LegendEntry> legend = layout_legend(legend_labels, left, right);
  const int legend_rows = legend.empty() ? 1 : legend.back().row + 1;
  const int document_height = height + (legend_rows - 1) * kLegendRow;
  const double top = kTitleBand + legend_rows * kLegendRow + kLegendGap;
  const double bottom = document_height - kBottomBand;
  const Axis x_axis = make_axis(x_min, x_max, std::max(3, static_cast<int>((right - left) / 70.0)), integral_x);
  const auto to_x = [&](double x) { return left + x_axis.fraction(x) * (right - left); };
  const auto to_y = [&](double y) { return bottom - y_axis.fraction(y) * (bottom - top); };

  std::string svg;
  const std::string w = std::to_string(width), h = std::to_string(document_height);
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " +
         h + "\" font-family=\"" + kFontFamily + "\" font-size=\"12\" role=\"img\">\n";
  svg += "<title>" + escape_markup(chart.title) + "</title>\n";
  svg += "<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"" + pixel(width / 2.0) +
         "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\"" + " fill=\"#222222\">" +
         escape_markup(chart.title) + "</text>\n";

  // Grid and tick labels; the zero line, when in range, a shade darker.
  svg += "<g stroke-width=\"1\">\n";
  for (const double tick : y_axis.ticks) {
    const std::string colour = tick == 0.0 && y_axis.ticks.size() > 2 ? "#bbbbbb" : "#e6e6e6";
    svg += "<line x1=\"" + pixel(left) + "\" x2=\"" + pixel(right) + "\" y1=\"" + pixel(to_y(tick)) + "\" y2=\"" +
           pixel(to_y(tick)) + "\" stroke=\"" + colour + "\"/>\n";
  }
  for (const double tick : x_axis.ticks) {
    svg += "<line x1=\"" + pixel(to_x(tick)) + "\" x2=\"" + pixel(to_x(tick)) + "\" y1=\"" + pixel(top) + "\" y2=\"" +
           pixel(bottom + 4) + "\" stroke=\"#eeeeee\"/>\n";
  }
  svg += "</g>\n<g font-size=\"11\" fill=\"#555555\">\n";
  for (std::size_t i = 0; i < y_axis.ticks.size(); ++i) {
    svg += "<text x=\"" + pixel(left - 6) + "\" y=\"" + pixel(to_y(y_axis.ticks[i]) + 4) + "\" text-anchor=\"end\">" +
           y_axis.labels[i] + "</text>\n";
  }
  for (std::size_t i = 0; i < x_axis.ticks.size(); ++i) {
    svg += "<text x=\"" + pixel(to_x(x_axis.ticks[i])) + "\" y=\"" + pixel(bottom + 17) + "\" text-anchor=\"middle\">" +
           x_axis.labels[i] + "</text>\n";
  }
  svg += "</g>\n";
  svg += "<rect x=\"" + pixel(left) + "\" y=\"" + pixel(top) + "\" width=\"" + pixel(right - left) + "\" height=\"" +
         pixel(bottom - top) + "\" fill=\"none\" stroke=\"#999999\"/>\n";
  svg += "<text x=\"" + pixel((left + right) / 2) + "\" y=\"" + pixel(document_height - 8) +
         "\" text-anchor=\"middle\" fill=\"#333333\">" + escape_markup(chart.x_label) + "</text>\n";
  svg += "<text transform=\"translate(14 " + pixel((top + bottom) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\" fill=\"#333333\">" + escape_markup(chart.y_label) + "</text>\n";
  if (!has_data) {
    svg += "<text x=\"" + pixel((left + right) / 2) + "\" y=\"" + pixel((top + bottom) / 2 + 5) +
           "\" text-anchor=\"middle\" font-size=\"14\" fill=\"#888888\">no data</text>\n";
  }

  // Series, then their legend entries.
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const Points& series = points[i];
    if (series.empty()) continue;
    svg += "<g " + series_style(i) + " fill=\"" + kPalette[i % kPaletteSize] + "\">\n";
    if (series.size() > 1) {
      svg += "<polyline fill=\"none\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"";
      for (std::size_t p = 0; p < series.size(); ++p) {
        svg += (p == 0 ? "" : " ") + pixel(to_x(series[p].first)) + "," + pixel(to_y(series[p].second));
      }
      svg += "\"/>\n";
    }
    if (series.size() <= kMarkerLimit) {
      const std::string name = escape_markup(chart.series[i].name);
      for (const auto& [x, y] : series) {
        svg += "<circle cx=\"" + pixel(to_x(x)) + "\" cy=\"" + pixel(to_y(y)) + "\" r=\"3\" stroke=\"none\"><title>" +
               name + ": " + general(x) + ", " + general(y) + "</title></circle>\n";
      }
    }
    svg += "</g>\n";
  }
  for (std::size_t i = 0; i < legend.size(); ++i) {
    const double y = kTitleBand + legend[i].row * kLegendRow + kLegendRow / 2.0;
    // A series without data keeps its place in the palette but shows grey, like its label.
    svg += points[i].empty() ? std::string("<g stroke=\"#bbbbbb\">")
                             : "<g " + series_style(i) + " fill=\"" + kPalette[i % kPaletteSize] + "\">";
    svg += "<line x1=\"" + pixel(legend[i].x) + "\" x2=\"" + pixel(legend[i].x + 18) + "\" y1=\"" + pixel(y) +
           "\" y2=\"" + pixel(y) + "\" stroke-width=\"2.5\"/>";
    if (!points[i].empty() && points[i].size() <= kMarkerLimit) {
      svg += "<circle cx=\"" + pixel(legend[i].x + 9) + "\" cy=\"" + pixel(y) + "\" r=\"3\" stroke=\"none\"/>";
    }
    svg += "<text x=\"" + pixel(legend[i].x + 24) + "\" y=\"" + pixel(y + 4) + "\" stroke=\"none\" fill=\"" +
           (points[i].empty() ? "#888888" : "#333333") + "\">" + escape_markup(legend_labels[i]) + "</text></g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

std::vector<Chart> training_charts(const std::vector<nlohmann::json>& metrics,
                                   const std::vector<nlohmann::json>& evals) {
  std::vector<Chart> charts;

  Chart reward{"Reward", "step", "mean reward per response", {}};
  add_if_any(reward, series_of(metrics, "reward_mean", "total"));
  for (const std::string& name : reward_functions(metrics))
    add_if_any(reward, series_of(metrics, "reward_" + name, name));
  charts.push_back(std::move(reward));

  Chart accuracy{"Accuracy", "step", "fraction correct", {}};
  add_if_any(accuracy, series_of(metrics, "accuracy", "train (sampled)"));
  add_if_any(accuracy, series_of(evals, "accuracy", "eval (greedy)"));
  add_if_any(accuracy, series_of(evals, "pass_at_k", pass_at_k_name(evals)));
  charts.push_back(std::move(accuracy));

  Chart length{"Response length", "step", "tokens", {}};
  add_if_any(length, series_of(metrics, "response_length_mean", "mean"));
  add_if_any(length, series_of(metrics, "response_length_max", "max"));
  charts.push_back(std::move(length));

  Chart entropy{"Entropy", "step", "mean token entropy (nats)", {}};
  add_if_any(entropy, series_of(metrics, "entropy", "entropy"));
  charts.push_back(std::move(entropy));

  Chart clipping{"Clip fractions", "step", "fraction of response tokens", {}};
  add_if_any(clipping, series_of(metrics, "clip_fraction", "clipped"));
  add_if_any(clipping, series_of(metrics, "dual_clip_fraction", "dual-clipped"));
  charts.push_back(std::move(clipping));

  Chart kl{"Approx KL", "step", "mean of old_logp - logp", {}};
  add_if_any(kl, series_of(metrics, "approx_kl", "approx KL"));
  charts.push_back(std::move(kl));
  return charts;
}

std::vector<Chart> comparison_charts(const std::vector<std::filesystem::path>& runs) {
  Chart held_out{"Held-out greedy accuracy", "step", "fraction correct", {}};
  Chart sampled{"Sampled training accuracy", "step", "fraction correct", {}};
  std::set<std::string> names;  // labels used so far
  for (const auto& run : runs) {
    const std::string directory = (run.filename().empty() ? run.parent_path() : run).filename().string();
    std::string name = directory;
    if (fs::exists(run / "summary.json")) {
      std::ifstream in(run / "summary.json");
      const json summary = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (summary.is_object() && summary.contains("algorithm") && summary.contains("seed")) {
        name = summary.at("algorithm").get<std::string>() + " seed " + summary.at("seed").dump();
      }
    }
    if (!names.insert(name).second) {
      name += " (" + directory + ")";
      names.insert(name);
    }
    if (fs::exists(run / "eval.jsonl")) {
      held_out.series.push_back(series_of(read_json_lines(run / "eval.jsonl"), "accuracy", name));
    }
    if (fs::exists(run / "metrics.jsonl")) {
      sampled.series.push_back(series_of(read_json_lines(run / "metrics.jsonl"), "accuracy", name));
    }
  }
  return {held_out, sampled};
}

std::vector<std::filesystem::path> write_comparison(const std::filesystem::path& output_dir,
                                                    const std::vector<std::filesystem::path>& runs) {
  std::error_code error;
  fs::create_directories(output_dir, error);
  if (error) throw std::runtime_error(output_dir.string() + ": cannot create directory: " + error.message());
  std::vector<std::filesystem::path> written;
  for (const Chart& chart : comparison_charts(runs)) {
    written.push_back(output_dir / (slug_of(chart.title) + ".svg"));
    write_atomically(written.back(), render_svg(chart));
  }
  return written;
}

void write_report(const std::filesystem::path& output_dir, const std::vector<nlohmann::json>& metrics,
                  const std::vector<nlohmann::json>& evals, const nlohmann::json& summary) {
  const fs::path plots_dir = output_dir / "plots";
  std::error_code error;
  fs::create_directories(plots_dir, error);
  if (error) throw std::runtime_error(plots_dir.string() + ": cannot create directory: " + error.message());

  std::string figures;
  std::vector<std::string> slugs;
  for (const Chart& chart : training_charts(metrics, evals)) {
    std::string slug = slug_of(chart.title);
    for (int n = 2; std::find(slugs.begin(), slugs.end(), slug) != slugs.end(); ++n) {
      slug = slug_of(chart.title) + "-" + std::to_string(n);
    }
    slugs.push_back(slug);
    const std::string svg = render_svg(chart);
    write_atomically(plots_dir / (slug + ".svg"), svg);
    figures += "<figure>\n" + svg + "<figcaption><a href=\"plots/" + slug + ".svg\">plots/" + slug +
               ".svg</a></figcaption>\n</figure>\n";
  }

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>Training report</title>\n<style>\n" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  html += "<h1>Training report</h1>\n<p class=\"overview\">" + overview(metrics, evals) + "</p>\n";
  html += "<h2>Summary</h2>\n" + summary_table(summary);
  html += "<h2>Charts</h2>\n<div class=\"charts\">\n" + figures + "</div>\n";
  html += "<h2>Evaluations</h2>\n" + eval_table(evals);
  html += "</body>\n</html>\n";
  write_atomically(output_dir / "report.html", html);
}

std::vector<nlohmann::json> read_json_lines(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open for reading (does the file exist?)");
  std::vector<json> rows;
  std::string line;
  for (std::size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path.string() + ":" + std::to_string(line_number) + ": ";
    json row;
    try {
      row = json::parse(line);
    } catch (const json::parse_error& parse_error) {
      const bool last_line = in.peek() == std::char_traits<char>::eof();
      throw std::runtime_error(where + "not valid JSON (" + parse_error.what() + ")" +
                               (last_line ? "; a run stopped mid-write leaves a partial last line: delete it" : ""));
    }
    if (!row.is_object()) {
      throw std::runtime_error(where + "expected one JSON object per line, not " + std::string(row.type_name()));
    }
    rows.push_back(std::move(row));
  }
  if (in.bad()) throw std::runtime_error(path.string() + ": read failed");
  return rows;
}

}  // namespace qwen
