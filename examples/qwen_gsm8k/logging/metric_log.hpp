// Where a run's metrics go while it trains (verl's trainer.logger): "jsonl" appends each step's row to metrics.jsonl,
// "tensorboard" writes its numbers to an events.out.tfevents.* file, "console" is the trainer's progress line (printed
// by the trainer, not here). One row per step, a JSON object with a "step" field, verl's metric names (docs/driver.md).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "qwen_gsm8k/logging/tensorboard.hpp"

namespace qwen {

// The logger names a run may ask for.
inline const std::vector<std::string> kLoggerNames = {"console", "jsonl", "tensorboard"};
// Throws std::invalid_argument naming a name that is not one of kLoggerNames.
void check_logger_names(const std::vector<std::string>& names);
bool has_logger(const std::vector<std::string>& names, const std::string& name);

// The scalars of a row as TensorBoard gets them: every number or boolean at the top level except "step", in the
// row's key order; arrays, strings and nested objects stay in metrics.jsonl only.
std::vector<std::pair<std::string, double>> row_scalars(const nlohmann::json& row);

class MetricLog {
 public:
  // Writes nothing when output_dir is empty or `writes` is false (ranks other than 0).
  MetricLog(const std::filesystem::path& output_dir, const std::vector<std::string>& loggers, bool writes);

  // A training step's row (must have an integer "step"): metrics.jsonl and TensorBoard.
  void log_step(const nlohmann::json& row);
  // An evaluation's row: eval.jsonl, and TensorBoard under "eval/<field>".
  void log_eval(const nlohmann::json& row);

 private:
  void append(const char* file, const nlohmann::json& row) const;
  TensorBoardWriter* tensorboard();
  std::filesystem::path output_dir_;
  bool jsonl_ = false, tensorboard_wanted_ = false;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // opened at the first row, so an idle trainer leaves no file
};

}  // namespace qwen
