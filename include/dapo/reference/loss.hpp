// The policy loss as a plain chain of LibTorch ops that autograd differentiates: the reference the fused
// dapo::policy_loss is tested and benchmarked against, and the path for devices without a fused kernel.
// Same formulas, options and errors as <dapo/loss.hpp>; see <dapo/core/policy_loss/*.hpp> for the math of each loss.
// clip_cov draws with torch::randperm on the CPU, from the generator given (as verl does, and as the fused front end).
//
// Shapes: B = responses, T = response tokens. logp, old_logp, mask [B, T]; advantages [B] or [B, T].
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <algorithm>
#include <tuple>

#include "dapo/detail/loss_tensors.hpp"

namespace dapo {
namespace detail {

// One loss's per-token terms as tensor ops, verl's formulas as verl writes them (core_algos.py), so autograd
// differentiates them: pg [B, T] (weighted), and the flags and terms of the metrics.
struct CompositeTerms {
  torch::Tensor pg, clipped, lower, kl;  // kl: the per-token term of ppo_kl
};

inline CompositeTerms composite_terms(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                      const torch::Tensor& advantage, const torch::Tensor& mask,
                                      const PolicyLossOptions& options, const at::Generator& generator) {
  const torch::Tensor raw_log_ratio = logp - old_logp;
  const torch::Tensor log_ratio = raw_log_ratio.clamp(-20.0, 20.0);
  const torch::Tensor ratio = log_ratio.exp();
  const double low = 1.0 - options.clip_low, high = 1.0 + options.clip_high;
  const torch::Tensor no = torch::zeros_like(logp, logp.options().dtype(torch::kBool));
  switch (options.mode) {
    case PolicyLossMode::kVanilla: {
      const torch::Tensor unclipped = -advantage * (options.delta > 0.0 ? ratio.clamp_max(options.delta) : ratio);
      const torch::Tensor clipped = -advantage * ratio.clamp(low, high);
      torch::Tensor per_token = torch::maximum(unclipped, clipped);  // [B, T]
      const torch::Tensor clip_flags = clipped > unclipped;
      torch::Tensor dual_flags = no;
      if (options.dual_clip > 0.0) {
        const torch::Tensor cap = -advantage * options.dual_clip;
        const torch::Tensor negative = (advantage < 0).expand_as(per_token);
        dual_flags = (per_token > cap) & negative;
        per_token = torch::where(negative, torch::minimum(per_token, cap), per_token);
      }
      return {per_token, clip_flags, dual_flags, -log_ratio};
    }
    case PolicyLossMode::kGspo: {
      const torch::Tensor rows_tokens = mask.sum(1).clamp_min(1.0);
      const torch::Tensor row_log_ratio = (raw_log_ratio * mask).sum(1) / rows_tokens;
      const torch::Tensor seq_ratio =
          (logp - logp.detach() + row_log_ratio.detach().unsqueeze(1)).clamp_max(10.0).exp();
      const torch::Tensor unclipped = -advantage * seq_ratio;
      const torch::Tensor clipped = -advantage * seq_ratio.clamp(low, high);
      return {torch::maximum(unclipped, clipped), clipped > unclipped, no, -raw_log_ratio};
    }
    case PolicyLossMode::kSapo: {
      const torch::Tensor tau = torch::where(advantage > 0, torch::full_like(advantage, options.tau_pos),
                                             torch::full_like(advantage, options.tau_neg));
      const torch::Tensor gates = torch::sigmoid(tau * (ratio - 1.0)) * (4.0 / tau);
      return {-gates * advantage, no, no, -log_ratio};
    }
    case PolicyLossMode::kCispo: {
      const torch::Tensor weight = ratio.clamp(low, high).detach();
      return {-weight * advantage * logp, ratio != weight, no, -log_ratio};
    }
    case PolicyLossMode::kDppoTv:
    case PolicyLossMode::kDppoKl: {
      const torch::Tensor truncated = ratio.clamp_max(options.ratio_cap).detach();
      const torch::Tensor prob = logp.detach().exp(), old_prob = old_logp.exp();
      torch::Tensor valid_positive, valid_negative;
      if (options.mode == PolicyLossMode::kDppoTv) {
        valid_positive = (prob - old_prob) <= options.clip_high;
        valid_negative = (prob - old_prob) >= -options.clip_low;
      } else {
        const torch::Tensor kl = old_prob * (old_logp - logp.detach()) +
                                 (1.0 - old_prob) * ((1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)).log();
        valid_positive = (kl <= options.clip_high) | (prob <= old_prob);
        valid_negative = (kl <= options.clip_low) | (prob >= old_prob);
      }
      const torch::Tensor valid = torch::where(advantage > 0, valid_positive, valid_negative).to(logp.scalar_type());
      return {-advantage * truncated * logp * valid, valid == 0, (ratio > options.ratio_cap) & (valid != 0),
              -log_ratio};
    }
    case PolicyLossMode::kDro:
      return {-(logp * advantage - 0.5 * options.dro_beta * raw_log_ratio.square()), no, no, -raw_log_ratio};
    case PolicyLossMode::kGpg:
      return {-logp * advantage, no, no, -log_ratio};
    case PolicyLossMode::kKlCov: {
      const torch::Tensor full_advantage = advantage.expand_as(logp);
      const torch::Tensor raw_ratio = raw_log_ratio.exp();
      torch::Tensor pg = -full_advantage * raw_ratio;
      const torch::Tensor valid = (mask > 0).reshape(-1).nonzero().reshape(-1);
      if (valid.numel() > 0) {
        const torch::Tensor a = full_advantage.detach().reshape(-1).index_select(0, valid);
        const torch::Tensor l = logp.detach().reshape(-1).index_select(0, valid);
        const torch::Tensor cov = (a - a.mean()) * (l - l.mean());
        const auto count =
            std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(valid.numel()) * options.kl_cov_ratio));
        const torch::Tensor chosen = valid.index_select(0, std::get<1>(cov.topk(count)));
        const torch::Tensor flags = torch::zeros({logp.numel()}, logp.options().dtype(torch::kBool))
                                        .index_fill(0, chosen, true)
                                        .reshape(logp.sizes());
        pg = torch::where(flags, pg + options.ppo_kl_coef * raw_log_ratio.abs(), pg);
      }
      return {pg, no, no, raw_log_ratio.abs()};
    }
    case PolicyLossMode::kClipCov: {
      const torch::Tensor full_advantage = advantage.expand_as(logp);
      const torch::Tensor raw_ratio = raw_log_ratio.exp();
      const torch::Tensor unclipped = -full_advantage * raw_ratio;
      const torch::Tensor clipped = -full_advantage * raw_ratio.clamp(low, high);
      const torch::Tensor by_origin = (clipped > unclipped) & (mask > 0);
      const torch::Tensor count = mask.sum() + options.count_epsilon;
      const torch::Tensor cov = ((full_advantage - (full_advantage * mask).sum() / count) *
                                 (logp.detach() - (logp.detach() * mask).sum() / count))
                                    .masked_fill(mask == 0, -INFINITY)
                                    .masked_fill(by_origin, -INFINITY);
      const torch::Tensor candidates =
          ((cov < options.clip_cov_ub) & (cov > options.clip_cov_lb) & (mask > 0)).reshape(-1).nonzero().reshape(-1);
      torch::Tensor keep = torch::ones({logp.numel()}, logp.options().dtype(logp.scalar_type()));
      if (candidates.numel() > 0) {
        const auto clip_num =
            std::max<int64_t>(static_cast<int64_t>(options.clip_cov_ratio * mask.sum().item<double>()), 1);
        const at::Generator source = generator.defined() ? generator : at::detail::getDefaultCPUGenerator();
        const torch::Tensor order =
            torch::randperm(candidates.numel(), source, torch::TensorOptions().dtype(torch::kLong));
        const torch::Tensor chosen =
            candidates.index_select(0, order.narrow(0, 0, std::min(clip_num, candidates.numel())).to(logp.device()));
        keep = keep.index_fill(0, chosen, 0.0);
      }
      keep = keep.reshape(logp.sizes());
      return {torch::maximum(unclipped, clipped) * keep, keep == 0, no, -raw_log_ratio};
    }
    default:
      DAPO_REQUIRE(false, "dapo::reference::policy_loss", "the ", policy_loss_name(options.mode),
                   " loss has no composite here");
      return {};
  }
}

