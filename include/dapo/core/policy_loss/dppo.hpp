// verl's "dppo_tv" and "dppo_kl" policy losses (DPPO, arXiv 2602.04879; verl core_algos.compute_policy_loss_dppo_tv
// and _dppo_kl): a REINFORCE term on the tokens whose probability stayed inside a trust region, weighted by the
// truncated, detached ratio. Per token, p = exp(logp), q = exp(old_logp), ratio = exp(clamp(logp - old_logp, -20, 20)):
//   dppo_tv: valid = p - q <= clip_high where A > 0, p - q >= -clip_low elsewhere
//   dppo_kl: kl = q (old_logp - logp) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)) (binary KL);
//            valid = kl <= clip_high or p <= q where A > 0, kl <= clip_low or p >= q elsewhere
//   pg = -A * sg[min(ratio, ratio_cap)] * logp * valid;   d pg / d logp = -A * sg[min(ratio, ratio_cap)] * valid
// pg_clipfrac counts the invalid tokens, pg_clipfrac_lower the valid ones whose ratio the cap truncated.
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

template <bool kBinaryKl>
struct DppoToken {
  static constexpr bool kRowLogRatio = false;
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>& p) {
    const V zero = Math::splat(0.0), one = Math::splat(1.0);
    const BoundedRatio<Math> r = bounded_ratio<Math>(in.logp - in.old_logp);
    const V truncated = Math::select(r.ratio > p.ratio_cap, p.ratio_cap, r.ratio);
    const V prob = exp_any<Math>(in.logp), old_prob = exp_any<Math>(in.old_logp);
    V valid_positive, valid_negative;
    if constexpr (kBinaryKl) {
      const V epsilon = Math::splat(1e-8);
      const V kl = old_prob * (in.old_logp - in.logp) +
                   (one - old_prob) * Math::log((one - old_prob + epsilon) / (one - prob + epsilon));
      valid_positive = Math::select((kl <= p.clip_high) | (prob <= old_prob), one, zero);
      valid_negative = Math::select((kl <= p.clip_low) | (prob >= old_prob), one, zero);
    } else {
      const V moved = prob - old_prob;
      valid_positive = Math::select(moved <= p.clip_high, one, zero);
      valid_negative = Math::select(moved >= zero - p.clip_low, one, zero);
    }
    const V valid = Math::select(in.advantage > zero, valid_positive, valid_negative);
    const V weight = (zero - in.advantage) * truncated;
    const V capped = Math::select(r.ratio > p.ratio_cap, one, zero);
    return {weight * in.logp * valid, weight * valid, one - valid, capped * valid, zero - r.bounded};
  }
};

using DppoTvToken = DppoToken<false>;
using DppoKlToken = DppoToken<true>;

}  // namespace dapo::detail
