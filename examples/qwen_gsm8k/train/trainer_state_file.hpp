// trainer_state.json, the part of a checkpoint that says where the run stood: the step and update counters, the data
// sampler, the run's settings, and how many metrics/eval rows it had written. Parsing checks every field, so a damaged
// checkpoint fails naming the file and the field before a resume changes anything. No LibTorch: the fuzz targets
// build it alone.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qwen {

struct TrainerStateFile {
  int64_t step = 0;              // steps completed
  int64_t updates = 0;           // optimizer updates so far (the learning-rate schedule's position)
  nlohmann::json sampler;        // ProblemSampler::state(), an object (ProblemSampler::from_state checks its fields)
  nlohmann::json options;        // TrainOptions::to_json() of the run, an object
  std::size_t metrics_rows = 0;  // rows metrics.jsonl had at the checkpoint
  std::size_t eval_rows = 0;     // rows eval.jsonl had
};

// Parses and validates trainer_state.json's text; throws std::runtime_error naming `source` and the field.
// Checked: a JSON object; step and updates integers >= 0; sampler and options objects; metrics_rows and eval_rows
// integers >= 0. Other fields are ignored (a newer writer may add some).
TrainerStateFile parse_trainer_state(std::string_view text, const std::string& source);

// What save_checkpoint writes (parse_trainer_state reads it back unchanged).
nlohmann::json to_json(const TrainerStateFile& state);

}  // namespace qwen
