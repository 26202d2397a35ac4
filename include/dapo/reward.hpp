// DAPO's soft overlong punishment (Eq. 13) on LibTorch tensors; the scalar form and the plain-buffer form are in
// <dapo/core/reward.hpp>, which this header includes. Task rewards (GSM8K) are in <dapo/rewards/gsm8k.hpp>.
//
// Shapes: N = responses.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include "dapo/core/reward.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

// lengths [N] (integral: response tokens) -> penalties [N] in the default floating dtype, on the same device.
inline torch::Tensor overlong_penalty(const torch::Tensor& lengths, int64_t max_length, int64_t cache_length,
                                      double factor = 1.0) {
  constexpr const char* kWhere = "dapo::overlong_penalty";
  detail::check_defined(lengths, "lengths", kWhere);
  DAPO_REQUIRE(!lengths.is_floating_point() && !lengths.is_complex() && lengths.scalar_type() != torch::kBool, kWhere,
               "lengths has dtype ", lengths.scalar_type(), ", expected an integer dtype (token counts)");
  detail::check_dim(lengths, 1, "lengths", kWhere);
  detail::check_overlong_options(max_length, cache_length, factor, kWhere);
  const std::string negative = detail::first_true_index(lengths < 0);
  DAPO_REQUIRE(negative.empty(), kWhere, "lengths", negative, " is negative, expected token counts >= 0");

  const torch::Tensor length = lengths.to(torch::kFloat64);
  const int64_t expected_length = max_length - cache_length;
  // cache_length = 0 leaves the ramp empty; max(cache, 1) only keeps the unused branch finite.
  const torch::Tensor ramp = (static_cast<double>(expected_length) - length) /
                             static_cast<double>(std::max<int64_t>(cache_length, 1)) * factor;
  const torch::Tensor penalty =
      torch::where(length <= static_cast<double>(expected_length), torch::zeros_like(length),
                   torch::where(length <= static_cast<double>(max_length), ramp, torch::full_like(length, -factor)));
  return penalty.to(torch::typeMetaToScalarType(torch::get_default_dtype()));
}

}  // namespace dapo
