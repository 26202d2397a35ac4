// The advantage estimators by verl's names (algorithm.adv_estimator; verl core_algos.py, @register_adv_est) on plain
// buffers, with groups given by a prompt index as verl's `index`: rows of one prompt need not be adjacent, and groups
// may differ in size. No LibTorch here; <dapo/advantage.hpp> has the tensor front end.
//
// Shapes: B = rows, T = cols. token_level_rewards, response_mask, advantages, returns [B, T] row-major; index [B].
// Each row's score s is the sum of its token-level rewards (the outcome score sits on the last response token). Per row
// of a group g with n rows, mean m and unbiased std σ of the group's scores:
//   grpo                          (s - m) / (σ + ε), or s - m with norm_adv_by_std = false (Dr. GRPO); a group of one
//                                 row has m = 0, σ = 1
//   grpo_passk                    only each group's best row: (s_max - s_second) (/ (σ + ε)); every other row 0; n >= 2
//   rloo                          (s - m) n / (n - 1), leave-one-out (s itself when n = 1)
//   opo                           s - Σ len·s / Σ len (length-weighted baseline; 0 when n = 1)
//   reinforce_plus_plus_baseline  s - m, then whitened over all masked tokens of the batch
//   reinforce_plus_plus           the discounted return Σ_{t' >= t} γ^(t'-t) r_t' over masked tokens, whitened
//   gpg                           α (s - m) / f_norm, α = B / (rows with a non-zero score)
// Advantages are broadcast over each row's masked tokens (0 elsewhere); returns equal advantages except for
// reinforce_plus_plus (its returns). Whitening is verl's masked_whiten: (x - mean) / sqrt(var + 1e-8), mean and var
// over the masked tokens, var unbiased, the mean divided by (count + 1e-8).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "dapo/core/error.hpp"
#include "dapo/core/policy_loss_options.hpp"

namespace dapo {

enum class AdvantageEstimator { kGrpo, kGrpoPassk, kRloo, kOpo, kReinforcePlusPlus, kReinforcePlusPlusBaseline, kGpg };

constexpr std::array<std::pair<AdvantageEstimator, std::string_view>, 7> kAdvantageEstimatorNames{{
    {AdvantageEstimator::kGrpo, "grpo"},
    {AdvantageEstimator::kGrpoPassk, "grpo_passk"},
    {AdvantageEstimator::kRloo, "rloo"},
    {AdvantageEstimator::kOpo, "opo"},
    {AdvantageEstimator::kReinforcePlusPlus, "reinforce_plus_plus"},
    {AdvantageEstimator::kReinforcePlusPlusBaseline, "reinforce_plus_plus_baseline"},
    {AdvantageEstimator::kGpg, "gpg"},
}};

inline std::string_view advantage_estimator_name(AdvantageEstimator estimator) {
  return detail::name_of(kAdvantageEstimatorNames, estimator, "dapo::advantage_estimator_name");
}

inline AdvantageEstimator advantage_estimator_from_name(std::string_view name) {
  return detail::value_of(kAdvantageEstimatorNames, name, "advantage estimator", "dapo::advantage_estimator_from_name");
}

struct AdvantageEstimatorOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  bool norm_adv_by_std = true;  // grpo, grpo_passk: divide by σ + ε (verl's algorithm.norm_adv_by_std_in_grpo)
  double epsilon = 1e-6;        // ε
  double gamma = 1.0;           // reinforce_plus_plus: the discount
  double f_norm = 1.0;          // gpg
};

namespace detail {

// verl's masked_whiten over [B, T]: in place on values.
inline void masked_whiten(std::vector<double>& values, const std::vector<double>& mask, const char* where) {
  double count = 0.0, sum = 0.0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (mask[i] != 0.0) {
      count += 1.0;
      sum += values[i];
    }
  }
  DAPO_REQUIRE(count >= 2.0, where, "the batch has ", count,
               " masked tokens; whitening needs at least 2 (verl's masked_var)");
  const double mean = sum / (count + kVerlCountEpsilon);
  double squares = 0.0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (mask[i] != 0.0) squares += (values[i] - mean) * (values[i] - mean);
  }
  const double variance = squares / (count + kVerlCountEpsilon) * (count / (count - 1.0));
  const double inverse_std = 1.0 / std::sqrt(variance + 1e-8);
  for (double& value : values) value = (value - mean) * inverse_std;
}

}  // namespace detail

