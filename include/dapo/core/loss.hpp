// The DAPO policy-gradient loss (Eq. 8 with Clip-Higher, Eq. 10, and the other aggregations for comparison) on plain
// buffers: loss, metrics and d loss / d logp in one pass. No LibTorch here; <dapo/loss.hpp> is the tensor front end.
//
// Shapes: B = rows (responses), T = cols (response tokens, right-padded); every [B, T] buffer is row-major.
//   logp, old_logp, mask [B, T]; advantages [B] (one per response, broadcast over tokens) or [B, T].
//
// Per token (verl core_algos.compute_policy_loss_vanilla, which follows Eq. 8):
//   ratio = exp(clamp(logp - old_logp, -20, 20))
//   pg    = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
//   pg    = min(pg, -A * dual_clip)            only where A < 0 and dual_clip > 0 (dual-clip PPO)
// The aggregation turns pg [B, T] into one number; every mode is a per-row weight w_b times the masked token sum,
// loss = sum_b w_b * sum_t mask[b,t] * pg[b,t], which is what lets one pass produce the loss and its gradient.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "dapo/core/error.hpp"

namespace dapo {

// How per-token losses become the scalar loss. Explicit, never implied (verl: loss_agg_mode; TRL: loss_type).
enum class LossAggregation {
  kTokenMean,           // DAPO Eq. 8/12: sum over all tokens of the batch / token count ("token-mean", TRL "dapo")
  kGroupTokenMean,      // per group of group_size rows: token sum / token count, then mean over groups (seed, literal Eq. 8)
  kSeqMeanTokenMean,    // GRPO: mean over responses of the response's token mean ("seq-mean-token-mean", TRL "grpo")
  kSeqMeanTokenSum,     // mean over responses of the response's token sum ("seq-mean-token-sum")
  kSeqMeanTokenSumNorm  // Dr. GRPO: token sum / (norm_length * rows) ("seq-mean-token-sum-norm", TRL "dr_grpo")
};

struct PolicyLossOptions {
  double clip_low = 0.2, clip_high = 0.28;  // decoupled clip (Clip-Higher): epsilon_low, epsilon_high of Eq. 10
  double dual_clip = 0.0;                   // c > 1 bounds the loss of A < 0 tokens at -A*c; 0 disables
  LossAggregation aggregation = LossAggregation::kTokenMean;
  int64_t group_size = 0;             // required by kGroupTokenMean
  double norm_length = 0.0;           // kSeqMeanTokenSumNorm divisor per row; 0 means T
  double global_token_count = 0.0;    // kTokenMean over micro-batches or ranks: divide by this; 0 means mask.sum()
};

// verl's loss_agg_mode names.
constexpr std::array<std::pair<LossAggregation, std::string_view>, 5> kAggregationNames{{
    {LossAggregation::kTokenMean, "token-mean"},
    {LossAggregation::kGroupTokenMean, "group-token-mean"},
    {LossAggregation::kSeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAggregation::kSeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAggregation::kSeqMeanTokenSumNorm, "seq-mean-token-sum-norm"},
}};

inline std::string_view aggregation_name(LossAggregation aggregation) {
  for (const auto& [value, name] : kAggregationNames) {
    if (value == aggregation) return name;
  }
  DAPO_REQUIRE(false, "dapo::aggregation_name", "unknown LossAggregation value ", static_cast<int>(aggregation));
  return {};
}

inline LossAggregation aggregation_from_name(std::string_view name) {
  std::string known;
  for (const auto& [value, known_name] : kAggregationNames) {
    if (known_name == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(known_name);
  }
  DAPO_REQUIRE(false, "dapo::aggregation_from_name", "unknown loss aggregation '", name, "', expected one of ",
               known);
  return {};
}

namespace detail {

// The checks that need only the options and the batch height; both front ends call them.
inline void check_policy_loss_options(const PolicyLossOptions& options, int64_t rows, const char* where) {
  DAPO_REQUIRE(std::isfinite(options.clip_low) && options.clip_low >= 0.0 && options.clip_low <= 1.0, where,
               "clip_low is ", options.clip_low, ", expected a value in [0, 1] (the ratio's lower bound is 1 - clip_low)");
  DAPO_REQUIRE(std::isfinite(options.clip_high) && options.clip_high >= 0.0, where, "clip_high is ",
               options.clip_high, ", expected a finite value >= 0");
  DAPO_REQUIRE(options.dual_clip == 0.0 || (std::isfinite(options.dual_clip) && options.dual_clip > 1.0), where,
               "dual_clip is ", options.dual_clip, ", expected 0 (disabled) or a finite value > 1");
  DAPO_REQUIRE(std::isfinite(options.norm_length) && options.norm_length >= 0.0, where, "norm_length is ",
               options.norm_length, ", expected a finite value >= 0 (0 means T)");
  DAPO_REQUIRE(std::isfinite(options.global_token_count) && options.global_token_count >= 0.0, where,
               "global_token_count is ", options.global_token_count, ", expected a finite value >= 0 (0 = local count)");
  DAPO_REQUIRE(options.global_token_count == 0.0 || options.aggregation == LossAggregation::kTokenMean, where,
               "global_token_count is ", options.global_token_count, " but aggregation is ",
               aggregation_name(options.aggregation), "; a global token count only applies to token-mean");
  if (options.aggregation == LossAggregation::kGroupTokenMean) {
    DAPO_REQUIRE(options.group_size >= 1, where, "aggregation group-token-mean needs group_size >= 1, got ",
                 options.group_size);
    DAPO_REQUIRE(rows % options.group_size == 0, where, "batch has ", rows, " rows, which group_size = ",
                 options.group_size, " does not divide (group-token-mean)");
  }
}

// One token of the clipped objective: its loss, d loss / d logp, and which clips decided it. Derivatives follow
// autograd through clamp (gradient passes on [min, max] inclusive) and max/min (a tie splits the gradient in half),
// so results match a PyTorch composite bit for bit in the branch structure.
struct ClippedToken {
  double loss = 0.0;
  double grad = 0.0;
  bool clipped = false;       // -A * clamp(ratio) > -A * ratio: the trust region bound the update
  bool dual_clipped = false;  // A < 0 and the loss was capped at -A * dual_clip
};

inline ClippedToken clipped_token(double logp, double old_logp, double advantage, double clip_low, double clip_high,
                                  double dual_clip) {
  constexpr double kLogRatioBound = 20.0;
  const double log_ratio = logp - old_logp;
  const bool log_ratio_inside = log_ratio >= -kLogRatioBound && log_ratio <= kLogRatioBound;
  const double ratio = std::exp(log_ratio_inside ? log_ratio : std::clamp(log_ratio, -kLogRatioBound, kLogRatioBound));
  const double d_ratio = log_ratio_inside ? ratio : 0.0;

  const double low = 1.0 - clip_low, high = 1.0 + clip_high;
  const bool ratio_inside = ratio >= low && ratio <= high;
  const double unclipped_loss = -advantage * ratio;
  const double clipped_loss = -advantage * std::clamp(ratio, low, high);
  const double unclipped_grad = -advantage * d_ratio;
  const double clipped_grad = ratio_inside ? unclipped_grad : 0.0;

  ClippedToken token;
  token.clipped = clipped_loss > unclipped_loss;
  if (token.clipped) {
    token.loss = clipped_loss;
    token.grad = clipped_grad;
  } else {
    token.loss = unclipped_loss;
    token.grad = unclipped_loss > clipped_loss ? unclipped_grad : 0.5 * (unclipped_grad + clipped_grad);
  }
  if (dual_clip > 0.0 && advantage < 0.0) {
    const double cap = -advantage * dual_clip;
    token.dual_clipped = token.loss > cap;
    if (token.dual_clipped) {
      token.loss = cap;
      token.grad = 0.0;
    } else if (token.loss == cap) {
      token.grad *= 0.5;
    }
  }
  return token;
}

template <std::floating_point T>
double masked_row_count(const T* mask_row, int64_t cols, const char* where, int64_t row) {
  double count = 0.0;
  for (int64_t t = 0; t < cols; ++t) {
    const T value = mask_row[t];
    DAPO_REQUIRE(value == T(0) || value == T(1), where, "mask[", row, ", ", t, "] is ", value,
                 ", expected 0 or 1");
    count += static_cast<double>(value);
  }
  return count;
}

}  // namespace detail

namespace core {

struct PolicyLossResult {
  double loss = 0.0;
  double clip_fraction = 0.0;       // share of masked tokens where the (decoupled) clip bound the loss
  double dual_clip_fraction = 0.0;  // share of masked tokens capped by the dual clip (0 when dual_clip = 0)
  double approx_kl = 0.0;           // masked mean of old_logp - logp (log-ratio clamped to [-20, 20])
  double token_count = 0.0;         // mask.sum() of this call
};

// logp, old_logp, mask [B, T]; advantages [B] or [B, T]; grad_logp [B, T] or empty (then no gradient is written).
// Accumulates in double. With no masked token at all the loss, the metrics and the gradient are 0, except under
// kGroupTokenMean, where every group must hold a token (an empty group has no mean).
template <std::floating_point T>
PolicyLossResult policy_loss(std::span<const T> logp, std::span<const T> old_logp, std::span<const T> advantages,
                             std::span<const T> mask, int64_t rows, int64_t cols, const PolicyLossOptions& options = {},
                             std::span<T> grad_logp = {}) {
  constexpr const char* kWhere = "dapo::core::policy_loss";
  DAPO_REQUIRE(rows >= 0 && cols >= 0, kWhere, "shape [", rows, ", ", cols, "] has a negative extent");
  const auto size = static_cast<std::size_t>(rows * cols);
  DAPO_REQUIRE(logp.size() == size, kWhere, "logp has ", logp.size(), " elements, expected B * T = ", rows, " * ",
               cols);
  DAPO_REQUIRE(old_logp.size() == size, kWhere, "old_logp has ", old_logp.size(), " elements but logp has ", size);
  DAPO_REQUIRE(mask.size() == size, kWhere, "mask has ", mask.size(), " elements but logp has ", size);
  DAPO_REQUIRE(advantages.size() == static_cast<std::size_t>(rows) || advantages.size() == size, kWhere,
               "advantages has ", advantages.size(), " elements, expected B = ", rows, " or B * T = ", size);
  DAPO_REQUIRE(grad_logp.empty() || grad_logp.size() == size, kWhere, "grad_logp has ", grad_logp.size(),
               " elements, expected 0 (no gradient) or ", size);
  detail::check_policy_loss_options(options, rows, kWhere);
  const bool per_token_advantage = advantages.size() == size && cols != 1;
  const int64_t group_size = options.aggregation == LossAggregation::kGroupTokenMean ? options.group_size : 1;

  // Pass 1 over the mask: token totals, non-empty rows, and every group non-empty under kGroupTokenMean.
  double token_count = 0.0;
  int64_t nonempty_rows = 0;
  for (int64_t group_start = 0; group_start < rows; group_start += group_size) {
    double group_tokens = 0.0;
    for (int64_t b = group_start; b < group_start + group_size; ++b) {
      const double row_tokens = detail::masked_row_count(mask.data() + b * cols, cols, kWhere, b);
      group_tokens += row_tokens;
      nonempty_rows += row_tokens > 0.0;
    }
    DAPO_REQUIRE(options.aggregation != LossAggregation::kGroupTokenMean || group_tokens > 0.0, kWhere, "group ",
                 group_start / group_size, " (rows ", group_start, "..", group_start + group_size - 1,
                 ") has no masked token; group-token-mean is undefined for it");
    token_count += group_tokens;
  }
  DAPO_REQUIRE(options.global_token_count == 0.0 || options.global_token_count >= token_count, kWhere,
               "global_token_count is ", options.global_token_count, " but this batch alone holds ", token_count,
               " masked tokens");

  // Pass 2: per-row weight of the aggregation, then the tokens.
  PolicyLossResult result;
  result.token_count = token_count;
  double clipped = 0.0, dual_clipped = 0.0, kl_sum = 0.0;
  const double norm_length = options.norm_length > 0.0 ? options.norm_length : static_cast<double>(cols);
  const int64_t num_groups = rows / group_size;
  double group_tokens = 0.0;
  for (int64_t b = 0; b < rows; ++b) {
    const T* mask_row = mask.data() + b * cols;
    double row_weight = 0.0;
    switch (options.aggregation) {
      case LossAggregation::kTokenMean: {
        const double denominator = options.global_token_count > 0.0 ? options.global_token_count : token_count;
        row_weight = denominator > 0.0 ? 1.0 / denominator : 0.0;
        break;
      }
      case LossAggregation::kGroupTokenMean:
        if (b % group_size == 0) {
          group_tokens = 0.0;
          for (int64_t r = b; r < b + group_size; ++r) {
            group_tokens += detail::masked_row_count(mask.data() + r * cols, cols, kWhere, r);
          }
        }
        row_weight = 1.0 / (group_tokens * static_cast<double>(num_groups));
        break;
      case LossAggregation::kSeqMeanTokenMean: {
        const double row_tokens = detail::masked_row_count(mask_row, cols, kWhere, b);
        row_weight = row_tokens > 0.0 ? 1.0 / (row_tokens * static_cast<double>(nonempty_rows)) : 0.0;
        break;
      }
      case LossAggregation::kSeqMeanTokenSum:
        row_weight = nonempty_rows > 0 ? 1.0 / static_cast<double>(nonempty_rows) : 0.0;
        break;
      case LossAggregation::kSeqMeanTokenSumNorm:
        row_weight = rows > 0 ? 1.0 / (norm_length * static_cast<double>(rows)) : 0.0;
        break;
    }
    double row_loss = 0.0;
    for (int64_t t = 0; t < cols; ++t) {
      const int64_t i = b * cols + t;
      if (mask_row[t] == T(0)) {
        if (!grad_logp.empty()) grad_logp[i] = T(0);
        continue;
      }
      const double advantage = static_cast<double>(per_token_advantage ? advantages[i] : advantages[b]);
      const double new_lp = static_cast<double>(logp[i]), old_lp = static_cast<double>(old_logp[i]);
      const detail::ClippedToken token =
          detail::clipped_token(new_lp, old_lp, advantage, options.clip_low, options.clip_high, options.dual_clip);
      row_loss += token.loss;
      if (!grad_logp.empty()) grad_logp[i] = static_cast<T>(row_weight * token.grad);
      clipped += token.clipped;
      dual_clipped += token.dual_clipped;
      kl_sum += -std::clamp(new_lp - old_lp, -20.0, 20.0);
    }
    result.loss += row_weight * row_loss;
  }
  if (token_count > 0.0) {
    result.clip_fraction = clipped / token_count;
    result.dual_clip_fraction = dual_clipped / token_count;
    result.approx_kl = kl_sum / token_count;
  }
  return result;
}

}  // namespace core
}  // namespace dapo
