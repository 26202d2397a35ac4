// verl's "gpg" policy loss (GPG, Group Policy Gradient; verl core_algos.compute_policy_loss_gpg): the plain policy
// gradient, no ratio and no clip. Per token: pg = -logp * A; d pg / d logp = -A. verl reports no metric for it; dapo
// reports the log-ratio's mean as ppo_kl all the same (clamped as vanilla's), and no clipping.
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

struct GpgToken {
  static constexpr bool kRowLogRatio = false;
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>&) {
    const V zero = Math::splat(0.0);
    const BoundedRatio<Math> r = bounded_ratio<Math>(in.logp - in.old_logp);
    return {(zero - in.logp) * in.advantage, zero - in.advantage, zero, zero, zero - r.bounded};
  }
};

}  // namespace dapo::detail
