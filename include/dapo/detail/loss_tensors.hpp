// What the LibTorch policy losses share: the output struct and the checks at the boundary. <dapo/loss.hpp> (fused)
// and <dapo/reference/loss.hpp> (composite) both include it; users include one of those.
//
// Shapes: B = responses, T = response tokens. logp, old_logp, mask [B, T]; advantages [B] or [B, T].
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include "dapo/core/loss.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

struct PolicyLossOutput {
  torch::Tensor loss;                // differentiable in logp
  torch::Tensor clip_fraction;       // share of masked tokens where the loss's clip acted (verl's pg_clipfrac)
  torch::Tensor dual_clip_fraction;  // share capped by the dual clip or dppo's ratio cap (pg_clipfrac_lower)
  torch::Tensor approx_kl;           // masked mean of old_logp - logp (verl's ppo_kl; kl_cov: of |logp - old_logp|)
  // With PolicyLossOptions::defer_data_checks on CUDA: a float64 scalar on the device, 0 when the data passed its
  // checks (dapo::check_deferred_policy_loss raises what it found); undefined when the data was checked at once.
  torch::Tensor data_check = {};
};

namespace detail {

// Shapes, dtypes, devices and options: O(1) checks, done before any arithmetic. The data checks (mask values, empty
// groups, the global token and row counts) need a pass over the mask; the fused kernel makes them during its own pass.
inline void check_policy_loss_inputs(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                     const torch::Tensor& advantages, const torch::Tensor& mask,
                                     const PolicyLossOptions& options, const char* where,
                                     const torch::Tensor& weights = {}) {
  check_floating(logp, "logp", where);
  check_dim(logp, 2, "logp", where);
  check_floating(old_logp, "old_logp", where);
  DAPO_REQUIRE(old_logp.sizes() == logp.sizes(), where, "old_logp has shape ", shape_of(old_logp), " but logp has ",
               shape_of(logp));
  DAPO_REQUIRE(old_logp.scalar_type() == logp.scalar_type(), where, "old_logp has dtype ", old_logp.scalar_type(),
               " but logp has ", logp.scalar_type());
  check_same_device(old_logp, logp, "old_logp", "logp", where);

  check_defined(mask, "mask", where);
  DAPO_REQUIRE(mask.sizes() == logp.sizes(), where, "mask has shape ", shape_of(mask), " but logp has ",
               shape_of(logp));
  DAPO_REQUIRE(mask.scalar_type() == torch::kBool || mask.is_floating_point(), where, "mask has dtype ",
               mask.scalar_type(), ", expected bool or a floating dtype holding 0 and 1");
  check_same_device(mask, logp, "mask", "logp", where);
  check_floating(advantages, "advantages", where);
  const int64_t rows = logp.size(0);
  DAPO_REQUIRE((advantages.dim() == 1 && advantages.size(0) == rows) || advantages.sizes() == logp.sizes(), where,
               "advantages has shape ", shape_of(advantages), ", expected [", rows, "] or ", shape_of(logp),
               " (logp's shape)");
  check_same_device(advantages, logp, "advantages", "logp", where);
  if (weights.defined()) {
    check_floating(weights, "weights", where);
    DAPO_REQUIRE(weights.sizes() == logp.sizes(), where, "weights has shape ", shape_of(weights), " but logp has ",
                 shape_of(logp));
    check_same_device(weights, logp, "weights", "logp", where);
  }

  check_policy_loss_options(options, rows, where);
}

// The data checks as tensor ops, for the composite path: mask values 0/1, a token in every group under
// group-token-mean, global token and row counts no smaller than this batch's.
inline void check_policy_loss_data(const torch::Tensor& mask, const PolicyLossOptions& options, const char* where) {
  if (mask.is_floating_point()) {
    const std::string bad = first_true_index((mask != 0) & (mask != 1));
    DAPO_REQUIRE(bad.empty(), where, "mask", bad, " is ",
                 bad.empty() ? 0.0 : mask.masked_select((mask != 0) & (mask != 1))[0].item<double>(),
                 ", expected 0 or 1");
  }

  const torch::Tensor mask_values = mask.to(torch::kFloat64);
  if (options.aggregation == LossAggregation::kGroupTokenMean) {
    const torch::Tensor group_tokens = mask_values.reshape({-1, options.group_size * mask_values.size(1)}).sum(1);
    const torch::Tensor empty = (group_tokens == 0).nonzero();
    const int64_t group = empty.size(0) > 0 ? empty[0][0].item<int64_t>() : -1;
    DAPO_REQUIRE(group < 0, where, "group ", group, " (rows ", group * options.group_size, "..",
                 (group + 1) * options.group_size - 1, ") has no masked token; group-token-mean is undefined for it");
  }
  if (options.global_token_count > 0.0) {
    const double local = mask_values.sum().item<double>();
    DAPO_REQUIRE(options.global_token_count >= local, where, "global_token_count is ", options.global_token_count,
                 " but this batch alone holds ", local, " masked tokens");
  }
  const bool seq_mean = options.aggregation == LossAggregation::kSeqMeanTokenMean ||
                        options.aggregation == LossAggregation::kSeqMeanTokenSum ||
                        options.aggregation == LossAggregation::kSeqMeanTokenSumNorm;
  if (seq_mean && options.mode != PolicyLossMode::kGeoMean && options.global_row_count > 0.0) {
    const auto local = (mask_values.sum(1) > 0).sum().item<int64_t>();
    DAPO_REQUIRE(options.global_row_count >= static_cast<double>(local), where, "global_row_count is ",
                 options.global_row_count, " but this batch alone holds ", local, " rows with a masked token");
  }
}

}  // namespace detail
}  // namespace dapo
