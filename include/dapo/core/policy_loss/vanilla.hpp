// verl's "vanilla" policy loss: PPO's clipped objective with DAPO's decoupled clip (Clip-Higher, Eq. 10) and the
// optional dual clip, per token (verl core_algos.compute_policy_loss_vanilla, which follows DAPO's Eq. 8):
//   ratio = exp(clamp(logp - old_logp, -20, 20))
//   pg    = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
//   pg    = min(pg, -A * dual_clip)            only where A < 0 and dual_clip > 0 (dual-clip PPO)
// With delta > 0 (TRL's two-sided clip, GRPOConfig.delta) the first term is -A * min(ratio, delta).
#pragma once

#include "dapo/core/policy_loss/token.hpp"

namespace dapo::detail {

// One token (or one SIMD register of tokens) of the clipped objective: its loss, d loss / d logp, and which clips
// decided it. The CUDA kernel calls it directly.
// kDelta: TRL's two-sided clip, the unclipped term's ratio capped at delta (its gradient 0 above it).
template <class Math, bool kDualClip, bool kDelta = false, class V = typename Math::Value>
DAPO_HOST_DEVICE DAPO_INLINE TokenTerms<V> clipped_token(const V& log_ratio, const V& advantage, const V& low,
                                                         const V& high, const V& dual_clip, const V& delta = V{}) {
  const V zero = Math::splat(0.0), one = Math::splat(1.0);
  const BoundedRatio<Math> r = bounded_ratio<Math>(log_ratio);
  const V clamped_ratio = Math::select(r.ratio < low, low, Math::select(r.ratio > high, high, r.ratio));
  V unclipped_ratio = r.ratio, unclipped_derivative = r.derivative;
  if constexpr (kDelta) {
    const auto over = r.ratio > delta;
    unclipped_ratio = Math::select(over, delta, r.ratio);
    unclipped_derivative = Math::select(over, zero, r.derivative);
  }
  const V unclipped_loss = zero - advantage * unclipped_ratio;
  const V clipped_loss = zero - advantage * clamped_ratio;
  const auto clipped = clipped_loss > unclipped_loss;
  // max(unclipped, clipped) and its derivative. Where the clipped term wins, the ratio lies strictly outside
  // [low, high], so clamp passes no gradient; everywhere else the unclipped derivative is the answer, ties included
  // (inside the interval both terms are equal with equal derivatives; with A = 0 the derivative is 0 anyway).
  V loss = Math::select(clipped, clipped_loss, unclipped_loss);
  V grad = Math::select(clipped, zero, zero - advantage * unclipped_derivative);
  V dual_clipped = zero;
  if constexpr (kDualClip) {
    const V cap = zero - advantage * dual_clip;
    const auto negative = advantage < zero;
    const auto capped = negative & (loss > cap);
    grad = Math::select(capped, zero, Math::select(negative & (loss == cap), Math::splat(0.5) * grad, grad));
    loss = Math::select(capped, cap, loss);
    dual_clipped = Math::select(capped, one, zero);
  }
  return {loss, grad, Math::select(clipped, one, zero), dual_clipped, zero - r.bounded};
}

template <bool kDualClip, bool kDelta = false>
struct VanillaToken {
  static constexpr bool kRowLogRatio = false;
  template <class Math, class V = typename Math::Value>
  DAPO_HOST_DEVICE DAPO_INLINE static TokenTerms<V> terms(const TokenInputs<V>& in, const TokenParams<V>& p) {
    return clipped_token<Math, kDualClip, kDelta>(in.logp - in.old_logp, in.advantage, p.low, p.high, p.dual_clip,
                                                  p.delta);
  }
};

}  // namespace dapo::detail
