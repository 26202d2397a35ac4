// Chart series read out of a run's JSON rows (internal to report/): metrics.jsonl and eval.jsonl hold one object per
// step or evaluation, with numbers under fixed keys.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/report/report.hpp"

namespace qwen::detail {

// row[key] when the row is an object and it is a finite number; nullopt otherwise.
std::optional<double> finite_field(const nlohmann::json& row, const std::string& key);

// (step, row[key]) for each row with a finite row[key]; a row without a finite "step" uses its index in `rows`.
ChartSeries series_of(const std::vector<nlohmann::json>& rows, const std::string& key, std::string name);

}  // namespace qwen::detail