namespace core {

template <std::floating_point T>
void estimate_advantages(std::span<const T> token_level_rewards, std::span<const T> response_mask,
                         std::span<const int64_t> index, int64_t rows, int64_t cols,
                         const AdvantageEstimatorOptions& options, std::span<T> advantages, std::span<T> returns = {}) {
  constexpr const char* kWhere = "dapo::core::estimate_advantages";
  DAPO_REQUIRE(rows >= 0 && cols >= 0, kWhere, "shape [", rows, ", ", cols, "] has a negative extent");
  const auto size = static_cast<std::size_t>(rows * cols);
  DAPO_REQUIRE(token_level_rewards.size() == size, kWhere, "token_level_rewards has ", token_level_rewards.size(),
               " elements, expected B * T = ", rows, " * ", cols);
  DAPO_REQUIRE(response_mask.size() == size, kWhere, "response_mask has ", response_mask.size(),
               " elements but token_level_rewards has ", size);
  DAPO_REQUIRE(index.size() == static_cast<std::size_t>(rows), kWhere, "index has ", index.size(),
               " elements, expected B = ", rows);
  DAPO_REQUIRE(advantages.size() == size, kWhere, "advantages has ", advantages.size(), " elements, expected ", size);
  DAPO_REQUIRE(returns.empty() || returns.size() == size, kWhere, "returns has ", returns.size(),
               " elements, expected 0 (not wanted) or ", size);
  DAPO_REQUIRE(std::isfinite(options.epsilon) && options.epsilon >= 0.0, kWhere, "epsilon is ", options.epsilon,
               ", expected a finite value >= 0");
  DAPO_REQUIRE(std::isfinite(options.gamma), kWhere, "gamma is ", options.gamma, ", expected a finite value");
  DAPO_REQUIRE(std::isfinite(options.f_norm) && options.f_norm != 0.0, kWhere, "f_norm is ", options.f_norm,
               ", expected a finite non-zero value");

  std::vector<double> mask(size), score(static_cast<std::size_t>(rows), 0.0), length(static_cast<std::size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < cols; ++t) {
      const auto i = static_cast<std::size_t>(b * cols + t);
      const auto m = static_cast<double>(response_mask[i]);
      DAPO_REQUIRE(m == 0.0 || m == 1.0, kWhere, "response_mask[", b, ", ", t, "] is ", m, ", expected 0 or 1");
      const auto reward = static_cast<double>(token_level_rewards[i]);
      DAPO_REQUIRE(std::isfinite(reward), kWhere, "token_level_rewards[", b, ", ", t, "] is ", reward,
                   ", expected a finite number");
      mask[i] = m;
      score[static_cast<std::size_t>(b)] += reward;
      length[static_cast<std::size_t>(b)] += m;
    }
  }
  // The rows of each prompt, in row order (std::map: groups in index order; the order does not change any value).
  std::map<int64_t, std::vector<int64_t>> groups;
  for (int64_t b = 0; b < rows; ++b) groups[index[static_cast<std::size_t>(b)]].push_back(b);
  const auto group_mean = [&](const std::vector<int64_t>& members) {
    double sum = 0.0;
    for (const int64_t b : members) sum += score[static_cast<std::size_t>(b)];
    return sum / static_cast<double>(members.size());
  };
  const auto group_std = [&](const std::vector<int64_t>& members, double mean) {  // unbiased, as torch.std
    double squares = 0.0;
    for (const int64_t b : members) {
      const double d = score[static_cast<std::size_t>(b)] - mean;
      squares += d * d;
    }
    return std::sqrt(squares / static_cast<double>(members.size() - 1));
  };

