// The policy loss as a plain chain of LibTorch ops that autograd differentiates: the reference the fused
// dapo::policy_loss is tested and benchmarked against, and the path for devices without a fused kernel.
// Same formulas, options and errors as <dapo/loss.hpp>; see <dapo/core/loss.hpp> for the math.
//
// Shapes: B = responses, T = response tokens. logp, old_logp, mask [B, T]; advantages [B] or [B, T].
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include "dapo/detail/loss_tensors.hpp"

namespace dapo {
namespace detail {

// The clipped objective and its aggregation as a chain of tensor ops (autograd differentiates it).
inline PolicyLossOutput composite_policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                              const torch::Tensor& advantages, const torch::Tensor& mask,
                                              const PolicyLossOptions& options) {
  // bfloat16 / float16 inputs are computed in float32: token counts and sums need more than 8 or 11 mantissa bits.
  const bool reduced = logp.scalar_type() == torch::kBFloat16 || logp.scalar_type() == torch::kHalf;
  const auto compute_type = reduced ? torch::kFloat32 : logp.scalar_type();
  const torch::Tensor advantage =
      (advantages.dim() == 1 ? advantages.detach().unsqueeze(1) : advantages.detach()).to(compute_type);
  const torch::Tensor log_ratio = (logp.to(compute_type) - old_logp.detach().to(compute_type)).clamp(-20.0, 20.0);
  const torch::Tensor ratio = log_ratio.exp();
  const torch::Tensor unclipped = -advantage * ratio;
  const torch::Tensor clipped = -advantage * ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
  torch::Tensor per_token = torch::maximum(unclipped, clipped);  // [B, T]
  const torch::Tensor clip_flags = clipped > unclipped;
  torch::Tensor dual_flags = torch::zeros_like(clip_flags);
  if (options.dual_clip > 0.0) {
    const torch::Tensor cap = -advantage * options.dual_clip;
    const torch::Tensor negative = (advantage < 0).expand_as(per_token);
    dual_flags = (per_token > cap) & negative;
    per_token = torch::where(negative, torch::minimum(per_token, cap), per_token);
  }

  const torch::Tensor weights = mask.to(per_token.scalar_type());  // [B, T] of 0/1
  const torch::Tensor masked = per_token * weights;
  const torch::Tensor token_count = weights.detach().sum();
  const torch::Tensor safe_count = token_count.clamp_min(1.0);  // with no token every numerator below is 0 too
  const int64_t rows = logp.size(0), cols = logp.size(1);

  torch::Tensor loss;
  switch (options.aggregation) {
    case LossAggregation::kTokenMean:
      loss = options.global_token_count > 0.0 ? masked.sum() / options.global_token_count : masked.sum() / safe_count;
      break;
    case LossAggregation::kGroupTokenMean: {
      const int64_t group_cols = options.group_size * cols;
      const torch::Tensor group_means =
          masked.reshape({-1, group_cols}).sum(1) / weights.reshape({-1, group_cols}).sum(1);
      loss = options.global_group_count > 0.0 ? group_means.sum() / options.global_group_count : group_means.mean();
      break;
    }
    case LossAggregation::kSeqMeanTokenMean: {
      const torch::Tensor row_tokens = weights.sum(1);
      const torch::Tensor nonempty = (row_tokens > 0).to(per_token.scalar_type());
      const torch::Tensor row_mean_sum = (masked.sum(1) / row_tokens.clamp_min(1.0) * nonempty).sum();
      loss = options.global_row_count > 0.0 ? row_mean_sum / options.global_row_count
                                            : row_mean_sum / nonempty.sum().clamp_min(1.0);
      break;
    }
    case LossAggregation::kSeqMeanTokenSum: {
      const torch::Tensor nonempty = (weights.sum(1) > 0).to(per_token.scalar_type());
      loss = options.global_row_count > 0.0 ? masked.sum() / options.global_row_count
                                            : masked.sum() / nonempty.sum().clamp_min(1.0);
      break;
    }
    case LossAggregation::kSeqMeanTokenSumNorm: {
      const double norm_length = options.norm_length > 0.0 ? options.norm_length : static_cast<double>(cols);
      const double row_count =
          options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(std::max<int64_t>(rows, 1));
      const double denominator = norm_length * row_count;
      // No column at all: the sum is 0 and so is the loss (not 0/0).
      loss = denominator > 0.0 ? masked.sum() / denominator : masked.sum() * 0.0;
      break;
    }
  }

  torch::NoGradGuard no_grad;
  auto masked_mean = [&](const torch::Tensor& values) {
    return (values.to(per_token.scalar_type()) * weights).sum() / safe_count;
  };
  return {loss, masked_mean(clip_flags), masked_mean(dual_flags), masked_mean(-log_ratio.detach())};
}

}  // namespace detail

namespace reference {

inline PolicyLossOutput policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                    const torch::Tensor& advantages, const torch::Tensor& mask,
                                    const PolicyLossOptions& options = {}) {
  constexpr const char* kWhere = "dapo::reference::policy_loss";
  detail::check_policy_loss_inputs(logp, old_logp, advantages, mask, options, kWhere);
  detail::check_policy_loss_data(mask, options, kWhere);
  return detail::composite_policy_loss(logp, old_logp, advantages, mask, options);
}

}  // namespace reference
}  // namespace dapo