// geo_mean as verl writes it: a loss per row, the plain mean over rows (or / global_row_count).
inline PolicyLossOutput composite_geo_mean(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                           const torch::Tensor& advantage, const torch::Tensor& mask,
                                           const torch::Tensor& weights, const PolicyLossOptions& options) {
  const torch::Tensor log_ratio = logp - old_logp;
  const torch::Tensor sign = advantage.expand_as(logp).sign();
  const torch::Tensor clamped = log_ratio.clamp(-options.clip_low, options.clip_high);
  const torch::Tensor pessimistic = sign * torch::minimum(sign * log_ratio, sign * clamped);
  const torch::Tensor row_tokens = mask.sum(1) + options.count_epsilon;
  const torch::Tensor nonempty = mask.sum(1) > 0;
  const auto row_mean = [&](const torch::Tensor& values) {
    return torch::where(nonempty, (values * mask).sum(1) / row_tokens, torch::zeros_like(row_tokens));
  };
  torch::Tensor pg = -row_mean(advantage.expand_as(logp)) * row_mean(pessimistic).exp();
  if (weights.defined()) pg = pg * row_mean((weights + 1e-10).log()).exp();
  const double rows = options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(logp.size(0));
  const torch::Tensor loss = rows > 0.0 ? pg.sum() / rows : pg.sum() * 0.0;
  torch::NoGradGuard no_grad;
  const torch::Tensor count = mask.sum().clamp_min(1.0) + options.count_epsilon;
  const torch::Tensor clipped = log_ratio != clamped;
  const auto masked_mean = [&](const torch::Tensor& values) {
    return (values.to(logp.scalar_type()) * mask).sum() / count;
  };
  return {loss, masked_mean(clipped & (advantage > 0)), masked_mean(clipped & (advantage < 0)),
          masked_mean(-log_ratio.detach())};
}

