// One step's metrics row under verl's names (docs/driver.md has the table): the trained batch's
// scores, advantages and lengths (verl's compute_data_metrics), the actor's update (actor/*), timings (timing_s/*) and
// throughput (perf/*). What verl has no name for keeps a prefix of its own: reward/* (each reward function's mean over
// every sampled response), sampled/* (all responses drawn this step, kept or filtered), dapo/* (dynamic sampling's
// group counts).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "qwen_gsm8k/train/update.hpp"

namespace qwen {

// Sums over every response sampled in a step, kept or not: the policy's current behaviour.
struct SampledResponses {
  double reward_sum = 0, reward_squares = 0, correct = 0, responses = 0, length_sum = 0, length_max = 0, truncated = 0;
  double parts[5] = {};  // correctness, digit, format, mark, overlong

  // Adds a round's groups; returns each response's accuracy (1 or 0), the metric dynamic sampling filters on.
  std::vector<double> add(const std::vector<Group>& groups);
  // sampled/*, reward/*.
  void write(nlohmann::json& row) const;
};

// The trained batch (the kept groups and their tensors): critic/score, critic/advantages (over loss tokens),
// response_length (clip_ratio: responses of truncated_at tokens or more, as verl counts them), prompt_length,
// train/accuracy. truncated_at: ResponseBudget::truncated_at.
void add_batch_metrics(nlohmann::json& row, const std::vector<Group>& groups, const TrainBatch& batch,
                       int64_t truncated_at);

// actor/*: pg_loss, pg_clipfrac, pg_clipfrac_lower (the dual clip's share), ppo_kl, entropy, grad_norm, lr, and ours.
void add_update_metrics(nlohmann::json& row, const UpdateMetrics& update);

// timing_s/update_actor and timing_s/step; perf/total_num_tokens (prompt + response tokens of the trained batch),
// perf/time_per_step and perf/throughput = tokens / (step seconds * ranks), as verl's compute_throughout_metrics.
void add_time_metrics(nlohmann::json& row, const std::vector<Group>& groups, const UpdateMetrics& update,
                      double step_seconds, int world_size);

}  // namespace qwen
