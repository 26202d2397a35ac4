// Reading chart series out of JSON rows: non-numeric and non-finite values are skipped.
#include "qwen_gsm8k/report/series.hpp"

#include <cmath>
#include <utility>

namespace qwen::detail {

std::optional<double> finite_field(const nlohmann::json& row, const std::string& key) {
  if (!row.is_object()) return std::nullopt;
  const auto found = row.find(key);
  if (found == row.end() || !found->is_number()) return std::nullopt;
  const double value = found->get<double>();
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

ChartSeries series_of(const std::vector<nlohmann::json>& rows, const std::string& key, std::string name) {
  ChartSeries series{std::move(name), {}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto value = finite_field(rows[i], key);
    if (value) series.points.emplace_back(finite_field(rows[i], "step").value_or(static_cast<double>(i)), *value);
  }
  return series;
}

}  // namespace qwen::detail
