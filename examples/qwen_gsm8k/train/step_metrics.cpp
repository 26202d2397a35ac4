// A step's metrics row (verl's names; see step_metrics.hpp).
#include "qwen_gsm8k/train/step_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qwen {
namespace {

// mean, max and min of a list, under verl's "<name>/mean" etc.
void add_stats(nlohmann::json& row, const std::string& name, const std::vector<double>& values) {
  if (values.empty()) return;
  double sum = 0;
  for (const double value : values) sum += value;
  row[name + "/mean"] = sum / static_cast<double>(values.size());
  row[name + "/max"] = *std::max_element(values.begin(), values.end());
  row[name + "/min"] = *std::min_element(values.begin(), values.end());
}

}  // namespace

std::vector<double> SampledResponses::add(const std::vector<Group>& groups) {
  std::vector<double> accuracy;
  for (const auto& group : groups) {
    for (const auto& response : group.responses) {
      const double reward = response.score.total;
      reward_sum += reward;
      reward_squares += reward * reward;
      correct += response.score.correct;
      responses += 1;
      length_sum += static_cast<double>(response.ids.size());
      length_max = std::max(length_max, static_cast<double>(response.ids.size()));
      truncated += response.truncated;
      parts[0] += response.score.parts.correctness;
      parts[1] += response.score.parts.digit;
      parts[2] += response.score.parts.hard_format;
      parts[3] += response.score.parts.mark;
      parts[4] += response.score.overlong;
      accuracy.push_back(response.score.correct ? 1.0 : 0.0);
    }
  }
  return accuracy;
}

void SampledResponses::write(nlohmann::json& row) const {
  const double mean = reward_sum / responses;
  row["sampled/score/mean"] = mean;
  row["sampled/score/std"] = std::sqrt(std::max(0.0, reward_squares / responses - mean * mean));
  row["sampled/accuracy"] = correct / responses;
  row["sampled/response_length/mean"] = length_sum / responses;
  row["sampled/response_length/max"] = length_max;
  row["sampled/truncated_fraction"] = truncated / responses;
  row["sampled/responses"] = responses;
  const char* names[5] = {"correctness", "digit", "format", "mark", "overlong"};
  for (int part = 0; part < 5; ++part) row[std::string("reward/") + names[part]] = parts[part] / responses;
}

void add_batch_metrics(nlohmann::json& row, const std::vector<Group>& groups, const TrainBatch& batch,
                       int64_t truncated_at) {
  std::vector<double> scores, response_lengths, prompt_lengths;
  double correct = 0, at_budget = 0;
  for (const auto& group : groups) {
    for (const auto& response : group.responses) {
      scores.push_back(response.score.total);
      response_lengths.push_back(static_cast<double>(response.ids.size()));
      prompt_lengths.push_back(static_cast<double>(group.prompt.size()));
      correct += response.score.correct;
      at_budget += static_cast<int64_t>(response.ids.size()) >= truncated_at;
    }
  }
  add_stats(row, "critic/score", scores);
  // Advantages over the loss's tokens, as verl's masked statistics: each row's advantage weighs by its token count.
  const torch::Tensor tokens = batch.padded.loss_mask.sum(1).to(torch::kFloat64).cpu();  // [B]
  const torch::Tensor advantages = batch.advantages.to(torch::kFloat64).cpu();           // [B]
  const auto* count = tokens.data_ptr<double>();
  const auto* value = advantages.data_ptr<double>();
  double weighted = 0, total = 0, high = -std::numeric_limits<double>::infinity(), low = -high;
  for (int64_t r = 0; r < tokens.size(0); ++r) {
    if (count[r] == 0) continue;
    weighted += value[r] * count[r];
    total += count[r];
    high = std::max(high, value[r]);
    low = std::min(low, value[r]);
  }
  if (total > 0) {
    row["critic/advantages/mean"] = weighted / total;
    row["critic/advantages/max"] = high;
    row["critic/advantages/min"] = low;
  }
  add_stats(row, "response_length", response_lengths);
  add_stats(row, "prompt_length", prompt_lengths);
  if (!scores.empty()) {
    row["response_length/clip_ratio"] = at_budget / static_cast<double>(scores.size());
    row["train/accuracy"] = correct / static_cast<double>(scores.size());
  }
}

void add_update_metrics(nlohmann::json& row, const UpdateMetrics& update) {
  row["actor/pg_loss"] = update.loss;
  row["actor/pg_clipfrac"] = update.clip_fraction;
  row["actor/pg_clipfrac_lower"] = update.dual_clip_fraction;
  row["actor/ppo_kl"] = update.approx_kl;
  row["actor/entropy"] = update.entropy;
  row["actor/grad_norm"] = update.grad_norm;
  row["actor/lr"] = update.lr;
  row["actor/pg_clipfrac_by_update"] = update.clip_fraction_by_update;  // a list: metrics.jsonl only
  row["actor/skipped_updates"] = update.skipped_updates;
  row["perf/update_tokens_per_second"] = update.tokens_per_second;
  row["perf/update_host_reads"] = update.host_reads;
  row["perf/update_host_copies"] = update.host_copies;
  if (update.kl_loss) row["actor/kl_loss"] = *update.kl_loss;
  if (const auto& diff = update.rollout_probs_diff) {
    row["training/rollout_probs_diff_max"] = (*diff)[0];
    row["training/rollout_probs_diff_mean"] = (*diff)[1];
    row["training/rollout_probs_diff_std"] = (*diff)[2];
  }
  for (const auto& [name, value] : update.rollout_correction) row["rollout_corr/" + name] = value;
}

void add_time_metrics(nlohmann::json& row, const std::vector<Group>& groups, const UpdateMetrics& update,
                      double step_seconds, int world_size) {
  double tokens = 0;
  for (const auto& group : groups) {
    for (const auto& response : group.responses)
      tokens += static_cast<double>(group.prompt.size() + response.ids.size());
  }
  row["timing_s/update_actor"] = update.seconds;
  row["timing_s/step"] = step_seconds;
  row["perf/total_num_tokens"] = tokens;
  row["perf/time_per_step"] = step_seconds;
  row["perf/throughput"] = tokens / (std::max(step_seconds, 1e-9) * world_size);
}

}  // namespace qwen
