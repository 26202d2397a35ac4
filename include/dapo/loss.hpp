// The DAPO policy-gradient loss on LibTorch tensors: decoupled clip (Clip-Higher, Eq. 10), optional dual clip, and the
// token-level aggregation of Eq. 8/12 or one of the others for comparison. Differentiable in logp.
// The per-token math and every aggregation are defined in <dapo/core/loss.hpp>, which also computes them on plain
// buffers; this header validates tensors once, at the boundary, and evaluates the same formulas with tensor ops.
//
// Shapes: B = responses in the batch, T = response tokens (right-padded).
//   logp, old_logp, mask [B, T]; advantages [B] (one per response) or [B, T]. Outputs are 0-dim.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include "dapo/core/loss.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

struct PolicyLossOutput {
  torch::Tensor loss;                // differentiable in logp
  torch::Tensor clip_fraction;       // share of masked tokens where the decoupled clip bound the loss
  torch::Tensor dual_clip_fraction;  // share of masked tokens capped by the dual clip (0 when disabled)
  torch::Tensor approx_kl;           // masked mean of old_logp - logp
};

namespace detail {

// Everything policy_loss requires of its arguments, checked before any arithmetic.
inline void check_policy_loss_inputs(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                     const torch::Tensor& advantages, const torch::Tensor& mask,
                                     const PolicyLossOptions& options, const char* where) {
  check_floating(logp, "logp", where);
  check_dim(logp, 2, "logp", where);
  check_floating(old_logp, "old_logp", where);
  DAPO_REQUIRE(old_logp.sizes() == logp.sizes(), where, "old_logp has shape ", shape_of(old_logp), " but logp has ",
               shape_of(logp));
  DAPO_REQUIRE(old_logp.scalar_type() == logp.scalar_type(), where, "old_logp has dtype ", old_logp.scalar_type(),
               " but logp has ", logp.scalar_type());
  check_same_device(old_logp, logp, "old_logp", "logp", where);

  check_defined(mask, "mask", where);
  DAPO_REQUIRE(mask.sizes() == logp.sizes(), where, "mask has shape ", shape_of(mask), " but logp has ",
               shape_of(logp));
  DAPO_REQUIRE(mask.scalar_type() == torch::kBool || mask.is_floating_point(), where, "mask has dtype ",
               mask.scalar_type(), ", expected bool or a floating dtype holding 0 and 1");
  check_same_device(mask, logp, "mask", "logp", where);
  if (mask.is_floating_point()) {
    const std::string bad = first_true_index((mask != 0) & (mask != 1));
    DAPO_REQUIRE(bad.empty(), where, "mask", bad, " is ",
                 bad.empty() ? 0.0 : mask.masked_select((mask != 0) & (mask != 1))[0].item<double>(),
                 ", expected 0 or 1");
  }

  check_floating(advantages, "advantages", where);
  const int64_t rows = logp.size(0);
  DAPO_REQUIRE((advantages.dim() == 1 && advantages.size(0) == rows) || advantages.sizes() == logp.sizes(), where,
               "advantages has shape ", shape_of(advantages), ", expected [", rows, "] or ", shape_of(logp),
               " (logp's shape)");
  check_same_device(advantages, logp, "advantages", "logp", where);

  check_policy_loss_options(options, rows, where);
}

// Per-row token counts with the checks that depend on them (empty groups, global token count). mask_values [B, T].
inline void check_policy_loss_counts(const torch::Tensor& mask_values, const PolicyLossOptions& options,
                                     const char* where) {
  if (options.aggregation == LossAggregation::kGroupTokenMean) {
    const torch::Tensor group_tokens = mask_values.reshape({-1, options.group_size * mask_values.size(1)}).sum(1);
    const std::string empty = first_true_index(group_tokens == 0);
    DAPO_REQUIRE(empty.empty(), where, "group", empty, " (group_size = ", options.group_size,
                 ") has no masked token; group-token-mean is undefined for it");
  }
  if (options.global_token_count > 0.0) {
    const double local = mask_values.sum().item<double>();
    DAPO_REQUIRE(options.global_token_count >= local, where, "global_token_count is ", options.global_token_count,
                 " but this batch alone holds ", local, " masked tokens");
  }
}

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
      loss = (masked.reshape({-1, group_cols}).sum(1) / weights.reshape({-1, group_cols}).sum(1)).mean();
      break;
    }
    case LossAggregation::kSeqMeanTokenMean: {
      const torch::Tensor row_tokens = weights.sum(1);
      const torch::Tensor nonempty = (row_tokens > 0).to(per_token.scalar_type());
      loss = (masked.sum(1) / row_tokens.clamp_min(1.0) * nonempty).sum() / nonempty.sum().clamp_min(1.0);
      break;
    }
    case LossAggregation::kSeqMeanTokenSum: {
      const torch::Tensor nonempty = (weights.sum(1) > 0).to(per_token.scalar_type());
      loss = masked.sum() / nonempty.sum().clamp_min(1.0);
      break;
    }
    case LossAggregation::kSeqMeanTokenSumNorm: {
      const double norm_length = options.norm_length > 0.0 ? options.norm_length : static_cast<double>(cols);
      loss = masked.sum() / (norm_length * static_cast<double>(std::max<int64_t>(rows, 1)));
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

// DAPO Eq. 8 objective, negated as a loss to minimise. Validates every argument first; see the file comment for shapes.
// With no masked token the loss and metrics are 0 (group-token-mean instead requires a token in every group).
inline PolicyLossOutput policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                    const torch::Tensor& advantages, const torch::Tensor& mask,
                                    const PolicyLossOptions& options = {}) {
  constexpr const char* kWhere = "dapo::policy_loss";
  detail::check_policy_loss_inputs(logp, old_logp, advantages, mask, options, kWhere);
  detail::check_policy_loss_counts(mask.to(torch::kFloat64), options, kWhere);
  return detail::composite_policy_loss(logp, old_logp, advantages, mask, options);
}

}  // namespace dapo
