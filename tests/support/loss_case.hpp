// One policy_loss case of ../shared/fixtures/algo/golden.json in flat row-major form, plus random cases.
#pragma once

#include <dapo/core/loss.hpp>

#include <random>
#include <string>
#include <vector>

#include "support/shared.hpp"

namespace dapo::test {

struct LossCase {
  int64_t rows = 0, cols = 0;
  std::vector<double> logp, old_logp, advantages, mask;  // [B, T], [B, T], [B] or [B, T], [B, T]
  bool per_token_advantages = false;
  PolicyLossOptions options;
  // Expected values (golden cases only).
  double loss = 0, clip_fraction = 0, dual_clip_fraction = 0, approx_kl = 0;
  std::vector<double> grad_logp;
  std::string name;
};

inline LossCase loss_case_from_golden(const nlohmann::json& item, std::size_t index) {
  LossCase c;
  c.rows = static_cast<int64_t>(item.at("logp").size());
  c.cols = static_cast<int64_t>(item.at("logp").at(0).size());
  c.logp = flatten(item.at("logp"));
  c.old_logp = flatten(item.at("old_logp"));
  c.advantages = flatten(item.at("advantages"));
  c.per_token_advantages = item.at("advantages").at(0).is_array();
  c.mask = flatten(item.at("mask"));
  c.options.clip_low = item.at("clip_low");
  c.options.clip_high = item.at("clip_high");
  c.options.dual_clip = item.at("dual_clip");
  c.options.aggregation = aggregation_from_name(item.at("aggregation").get<std::string>());
  c.options.group_size = item.at("group_size");
  c.options.norm_length = item.at("norm_length");
  const auto& expected = item.at("expected");
  c.loss = expected.at("loss");
  c.clip_fraction = expected.at("clipfrac");
  c.dual_clip_fraction = expected.at("clipfrac_lower");
  c.approx_kl = expected.at("ppo_kl");
  c.grad_logp = flatten(expected.at("grad_logp"));
  c.name = "golden case " + std::to_string(index) + " (" + item.at("aggregation").get<std::string>() + ", [" +
           std::to_string(c.rows) + ", " + std::to_string(c.cols) + "])";
  return c;
}

inline std::vector<LossCase> golden_loss_cases() {
  std::vector<LossCase> cases;
  const auto items = algo_golden("policy_loss");
  if (!items) return cases;
  for (std::size_t i = 0; i < items->size(); ++i) cases.push_back(loss_case_from_golden(items->at(i), i));
  return cases;
}

// A random batch whose log-ratios reach well past the clip range, with ragged masks (one row may be empty).
inline LossCase random_loss_case(std::mt19937_64& rng, int64_t rows, int64_t cols, bool per_token_advantages,
                                 const PolicyLossOptions& options) {
  LossCase c;
  c.rows = rows;
  c.cols = cols;
  c.options = options;
  c.per_token_advantages = per_token_advantages;
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int64_t> length(0, cols);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t tokens = b == 0 ? cols : length(rng);  // row 0 full so no group is empty
    for (int64_t t = 0; t < cols; ++t) {
      const double old_lp = -std::abs(normal(rng)) * 2.0;
      c.old_logp.push_back(old_lp);
      c.logp.push_back(old_lp + 0.4 * normal(rng));
      c.mask.push_back(t < tokens ? 1.0 : 0.0);
      if (per_token_advantages) c.advantages.push_back(normal(rng));
    }
    if (!per_token_advantages) c.advantages.push_back(normal(rng));
  }
  return c;
}

}  // namespace dapo::test
