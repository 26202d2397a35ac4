// torch.ops.dapo, the algorithm's pieces beside the loss: group advantages and verl's estimators, the dynamic-sampling
// filter, rollout correction (IS weights, rejection masks), the overlong penalty and the GSM8K rule rewards. A thin
// binding like torch_ops.cpp: each op fills the library's options and calls its LibTorch (or string) front end, which
// validates every argument (a bad one is a Python ValueError naming it). None is differentiable: they act on data.
//
// Shapes: N = rollouts (num_groups * group_size, a group's rows consecutive), B = rows, T = response tokens.
#include <torch/library.h>
#include <dapo/advantage.hpp>
#include <dapo/reward.hpp>
#include <dapo/rewards/gsm8k.hpp>
#include <dapo/rollout_correction.hpp>
#include <dapo/sampling.hpp>

#include <string>
#include <tuple>

#include "value_errors.hpp"

namespace {

using Tensor = at::Tensor;

// rewards [N] -> (r - mean_g) / (std_g + epsilon) [N], or r - mean_g without scale_by_std.
Tensor group_advantages(const Tensor& rewards, int64_t group_size, bool scale_by_std, double epsilon,
                        bool std_over_batch) {
  dapo::AdvantageOptions options;
  options.scale_by_std = scale_by_std;
  options.epsilon = epsilon;
  options.std_over_batch = std_over_batch;
  return dapo::group_advantages(rewards, group_size, options);
}

// verl's estimator `estimator` on token_level_rewards, response_mask [B, T] and index [B] (the prompt id of each
// row, an integer tensor) -> (advantages, returns), both [B, T].
std::tuple<Tensor, Tensor> estimate_advantages(const Tensor& token_level_rewards, const Tensor& response_mask,
                                               const Tensor& index, const std::string& estimator, bool norm_adv_by_std,
                                               double epsilon, double gamma, double f_norm) {
  dapo::AdvantageEstimatorOptions options;
  options.estimator = dapo::advantage_estimator_from_name(estimator);
  options.norm_adv_by_std = norm_adv_by_std;
  options.epsilon = epsilon;
  options.gamma = gamma;
  options.f_norm = f_norm;
  const dapo::AdvantageEstimate out = dapo::estimate_advantages(token_level_rewards, response_mask, index, options);
  return {out.advantages, out.returns};
}

Tensor informative_groups(const Tensor& scores, int64_t group_size) {
  return dapo::informative_groups(scores, group_size);
}

c10::Dict<std::string, double> metrics_of(const dapo::RolloutCorrection& correction) {
  c10::Dict<std::string, double> metrics;
  for (const auto& [name, value] : correction.metrics) metrics.insert(name, value);
  return metrics;
}

// verl's rollout_is ("token" / "sequence") and rollout_is_threshold ("U" or "L_U") -> (weights [B, T], metrics).
std::tuple<Tensor, c10::Dict<std::string, double>> rollout_is_weights(const Tensor& log_ratio,
                                                                      const Tensor& response_mask,
                                                                      const std::string& rollout_is,
                                                                      const std::string& threshold,
                                                                      bool batch_normalize) {
  dapo::RolloutIsOptions options = dapo::parse_rollout_is(rollout_is, threshold);
  options.batch_normalize = batch_normalize;
  const dapo::RolloutCorrection out = dapo::rollout_is_weights(log_ratio, response_mask, options);
  return {out.values, metrics_of(out)};
}

// verl's rollout_rs (options comma separated) and rollout_rs_threshold -> (kept mask [B, T] 0/1, metrics).
std::tuple<Tensor, c10::Dict<std::string, double>> rollout_rejection_mask(const Tensor& log_ratio,
                                                                          const Tensor& response_mask,
                                                                          const std::string& rollout_rs,
                                                                          const std::string& threshold) {
  const dapo::RolloutCorrection out =
      dapo::rollout_rejection_mask(log_ratio, response_mask, dapo::parse_rollout_rs(rollout_rs, threshold));
  return {out.values, metrics_of(out)};
}

Tensor overlong_penalty(const Tensor& lengths, int64_t max_length, int64_t cache_length, double factor) {
  return dapo::overlong_penalty(lengths, max_length, cache_length, factor);
}

dapo::gsm8k::AnswerMode answer_mode(bool lenient) {
  return lenient ? dapo::gsm8k::AnswerMode::kLenient : dapo::gsm8k::AnswerMode::kSeed;
}

// The four rule rewards of one response against the reference answer, and the answer extracted from it.
std::tuple<std::string, double, double, double, double> gsm8k_rewards(const std::string& response,
                                                                      const std::string& reference, bool lenient) {
  const dapo::gsm8k::Rewards rewards = dapo::gsm8k::score(response, reference, answer_mode(lenient));
  return {dapo::gsm8k::extract_answer(response, answer_mode(lenient)), rewards.correctness, rewards.digit,
          rewards.hard_format, rewards.mark};
}

// The reference answer of a GSM8K `answer` field (the text after "####", commas removed).
std::string gsm8k_reference_answer(const std::string& answer_field) {
  return dapo::gsm8k::reference_answer(answer_field);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dapo, m) {
  m.def(
      "group_advantages(Tensor rewards, int group_size, bool scale_by_std, float epsilon, bool std_over_batch=False) "
      "-> Tensor",
      dapo::python::value_errors<&group_advantages>);
  m.def(
      "estimate_advantages(Tensor token_level_rewards, Tensor response_mask, Tensor index, str estimator, "
      "bool norm_adv_by_std, float epsilon, float gamma, float f_norm) -> (Tensor advantages, Tensor returns)",
      dapo::python::value_errors<&estimate_advantages>);
  m.def("informative_groups(Tensor scores, int group_size) -> Tensor", dapo::python::value_errors<&informative_groups>);
  m.def(
      "rollout_is_weights(Tensor log_ratio, Tensor response_mask, str rollout_is, str threshold, "
      "bool batch_normalize) -> (Tensor weights, Dict(str, float) metrics)",
      dapo::python::value_errors<&rollout_is_weights>);
  m.def(
      "rollout_rejection_mask(Tensor log_ratio, Tensor response_mask, str rollout_rs, str threshold) "
      "-> (Tensor mask, Dict(str, float) metrics)",
      dapo::python::value_errors<&rollout_rejection_mask>);
  m.def("overlong_penalty(Tensor lengths, int max_length, int cache_length, float factor) -> Tensor",
        dapo::python::value_errors<&overlong_penalty>);
  m.def(
      "gsm8k_rewards(str response, str reference, bool lenient) "
      "-> (str extracted, float correctness, float digit, float hard_format, float mark)",
      dapo::python::value_errors<&gsm8k_rewards>);
  m.def("gsm8k_reference_answer(str answer_field) -> str", dapo::python::value_errors<&gsm8k_reference_answer>);
}
