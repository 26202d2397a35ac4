// What every per-token policy loss takes and gives, in the arithmetic of Math (<dapo/core/simd.hpp>: Scalar<double>,
// Scalar<float>, FloatVector), so the same function runs in the CPU kernel's SIMD lanes and in CUDA threads.
//
// Derivatives follow autograd through clamp (the gradient passes on [min, max] inclusive), max/min (a tie splits it in
// half) and detach (none passes), so they equal those of verl's PyTorch code. Every branch is a select.
#pragma once

#include "dapo/core/simd.hpp"

namespace dapo::detail {

template <class V>
struct TokenTerms {
  V loss, grad;    // the token's loss and d loss / d logp
  V clipped;       // 1 where the loss's trust region acted (verl's pg_clipfrac counts these)
  V dual_clipped;  // 1 for verl's pg_clipfrac_lower: the dual clip (vanilla), the ratio cap (dppo)
  V kl;            // the token's term of verl's ppo_kl metric (old_logp - logp, clamped as the loss clamps it)
};

template <class V>
struct TokenInputs {
  V logp, old_logp, advantage;
  V row_log_ratio;  // gspo: the row's mean log-ratio (0 for the others)
};

// The options, splatted once per row.
template <class V>
struct TokenParams {
  V low, high;            // the ratio's clip interval [1 - clip_low, 1 + clip_high]
  V clip_low, clip_high;  // as given: dppo's divergence bounds
  V dual_clip, ratio_cap, tau_pos, tau_neg, dro_beta;
  V delta;  // vanilla's two-sided clip (TRL); 0: off
};

// exp(clamp(x, -20, 20)), the ratio of verl's losses, whose log-ratio is clamped "for stability", and its derivative
// in x: the ratio inside [-20, 20], 0 outside (where clamp passes no gradient).
template <class Math, class V = typename Math::Value>
struct BoundedRatio {
  V ratio, bounded, derivative;
};

template <class Math, class V = typename Math::Value>
DAPO_HOST_DEVICE DAPO_INLINE BoundedRatio<Math> bounded_ratio(const V& log_ratio) {
  const V bound = Math::splat(20.0), zero = Math::splat(0.0);
  const auto inside = (log_ratio >= -bound) & (log_ratio <= bound);
  const V bounded = Math::select(log_ratio < -bound, -bound, Math::select(log_ratio > bound, bound, log_ratio));
  const V ratio = Math::exp(bounded);  // NaN stays NaN
  return {ratio, bounded, Math::select(inside, ratio, zero)};
}

// exp of any x: FloatVector's exp holds on [-87, 88] only, so x is clamped there first (exp(-87) ~ 1.6e-38 stands
// for every smaller value, which float could not tell from 0 in any sum with a number near 1).
template <class Math, class V = typename Math::Value>
DAPO_HOST_DEVICE DAPO_INLINE V exp_any(const V& x) {
  const V low = Math::splat(Math::kExpLow), high = Math::splat(Math::kExpHigh);
  return Math::exp(Math::select(x < low, low, Math::select(x > high, high, x)));
}

}  // namespace dapo::detail
