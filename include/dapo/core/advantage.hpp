// Group-relative advantages (GRPO / DAPO Eq. 9) on plain buffers. No LibTorch here; <dapo/advantage.hpp> is the
// tensor front end of the same math.
//
// Shapes: N = num_groups * group_size rollouts; the G = group_size responses of one prompt are consecutive.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>

#include "dapo/core/error.hpp"

namespace dapo {

struct AdvantageOptions {
  bool scale_by_std = true;  // false: Dr. GRPO, A = r - mean
  double epsilon = 1e-6;     // A = (r - mean) / (std + epsilon), std unbiased (N-1)
  // true: the std of all N rewards (unbiased, N-1) instead of the group's, the mean still the group's: TRL's
  // scale_rewards="batch" (TRL's "group" is the default here, "none" is scale_by_std = false; TRL's epsilon is 1e-4).
  bool std_over_batch = false;
};

namespace detail {

inline void check_advantage_options(const AdvantageOptions& options, const char* where) {
  // epsilon = 0 would turn every all-equal group into 0/0 = NaN.
  DAPO_REQUIRE(std::isfinite(options.epsilon) && (options.epsilon > 0.0 || !options.scale_by_std), where,
               "AdvantageOptions::epsilon is ", options.epsilon, ", expected a finite value > 0 when scale_by_std");
}

inline void check_group_size(int64_t count, int64_t group_size, const char* where, const char* what) {
  DAPO_REQUIRE(group_size >= 2, where, "group_size is ", group_size,
               ", expected >= 2 (a group needs two responses to compare)");
  DAPO_REQUIRE(count % group_size == 0, where, what, " has ", count, " elements, which group_size = ", group_size,
               " does not divide");
}

template <std::floating_point T>
void check_finite(std::span<const T> values, const char* where, const char* what) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    DAPO_REQUIRE(std::isfinite(values[i]), where, what, "[", i, "] is ", values[i], ", expected a finite number");
  }
}

}  // namespace detail

namespace core {

// rewards [N] -> advantages [N]; both spans of the same length (they may alias). Statistics in double.
template <std::floating_point T>
void group_advantages(std::span<const T> rewards, int64_t group_size, std::span<T> advantages,
                      const AdvantageOptions& options = {}) {
  constexpr const char* kWhere = "dapo::core::group_advantages";
  const auto count = static_cast<int64_t>(rewards.size());
  DAPO_REQUIRE(advantages.size() == rewards.size(), kWhere, "advantages has ", advantages.size(),
               " elements but rewards has ", rewards.size());
  detail::check_group_size(count, group_size, kWhere, "rewards");
  detail::check_advantage_options(options, kWhere);
  detail::check_finite(rewards, kWhere, "rewards");

  double batch_scale = 1.0;  // std_over_batch: 1 / (std of all rewards + epsilon)
  if (options.scale_by_std && options.std_over_batch) {
    double mean = 0.0;
    for (int64_t i = 0; i < count; ++i) mean += static_cast<double>(rewards[i]);
    mean /= static_cast<double>(count);
    double squares = 0.0;
    for (int64_t i = 0; i < count; ++i) {
      const double centered = static_cast<double>(rewards[i]) - mean;
      squares += centered * centered;
    }
    batch_scale = 1.0 / (std::sqrt(squares / static_cast<double>(count - 1)) + options.epsilon);
  }
  for (int64_t start = 0; start < count; start += group_size) {
    double mean = 0.0;
    for (int64_t i = start; i < start + group_size; ++i) mean += static_cast<double>(rewards[i]);
    mean /= static_cast<double>(group_size);
    double squares = 0.0;
    for (int64_t i = start; i < start + group_size; ++i) {
      const double centered = static_cast<double>(rewards[i]) - mean;
      squares += centered * centered;
    }
    const double scale = !options.scale_by_std ? 1.0
                         : options.std_over_batch
                             ? batch_scale
                             : 1.0 / (std::sqrt(squares / static_cast<double>(group_size - 1)) + options.epsilon);
    for (int64_t i = start; i < start + group_size; ++i) {
      advantages[i] = static_cast<T>((static_cast<double>(rewards[i]) - mean) * scale);
    }
  }
}

}  // namespace core
}  // namespace dapo
