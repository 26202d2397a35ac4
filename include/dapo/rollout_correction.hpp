// Rollout correction on LibTorch tensors: verl's IS weights and rejection masks (<dapo/core/rollout_correction.hpp>
// has the definitions) for log_ratio = logp_train - logp_rollout [B, T] and the response mask [B, T]. Not
// differentiable (the weights are detached in verl too): computed on the CPU in double, returned in log_ratio's dtype
// and device. The weights go to dapo::policy_loss as its per-token weights; the kept mask replaces the response mask.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <map>
#include <span>
#include <string>
#include <vector>

#include "dapo/core/rollout_correction.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

struct RolloutCorrection {
  torch::Tensor values;                   // the weights, or the kept mask (0/1)
  std::map<std::string, double> metrics;  // verl's names, without the "rollout_corr/" prefix
};

namespace detail {

template <class Fn>
RolloutCorrection rollout_correction(const torch::Tensor& log_ratio, const torch::Tensor& response_mask,
                                     const char* where, const Fn& fn) {
  check_floating(log_ratio, "log_ratio", where);
  check_dim(log_ratio, 2, "log_ratio", where);
  check_defined(response_mask, "response_mask", where);
  DAPO_REQUIRE(response_mask.sizes() == log_ratio.sizes(), where, "response_mask has shape ", shape_of(response_mask),
               " but log_ratio has ", shape_of(log_ratio));
  const torch::NoGradGuard no_grad;
  const torch::Tensor ratio = log_ratio.to(torch::kCPU).to(torch::kFloat64).contiguous();
  const torch::Tensor mask = response_mask.to(torch::kCPU).to(torch::kFloat64).contiguous();
  torch::Tensor out = torch::empty_like(ratio);
  const auto span = [](const torch::Tensor& t) { return std::span<double>(t.data_ptr<double>(), t.numel()); };
  RolloutCorrection result;
  result.metrics = fn(std::span<const double>(span(ratio)), std::span<const double>(span(mask)), ratio.size(0),
                      ratio.size(1), span(out));
  result.values = out.to(log_ratio.scalar_type()).to(log_ratio.device());
  return result;
}

}  // namespace detail

inline RolloutCorrection rollout_is_weights(const torch::Tensor& log_ratio, const torch::Tensor& response_mask,
                                            const RolloutIsOptions& options) {
  return detail::rollout_correction(log_ratio, response_mask, "dapo::rollout_is_weights",
                                    [&](auto ratio, auto mask, int64_t rows, int64_t cols, std::span<double> out) {
                                      return core::rollout_is_weights<double>(ratio, mask, rows, cols, options, out);
                                    });
}

inline RolloutCorrection rollout_rejection_mask(const torch::Tensor& log_ratio, const torch::Tensor& response_mask,
                                                const std::vector<RolloutRsOption>& options) {
  return detail::rollout_correction(log_ratio, response_mask, "dapo::rollout_rejection_mask",
                                    [&](auto ratio, auto mask, int64_t rows, int64_t cols, std::span<double> out) {
                                      return core::rollout_rejection_mask<double>(ratio, mask, rows, cols, options,
                                                                                  out);
                                    });
}

}  // namespace dapo
