// The weight of each token in a policy loss's aggregation: for any per-token term X (a KL penalty against a reference
// policy, an entropy bonus), sum_{b,t} w[b,t] * X[b,t] is X aggregated exactly as dapo::policy_loss aggregates its
// per-token losses: the same aggregation, the same divisors, and, with the options micro_batch_options returns, the
// same micro-batch and data-parallel shares, so that a KL loss or an entropy term added to the policy loss splits
// across micro-batches exactly as the loss does. verl aggregates its KL loss and entropy with the actor's
// loss_agg_mode in the same way (agg_loss with the global batch's counts).
//
// Shapes: mask, weights [B, T] row-major; mask bool or floating, holding 0 and 1. options.mode is not read: the
// weights are the token-level losses' (geo_mean's mean over rows has no per-token weights).
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "dapo/core/error.hpp"
#include "dapo/core/policy_loss/kernel.hpp"
#include "dapo/core/policy_loss_options.hpp"

namespace dapo::core {

template <std::floating_point T, class M>
requires std::same_as<M, bool> || std::floating_point<M>
void aggregation_weights(std::span<const M> mask, int64_t rows, int64_t cols, const PolicyLossOptions& options,
                         std::span<T> weights) {
  constexpr const char* kWhere = "dapo::core::aggregation_weights";
  DAPO_REQUIRE(rows >= 0 && cols >= 0, kWhere, "shape [", rows, ", ", cols, "] has a negative extent");
  const auto size = static_cast<std::size_t>(rows * cols);
  DAPO_REQUIRE(mask.size() == size, kWhere, "mask has ", mask.size(), " elements, expected B * T = ", rows, " * ",
               cols);
  DAPO_REQUIRE(weights.size() == size, kWhere, "weights has ", weights.size(), " elements but mask has ", size);
  DAPO_REQUIRE(options.aggregation != LossAggregation::kGroupTokenMean ||
                   (options.group_size >= 1 && rows % options.group_size == 0),
               kWhere, "aggregation group-token-mean needs group_size >= 1 dividing the ", rows,
               " rows, got group_size ", options.group_size);
  // Every token's term is 1 with d/dX = 1: the aggregation's raw gradient times its batch-wide factor is the weight.
  const auto unit = [](int64_t, int64_t) {
    return dapo::detail::TokenTerms<double>{.loss = 1.0, .grad = 1.0, .clipped = 0.0, .dual_clipped = 0.0, .kl = 0.0};
  };
  const PolicyLossKernelResult result =
      aggregate_token_terms(mask.data(), rows, cols, options, unit, weights.data(), kWhere);
  for (T& weight : weights) weight = static_cast<T>(static_cast<double>(weight) * result.grad_scale);
}

}  // namespace dapo::core
