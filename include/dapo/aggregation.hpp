// The aggregation weights of a policy loss on LibTorch tensors (<dapo/core/aggregation_weights.hpp> has the
// definition): w [B, T] with (w * X).sum() = any per-token term X aggregated as dapo::policy_loss aggregates its
// losses, micro-batch shares included. For a KL loss or an entropy term beside the policy loss:
//   const auto w = dapo::aggregation_weights(mask, share_options);   // share_options from micro_batch_options
//   loss = out.loss + kl_coef * (w * dapo::kl_penalty(logp, ref_logp, "low_var_kl")).sum()
//                   - entropy_coeff * (w * entropy).sum();
// Not differentiable (a function of the mask); computed on the CPU in double, returned in `dtype` on mask's device.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <span>

#include "dapo/core/aggregation_weights.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

inline torch::Tensor aggregation_weights(const torch::Tensor& mask, const PolicyLossOptions& options,
                                         torch::ScalarType dtype = torch::kFloat32) {
  constexpr const char* kWhere = "dapo::aggregation_weights";
  detail::check_defined(mask, "mask", kWhere);
  detail::check_dim(mask, 2, "mask", kWhere);
  DAPO_REQUIRE(mask.scalar_type() == torch::kBool || mask.is_floating_point(), kWhere, "mask has dtype ",
               mask.scalar_type(), ", expected bool or floating");
  const torch::NoGradGuard no_grad;
  const torch::Tensor m = mask.to(torch::kCPU).to(torch::kFloat64).contiguous();
  torch::Tensor weights = torch::empty_like(m);
  core::aggregation_weights<double, double>(std::span<const double>(m.data_ptr<double>(), m.numel()), m.size(0),
                                            m.size(1), options,
                                            std::span<double>(weights.data_ptr<double>(), weights.numel()));
  return weights.to(dtype).to(mask.device());
}

}  // namespace dapo
