// verl's "dro" policy loss (Direct Reward Optimization's quadratic log-ratio penalty; verl
// core_algos.compute_policy_loss_dro). Per token, with r = logp - old_logp (not clamped):
//   pg = -(logp * A - dro_beta / 2 * r^2);   d pg / d logp = -(A - dro_beta * r)
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

struct DroToken {
  static constexpr bool kRowLogRatio = false;
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>& p) {
    const V zero = Math::splat(0.0);
    const V r = in.logp - in.old_logp;
    const V loss = zero - (in.logp * in.advantage - Math::splat(0.5) * p.dro_beta * (r * r));
    const V grad = zero - (in.advantage - p.dro_beta * r);
    return {loss, grad, zero, zero, zero - r};
  }
};

}  // namespace dapo::detail
