// Group-relative advantages (GRPO / DAPO Eq. 9) on LibTorch tensors, and verl's advantage estimators by name. The same
// math on plain buffers is <dapo/core/advantage.hpp> and <dapo/core/advantage_estimator.hpp>; all give the numbers of
// verl's own estimators.
//
// Shapes: N = num_groups * group_size rollouts; the G = group_size responses of one prompt are consecutive.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <span>

#include "dapo/core/advantage.hpp"
#include "dapo/core/advantage_estimator.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

// rewards [N] (floating) -> advantages [N], same dtype and device. Not differentiable (outcome rewards are data).
// A = (r - mean_g) / (std_g + epsilon), std unbiased; with scale_by_std = false, A = r - mean_g (Dr. GRPO); with
// std_over_batch, the std of all N rewards instead of std_g (TRL's scale_rewards="batch").
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
  if (options.std_over_batch) {
    const torch::Tensor all = rewards - rewards.mean();
    const torch::Tensor std = (all.square().sum() / static_cast<double>(rewards.size(0) - 1)).sqrt();
    return (centered / (std + options.epsilon)).reshape(-1);
  }
  const torch::Tensor std = (centered.square().sum(1, /*keepdim=*/true) / static_cast<double>(group_size - 1)).sqrt();
  return (centered / (std + options.epsilon)).reshape(-1);
}

struct AdvantageEstimate {
  torch::Tensor advantages, returns;  // [B, T]; returns equal advantages except for reinforce_plus_plus
};

// verl's estimator options.estimator (<dapo/core/advantage_estimator.hpp>): token_level_rewards, response_mask [B, T]
// (floating; the mask 0/1 or bool), index [B] (integer: the prompt id of each row, rows of one prompt anywhere).
// Computed on the CPU in double (B * T values cross once); the outputs have the rewards' dtype and device.
inline AdvantageEstimate estimate_advantages(const torch::Tensor& token_level_rewards,
                                             const torch::Tensor& response_mask, const torch::Tensor& index,
                                             const AdvantageEstimatorOptions& options = {}) {
  constexpr const char* kWhere = "dapo::estimate_advantages";
  detail::check_floating(token_level_rewards, "token_level_rewards", kWhere);
  detail::check_dim(token_level_rewards, 2, "token_level_rewards", kWhere);
  detail::check_defined(response_mask, "response_mask", kWhere);
  DAPO_REQUIRE(response_mask.sizes() == token_level_rewards.sizes(), kWhere, "response_mask has shape ",
               detail::shape_of(response_mask), " but token_level_rewards has ", detail::shape_of(token_level_rewards));
  detail::check_defined(index, "index", kWhere);
  DAPO_REQUIRE(index.dim() == 1 && index.size(0) == token_level_rewards.size(0) && !index.is_floating_point() &&
                   index.scalar_type() != torch::kBool,
               kWhere, "index has shape ", detail::shape_of(index), " and dtype ", index.scalar_type(), ", expected [",
               token_level_rewards.size(0), "] of an integer dtype (one prompt id per row)");
  torch::NoGradGuard no_grad;
  const auto host = [](const torch::Tensor& t, torch::ScalarType dtype) {
    return t.to(torch::kCPU).to(dtype).contiguous();
  };
  const torch::Tensor rewards = host(token_level_rewards, torch::kFloat64);
  const torch::Tensor mask = host(response_mask, torch::kFloat64);
  const torch::Tensor ids = host(index, torch::kInt64);
  torch::Tensor advantages = torch::empty_like(rewards), returns = torch::empty_like(rewards);
  const auto span = [](const torch::Tensor& t) { return std::span<double>(t.data_ptr<double>(), t.numel()); };
  core::estimate_advantages<double>(span(rewards), span(mask),
                                    std::span<const int64_t>(ids.data_ptr<int64_t>(), ids.numel()), rewards.size(0),
                                    rewards.size(1), options, span(advantages), span(returns));
  const auto back = [&](const torch::Tensor& t) {
    return t.to(token_level_rewards.scalar_type()).to(token_level_rewards.device());
  };
  return {back(advantages), back(returns)};
}

}  // namespace dapo
