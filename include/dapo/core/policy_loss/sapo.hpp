// verl's "sapo" policy loss (SAPO, arXiv 2511.20347; verl core_algos.compute_policy_loss_sapo): a soft gate on the
// token's ratio instead of a hard clip. Per token, ratio = exp(clamp(logp - old_logp, -20, 20)),
//   tau = tau_pos where A > 0, else tau_neg;   gate = sigmoid(tau * (ratio - 1)) * 4 / tau;   pg = -gate * A
// d pg / d logp = -A * 4 * sigmoid * (1 - sigmoid) * ratio. verl aggregates it with seq-mean-token-mean whatever
// loss_agg_mode says (dapo::verl_aggregation).
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

struct SapoToken {
  static constexpr bool kRowLogRatio = false;
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>& p) {
    const V zero = Math::splat(0.0), one = Math::splat(1.0), four = Math::splat(4.0);
    const BoundedRatio<Math> r = bounded_ratio<Math>(in.logp - in.old_logp);
    const V tau = Math::select(in.advantage > zero, p.tau_pos, p.tau_neg);
    const V sigmoid = one / (one + exp_any<Math>(zero - tau * (r.ratio - one)));
    const V gate = sigmoid * (four / tau);
    const V loss = zero - gate * in.advantage;
    const V grad = zero - in.advantage * (four * sigmoid * (one - sigmoid) * r.derivative);
    return {loss, grad, zero, zero, zero - r.bounded};
  }
};

}  // namespace dapo::detail
