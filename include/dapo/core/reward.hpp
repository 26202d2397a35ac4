// Reward shaping that does not depend on the task: DAPO's soft overlong punishment (Eq. 13). No LibTorch here;
// <dapo/reward.hpp> adds the tensor overload. Task rewards (GSM8K) live in <dapo/rewards/>.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "dapo/core/error.hpp"

namespace dapo {

namespace detail {

inline void check_overlong_options(int64_t max_length, int64_t cache_length, double factor, const char* where) {
  DAPO_REQUIRE(max_length > 0, where, "max_length is ", max_length, ", expected > 0");
  DAPO_REQUIRE(cache_length >= 0 && cache_length <= max_length, where, "cache_length is ", cache_length,
               ", expected a value in [0, max_length = ", max_length, "]");
  DAPO_REQUIRE(std::isfinite(factor) && factor >= 0.0, where, "factor is ", factor,
               ", expected a finite value >= 0 (the penalty's magnitude)");
}

// Eq. 13 without validation, for loops whose options were checked once.
inline double overlong_penalty_unchecked(int64_t length, int64_t max_length, int64_t cache_length, double factor) {
  const int64_t expected_length = max_length - cache_length;
  if (length <= expected_length) return 0.0;
  if (length <= max_length) {
    return static_cast<double>(expected_length - length) / static_cast<double>(cache_length) * factor;
  }
  return -factor;
}

}  // namespace detail

// DAPO Eq. 13: 0 up to L_max - L_cache tokens, then a linear ramp down to -factor at L_max, and -factor beyond.
// length: response tokens; max_length: L_max (the generation budget); cache_length: L_cache, the soft zone.
inline double overlong_penalty(int64_t length, int64_t max_length, int64_t cache_length, double factor = 1.0) {
  constexpr const char* kWhere = "dapo::overlong_penalty";
  detail::check_overlong_options(max_length, cache_length, factor, kWhere);
  DAPO_REQUIRE(length >= 0, kWhere, "length is ", length, ", expected >= 0");
  return detail::overlong_penalty_unchecked(length, max_length, cache_length, factor);
}

namespace core {

// lengths [N] -> penalties [N].
inline void overlong_penalty(std::span<const int64_t> lengths, int64_t max_length, int64_t cache_length, double factor,
                             std::span<double> penalties) {
  constexpr const char* kWhere = "dapo::core::overlong_penalty";
  DAPO_REQUIRE(penalties.size() == lengths.size(), kWhere, "penalties has ", penalties.size(),
               " elements but lengths has ", lengths.size());
  detail::check_overlong_options(max_length, cache_length, factor, kWhere);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    DAPO_REQUIRE(lengths[i] >= 0, kWhere, "lengths[", i, "] is ", lengths[i], ", expected >= 0");
    penalties[i] = detail::overlong_penalty_unchecked(lengths[i], max_length, cache_length, factor);
  }
}

}  // namespace core
}  // namespace dapo
