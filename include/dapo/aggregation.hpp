// The aggregation weights of a policy loss on LibTorch tensors (<dapo/core/aggregation_weights.hpp> has the
// definition): w [B, T] with (w * X).sum() = any per-token term X aggregated as dapo::policy_loss aggregates its
// losses, micro-batch shares included. For a KL loss or an entropy term beside the policy loss:
//   const auto w = dapo::aggregation_weights(mask, share_options);   // share_options from micro_batch_options
//   loss = out.loss + kl_coef * (w * dapo::kl_penalty(logp, ref_logp, "low_var_kl")).sum()
//                   - entropy_coeff * (w * entropy).sum();
// Not differentiable (a function of the mask); computed on the CPU in double, returned in `dtype` on mask's device.
//
// agg_loss is verl's agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info) on tensors
// (<dapo/core/agg_loss.hpp> has the definition): differentiable in loss_mat, whose masked-out entries are never read.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <span>

#include "dapo/core/agg_loss.hpp"
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

// loss_mat [B, T] floating; loss_mask [B, T] bool or floating 0/1 -> the scalar loss, loss_mat's dtype and device.
// The loss is linear in loss_mat: it is sum(w * loss_mat) over the masked tokens, w the weights core::agg_loss gives
// as its gradient (computed on the CPU in double from the mask).
inline torch::Tensor agg_loss(const torch::Tensor& loss_mat, const torch::Tensor& loss_mask, LossAggregation mode,
                              const AggLossOptions& options = {}) {
  constexpr const char* kWhere = "dapo::agg_loss";
  detail::check_floating(loss_mat, "loss_mat", kWhere);
  detail::check_dim(loss_mat, 2, "loss_mat", kWhere);
  detail::check_defined(loss_mask, "loss_mask", kWhere);
  DAPO_REQUIRE(loss_mask.sizes() == loss_mat.sizes(), kWhere, "loss_mask has shape ", detail::shape_of(loss_mask),
               " but loss_mat has ", detail::shape_of(loss_mat));
  DAPO_REQUIRE(loss_mask.scalar_type() == torch::kBool || loss_mask.is_floating_point(), kWhere, "loss_mask has dtype ",
               loss_mask.scalar_type(), ", expected bool or floating");
  detail::check_same_device(loss_mask, loss_mat, "loss_mask", "loss_mat", kWhere);
  torch::Tensor weights;
  {
    const torch::NoGradGuard no_grad;
    const torch::Tensor m = loss_mask.to(torch::kCPU).to(torch::kFloat64).contiguous();
    const torch::Tensor zeros = torch::zeros_like(m);
    weights = torch::empty_like(m);
    const auto values = [](const torch::Tensor& t) { return std::span<const double>(t.data_ptr<double>(), t.numel()); };
    core::agg_loss<double>(values(zeros), values(m), m.size(0), m.size(1), mode, options,
                           std::span<double>(weights.data_ptr<double>(), weights.numel()));
    weights = weights.to(loss_mat.scalar_type()).to(loss_mat.device());
  }
  const torch::Tensor kept = torch::where(loss_mask.to(torch::kBool), loss_mat, torch::zeros_like(loss_mat));
  return (kept * weights).sum();
}

}  // namespace dapo
