// verl's "cispo" policy loss (CISPO, MiniMax-M1, arXiv 2506.13585; verl core_algos.compute_policy_loss_cispo): a
// REINFORCE term weighted by the clipped, detached importance ratio, so every token keeps a gradient. Per token,
//   ratio = exp(clamp(logp - old_logp, -20, 20));   w = sg[clamp(ratio, 1 - clip_low, 1 + clip_high)]
//   pg    = -w * A * logp;   d pg / d logp = -w * A
// pg_clipfrac counts the tokens whose ratio the clamp moved.
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

struct CispoToken {
  static constexpr bool kRowLogRatio = false;
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>& p) {
    const V zero = Math::splat(0.0), one = Math::splat(1.0);
    const BoundedRatio<Math> r = bounded_ratio<Math>(in.logp - in.old_logp);
    const V weight = Math::select(r.ratio < p.low, p.low, Math::select(r.ratio > p.high, p.high, r.ratio));
    const V grad = (zero - weight) * in.advantage;
    return {grad * in.logp, grad, Math::select(r.ratio != weight, one, zero), zero, zero - r.bounded};
  }
};

}  // namespace dapo::detail
