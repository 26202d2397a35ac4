// KL-penalty estimators on LibTorch tensors, differentiable with respect to logprob (and ref_logprob, if it requires
// grad): the per-token estimate of KL(pi_theta || pi_ref) that a KL loss masks, aggregates and scales by its
// coefficient (verl's actor.use_kl_loss / kl_loss_type, TRL's beta). The same math on plain buffers, and the
// estimators' definitions, are in <dapo/core/kl_penalty.hpp>; both give the numbers of verl's kl_penalty.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <string_view>

#include "dapo/core/kl_penalty.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

// logprob, ref_logprob: the same shape, floating, same device -> the estimate per element, logprob's shape. With a
// straight-through penalty ("k3+") the value is the estimator's and the gradient k2's.
inline torch::Tensor kl_penalty(const torch::Tensor& logprob, const torch::Tensor& ref_logprob,
                                const KlPenalty& penalty) {
  constexpr const char* kWhere = "dapo::kl_penalty";
  detail::check_floating(logprob, "logprob", kWhere);
  detail::check_floating(ref_logprob, "ref_logprob", kWhere);
  DAPO_REQUIRE(ref_logprob.sizes() == logprob.sizes(), kWhere, "ref_logprob has shape ", detail::shape_of(ref_logprob),
               " but logprob has ", detail::shape_of(logprob));
  detail::check_same_device(ref_logprob, logprob, "ref_logprob", "logprob", kWhere);

  const torch::Tensor d = logprob - ref_logprob;
  torch::Tensor estimate;
  switch (penalty.estimator) {
    case KlEstimator::kK1:
      estimate = d;
      break;
    case KlEstimator::kAbs:
      estimate = d.abs();
      break;
    case KlEstimator::kK2:
      estimate = 0.5 * d.square();
      break;
    case KlEstimator::kK3: {
      const torch::Tensor k = (ref_logprob - logprob).clamp(-20.0, 20.0);
      estimate = (k.exp() - k - 1.0).clamp(-10.0, 10.0);
      break;
    }
  }
  if (!penalty.straight_through || penalty.estimator == KlEstimator::kK2) return estimate;
  const torch::Tensor backward = 0.5 * d.square();
  return backward - backward.detach() + estimate.detach();
}

// By verl's name: "k1", "k3+", "low_var_kl", ... (parse_kl_penalty).
inline torch::Tensor kl_penalty(const torch::Tensor& logprob, const torch::Tensor& ref_logprob, std::string_view name) {
  return kl_penalty(logprob, ref_logprob, parse_kl_penalty(name));
}

}  // namespace dapo