  std::vector<double> row_value(static_cast<std::size_t>(rows), 0.0);
  std::vector<double> token_value;  // [B, T] for the whitened estimators
  std::vector<double> returns_value;
  switch (options.estimator) {
    case AdvantageEstimator::kGrpo:
    case AdvantageEstimator::kGpg: {
      double alpha = 1.0;
      if (options.estimator == AdvantageEstimator::kGpg) {
        double nonzero = 0.0;
        for (const double s : score) nonzero += s != 0.0 ? 1.0 : 0.0;
        alpha = static_cast<double>(rows) / std::max(nonzero, 1.0);
      }
      for (const auto& [id, members] : groups) {
        const bool single = members.size() == 1;
        const double mean = single ? 0.0 : group_mean(members);
        const double std = single ? 1.0 : group_std(members, mean);
        for (const int64_t b : members) {
          const double centered = score[static_cast<std::size_t>(b)] - mean;
          double& value = row_value[static_cast<std::size_t>(b)];
          if (options.estimator == AdvantageEstimator::kGpg) {
            value = alpha * centered / options.f_norm;
          } else {
            value = options.norm_adv_by_std ? centered / (std + options.epsilon) : centered;
          }
        }
      }
      break;
    }
    case AdvantageEstimator::kGrpoPassk:
      for (const auto& [id, members] : groups) {
        DAPO_REQUIRE(members.size() >= 2, kWhere, "grpo_passk needs at least 2 rows per prompt; index ", id, " has ",
                     members.size());
        // The best row (the first of equals) and the best score among the others.
        int64_t best = members.front();
        for (const int64_t b : members) {
          if (score[static_cast<std::size_t>(b)] > score[static_cast<std::size_t>(best)]) best = b;
        }
        double second = -INFINITY;
        for (const int64_t b : members) {
          if (b != best) second = std::max(second, score[static_cast<std::size_t>(b)]);
        }
        double value = score[static_cast<std::size_t>(best)] - second;
        if (options.norm_adv_by_std) value /= group_std(members, group_mean(members)) + options.epsilon;
        row_value[static_cast<std::size_t>(best)] = value;
      }
      break;
    case AdvantageEstimator::kRloo:
      for (const auto& [id, members] : groups) {
        const auto n = static_cast<double>(members.size());
        const double mean = members.size() == 1 ? 0.0 : group_mean(members);
        for (const int64_t b : members) {
          const double s = score[static_cast<std::size_t>(b)];
          row_value[static_cast<std::size_t>(b)] = members.size() > 1 ? s * n / (n - 1.0) - mean * n / (n - 1.0) : s;
        }
      }
      break;
    case AdvantageEstimator::kOpo:
      for (const auto& [id, members] : groups) {
        double baseline = 0.0;
        if (members.size() > 1) {
          double weighted = 0.0, total_length = 0.0;
          for (const int64_t b : members) {
            weighted += length[static_cast<std::size_t>(b)] * score[static_cast<std::size_t>(b)];
            total_length += length[static_cast<std::size_t>(b)];
          }
          baseline = weighted / total_length;
        }
        for (const int64_t b : members) {
          row_value[static_cast<std::size_t>(b)] = score[static_cast<std::size_t>(b)] - baseline;
        }
      }
      break;
    case AdvantageEstimator::kReinforcePlusPlusBaseline: {
      token_value.assign(size, 0.0);
      for (const auto& [id, members] : groups) {
        const double mean = members.size() == 1 ? 0.0 : group_mean(members);
        for (const int64_t b : members) {
          for (int64_t t = 0; t < cols; ++t) {
            const auto i = static_cast<std::size_t>(b * cols + t);
            token_value[i] = (score[static_cast<std::size_t>(b)] - mean) * mask[i];
          }
        }
      }
      detail::masked_whiten(token_value, mask, kWhere);
      break;
    }
    case AdvantageEstimator::kReinforcePlusPlus: {
      returns_value.assign(size, 0.0);
      for (int64_t b = 0; b < rows; ++b) {
        double running = 0.0;
        for (int64_t t = cols - 1; t >= 0; --t) {
          const auto i = static_cast<std::size_t>(b * cols + t);
          const double next = static_cast<double>(token_level_rewards[i]) + options.gamma * running;
          returns_value[i] = next * mask[i];
          running = next * mask[i] + running * (1.0 - mask[i]);  // unmasked tokens carry the return through
        }
      }
      token_value = returns_value;
      detail::masked_whiten(token_value, mask, kWhere);
      break;
    }
  }
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < cols; ++t) {
      const auto i = static_cast<std::size_t>(b * cols + t);
      const double value = token_value.empty() ? row_value[static_cast<std::size_t>(b)] : token_value[i];
      advantages[i] = static_cast<T>(value * mask[i]);
      if (!returns.empty()) returns[i] = static_cast<T>(returns_value.empty() ? value * mask[i] : returns_value[i]);
    }
  }
}

}  // namespace core
}  // namespace dapo
