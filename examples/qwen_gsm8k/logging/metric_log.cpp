// metrics.jsonl, eval.jsonl and the TensorBoard file of a run.
#include "qwen_gsm8k/logging/metric_log.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "qwen_gsm8k/common/run_directory.hpp"

namespace qwen {

void check_logger_names(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    if (!has_logger(kLoggerNames, name)) {
      throw std::invalid_argument("logger \"" + name + "\" is not one of console, jsonl, tensorboard");
    }
  }
}

bool has_logger(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::vector<std::pair<std::string, double>> row_scalars(const nlohmann::json& row) {
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : row.items()) {
    if (key == "step") continue;
    if (value.is_number()) scalars.emplace_back(key, value.get<double>());
    if (value.is_boolean()) scalars.emplace_back(key, value.get<bool>() ? 1.0 : 0.0);
  }
  return scalars;
}

MetricLog::MetricLog(const std::filesystem::path& output_dir, const std::vector<std::string>& loggers, bool writes) {
  check_logger_names(loggers);
  if (output_dir.empty() || !writes) return;
  output_dir_ = output_dir;
  std::filesystem::create_directories(output_dir_);
  jsonl_ = has_logger(loggers, "jsonl");
  tensorboard_wanted_ = has_logger(loggers, "tensorboard");
}

TensorBoardWriter* MetricLog::tensorboard() {
  if (!tensorboard_wanted_) return nullptr;
  if (tensorboard_ == nullptr) tensorboard_ = std::make_unique<TensorBoardWriter>(output_dir_);
  return tensorboard_.get();
}

void MetricLog::log_step(const nlohmann::json& row) {
  if (output_dir_.empty()) return;
  if (jsonl_) append(RunDirectory::kMetrics, row);
  if (auto* writer = tensorboard()) writer->add_scalars(row.at("step").get<int64_t>(), row_scalars(row));
}

void MetricLog::log_eval(const nlohmann::json& row) {
  if (output_dir_.empty()) return;
  // eval.jsonl is always written: the report, the comparison and resume read it.
  append(RunDirectory::kEval, row);
  if (auto* writer = tensorboard()) {
    std::vector<std::pair<std::string, double>> scalars;
    for (auto [key, value] : row_scalars(row)) scalars.emplace_back("eval/" + key, value);
    writer->add_scalars(row.at("step").get<int64_t>(), scalars);
  }
}

void MetricLog::append(const char* file, const nlohmann::json& row) const {
  std::ofstream out(output_dir_ / file, std::ios::app);
  out << row.dump() << "\n";
  out.flush();
  if (!out) {
    throw std::runtime_error((output_dir_ / file).string() + ": write failed (" + std::strerror(errno) +
                             "; disk full, or a file size limit such as ulimit -f?)");
  }
}

}  // namespace qwen
