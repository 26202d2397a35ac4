// verl's "gspo" policy loss (GSPO, arXiv 2507.18071; verl core_algos.compute_policy_loss_gspo): vanilla's clip on a
// sequence-level ratio. Per row, s = sum_t mask * (logp - old_logp) / max(tokens, 1); per token
//   ratio = exp(min(s, 10)) (its value; its gradient is that of exp(logp - sg[logp] + sg[s]): ratio, where s <= 10)
//   pg    = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
// verl aggregates it with seq-mean-token-mean whatever loss_agg_mode says (dapo::verl_aggregation).
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

struct GspoToken {
  static constexpr bool kRowLogRatio = true;  // the kernel computes s per row first
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>& p) {
    const V zero = Math::splat(0.0), one = Math::splat(1.0), cap = Math::splat(10.0);
    const V s = in.row_log_ratio;
    const V ratio = exp_any<Math>(Math::select(s > cap, cap, s));
    const V inside = Math::select(s > cap, zero, one);  // clamp(max=10) passes the gradient up to 10 inclusive
    const V clamped_ratio = Math::select(ratio < p.low, p.low, Math::select(ratio > p.high, p.high, ratio));
    const V unclipped_loss = zero - in.advantage * ratio;
    const V clipped_loss = zero - in.advantage * clamped_ratio;
    const auto clipped = clipped_loss > unclipped_loss;
    const V loss = Math::select(clipped, clipped_loss, unclipped_loss);
    const V grad = Math::select(clipped, zero, zero - in.advantage * (ratio * inside));
    // verl's ppo_kl for gspo: the token's log-ratio, not clamped.
    return {loss, grad, Math::select(clipped, one, zero), zero, in.old_logp - in.logp};
  }
};

}  // namespace dapo::detail