// The loss and its aggregation as a chain of tensor ops (autograd differentiates it). weights: [B, T] or undefined.
inline PolicyLossOutput composite_policy_loss(const torch::Tensor& logp_in, const torch::Tensor& old_logp_in,
                                              const torch::Tensor& advantages, const torch::Tensor& mask,
                                              const PolicyLossOptions& options, const torch::Tensor& loss_weights = {},
                                              const at::Generator& generator = {}) {
  // bfloat16 / float16 inputs are computed in float32: token counts and sums need more than 8 or 11 mantissa bits.
  const bool reduced = logp_in.scalar_type() == torch::kBFloat16 || logp_in.scalar_type() == torch::kHalf;
  const auto compute_type = reduced ? torch::kFloat32 : logp_in.scalar_type();
  const torch::Tensor advantage =
      (advantages.dim() == 1 ? advantages.detach().unsqueeze(1) : advantages.detach()).to(compute_type);
  const torch::Tensor logp = logp_in.to(compute_type), old_logp = old_logp_in.detach().to(compute_type);
  const torch::Tensor weights = mask.to(compute_type);  // [B, T] of 0/1
  const torch::Tensor token_weights = loss_weights.defined() ? loss_weights.detach().to(compute_type) : loss_weights;
  if (options.mode == PolicyLossMode::kGeoMean) {
    return composite_geo_mean(logp, old_logp, advantage, weights, token_weights, options);
  }
  const CompositeTerms terms = composite_terms(logp, old_logp, advantage, weights, options, generator);
  torch::Tensor per_token = terms.pg;
  if (token_weights.defined()) per_token = per_token * token_weights;
  const torch::Tensor& clip_flags = terms.clipped;
  const torch::Tensor& dual_flags = terms.lower;

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
      const torch::Tensor row_mean_sum =
          (masked.sum(1) / (row_tokens.clamp_min(1.0) + options.count_epsilon) * nonempty).sum();
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
    case LossAggregation::kTokenSum:
      loss = masked.sum();
      break;
  }

  torch::NoGradGuard no_grad;
  auto masked_mean = [&](const torch::Tensor& values) {
    return (values.to(per_token.scalar_type()) * weights).sum() / (safe_count + options.count_epsilon);
  };
  return {loss, masked_mean(clip_flags), masked_mean(dual_flags), masked_mean(terms.kl.detach())};
}

}  // namespace detail

namespace reference {

// weights: [B, T] per-token weights of the loss (verl's rollout_is_weights), or undefined.
inline PolicyLossOutput policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                    const torch::Tensor& advantages, const torch::Tensor& mask,
                                    const PolicyLossOptions& options, const torch::Tensor& weights,
                                    const at::Generator& generator = {}) {
  constexpr const char* kWhere = "dapo::reference::policy_loss";
  detail::check_policy_loss_inputs(logp, old_logp, advantages, mask, options, kWhere, weights);
  detail::check_policy_loss_data(mask, options, kWhere);
  return detail::composite_policy_loss(logp, old_logp, advantages, mask, options, weights, generator);
}

// Without per-token weights.
inline PolicyLossOutput policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                    const torch::Tensor& advantages, const torch::Tensor& mask,
                                    const PolicyLossOptions& options = {}) {
  return policy_loss(logp, old_logp, advantages, mask, options, torch::Tensor());
}

}  // namespace reference
}  // namespace dapo
