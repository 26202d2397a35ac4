// Group-relative advantages (GRPO / DAPO Eq. 9) on LibTorch tensors. The same math on plain buffers is
// <dapo/core/advantage.hpp>; both give the numbers of verl's compute_grpo_outcome_advantage.
//
// Shapes: N = num_groups * group_size rollouts; the G = group_size responses of one prompt are consecutive.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include "dapo/core/advantage.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

// rewards [N] (floating) -> advantages [N], same dtype and device. Not differentiable (outcome rewards are data).
// A = (r - mean_g) / (std_g + epsilon), std unbiased; with scale_by_std = false, A = r - mean_g (Dr. GRPO).
inline torch::Tensor group_advantages(const torch::Tensor& rewards, int64_t group_size,
                                      const AdvantageOptions& options = {}) {
  constexpr const char* kWhere = "dapo::group_advantages";
  detail::check_floating(rewards, "rewards", kWhere);
  detail::check_dim(rewards, 1, "rewards", kWhere);
  detail::check_group_size(rewards.size(0), group_size, kWhere, "rewards");
  detail::check_advantage_options(options, kWhere);
  detail::check_finite(rewards, "rewards", kWhere);

  torch::NoGradGuard no_grad;
  const torch::Tensor grouped = rewards.reshape({-1, group_size});  // [num_groups, G]
  const torch::Tensor centered = grouped - grouped.mean(1, /*keepdim=*/true);
  if (!options.scale_by_std) return centered.reshape(-1);
  const torch::Tensor std = (centered.square().sum(1, /*keepdim=*/true) / static_cast<double>(group_size - 1)).sqrt();
  return (centered / (std + options.epsilon)).reshape(-1);
}

}  // namespace dapo
