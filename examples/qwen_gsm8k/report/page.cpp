// write_report: the run's report.html (overview, summary table, the charts inline, the evaluations) and its
// plots/*.svg.
#include <algorithm>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/run_directory.hpp"
#include "qwen_gsm8k/report/markup.hpp"
#include "qwen_gsm8k/report/report.hpp"
#include "qwen_gsm8k/report/series.hpp"

namespace qwen {
namespace {

namespace fs = std::filesystem;
using detail::escape_markup;
using detail::general;
using nlohmann::json;

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
  for (const auto& [key, value] : rows) {
    html += "<tr><th>" + escape_markup(key) + "</th>" + table_cell(value) + "</tr>\n";
  }
  return html + "</table>\n";
}

// Every key any evaluation row has, the usual ones first.
std::vector<std::string> eval_columns(const std::vector<json>& evals) {
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
  return columns;
}

// One row per evaluation, one column per key.
std::string eval_table(const std::vector<json>& evals) {
  const std::vector<std::string> columns = eval_columns(evals);
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
    double first = std::numeric_limits<double>::infinity(), last = -first;
    for (const json& row : metrics) {
      if (const auto step = detail::finite_field(row, "step")) {
        first = std::min(first, *step), last = std::max(last, *step);
      }
    }
    if (first < last) text += " (steps " + general(first) + " to " + general(last) + ")";
    if (first == last) text += " (step " + general(first) + ")";
  }
  text += ", " + std::to_string(evals.size()) + (evals.size() == 1 ? " evaluation." : " evaluations.");
  return text;
}

// Writes plots_dir/<slug>.svg per training chart (a repeated slug gets "-2", "-3", ...) and returns the <figure>s
// that show them inline.
std::string write_charts(const fs::path& plots_dir, const std::vector<json>& metrics, const std::vector<json>& evals) {
  const std::string plots = std::string(RunDirectory::kPlots) + "/";  // the links, relative to the page
  std::string figures;
  std::vector<std::string> slugs;
  for (const Chart& chart : training_charts(metrics, evals)) {
    std::string slug = detail::slug_of(chart.title);
    for (int n = 2; std::find(slugs.begin(), slugs.end(), slug) != slugs.end(); ++n) {
      slug = detail::slug_of(chart.title) + "-" + std::to_string(n);
    }
    slugs.push_back(slug);
    const std::string svg = render_svg(chart);
    write_file_atomically(plots_dir / (slug + ".svg"), svg);
    figures += "<figure>\n" + svg + "<figcaption><a href=\"" + plots + slug + ".svg\">" + plots + slug +
               ".svg</a></figcaption>\n</figure>\n";
  }
  return figures;
}

}  // namespace

void write_report(const std::filesystem::path& output_dir, const std::vector<nlohmann::json>& metrics,
                  const std::vector<nlohmann::json>& evals, const nlohmann::json& summary) {
  const fs::path plots_dir = RunDirectory{output_dir}.plots();
  std::error_code error;
  fs::create_directories(plots_dir, error);
  if (error) throw std::runtime_error(plots_dir.string() + ": cannot create directory: " + error.message());
  const std::string figures = write_charts(plots_dir, metrics, evals);

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>Training report</title>\n<style>\n" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  html += "<h1>Training report</h1>\n<p class=\"overview\">" + overview(metrics, evals) + "</p>\n";
  html += "<h2>Summary</h2>\n" + summary_table(summary);
  html += "<h2>Charts</h2>\n<div class=\"charts\">\n" + figures + "</div>\n";
  html += "<h2>Evaluations</h2>\n" + eval_table(evals);
  html += "</body>\n</html>\n";
  write_file_atomically(RunDirectory{output_dir}.report(), html);
}

}  // namespace qwen
