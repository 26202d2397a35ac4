// The aggregation weights of a policy loss on LibTorch tensors (<dapo/core/aggregation_weights.hpp> has the
// definition): w [B, T] with (w * X).sum() = any per-token term X aggregated as dapo::policy_loss aggregates its
// losses, micro-batch shares included. For a KL loss or an entropy term beside the policy loss:
//   const auto w = dapo::aggregation_weights(mask, share_options);   // share_options from micro_batch_options
//   loss = out.loss + kl_coef * (w * dapo::kl_penalty(logp, ref_logp, "low_var_kl")).sum()
//                   - entropy_coeff * (w * entropy).sum();
// Not differentiable (a function of the mask); computed on the CPU in double, returned in `dtype` on mask's device.
// micro_batch_shares and micro_batch_weights give every micro-batch its options and weights, token budgets that split
// groups included.
//
// agg_loss is verl's agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info) on tensors
// (<dapo/core/agg_loss.hpp> has the definition): differentiable in loss_mat, whose masked-out entries are never read.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <span>
#include <string>

#include "dapo/core/accumulation.hpp"
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

// Whether micro-batch rows `rows` (indices into the batch, ascending) are whole groups: consecutive, aligned runs of
// group_size rows, as a row count cut (ppo_micro_batch_size) gives them and a token budget may not.
inline bool holds_whole_groups(std::span<const int64_t> rows, int64_t group_size) {
  DAPO_REQUIRE(group_size > 0, "dapo::holds_whole_groups", "group_size is ", group_size, ", expected > 0");
  const auto count = static_cast<int64_t>(rows.size());
  if (count % group_size != 0) return false;
  for (int64_t i = 0; i < count; i += group_size) {
    const int64_t first = rows[static_cast<std::size_t>(i)];
    if (first % group_size != 0 || rows[static_cast<std::size_t>(i + group_size - 1)] != first + group_size - 1) {
      return false;
    }
  }
  return true;
}

// A mini-batch's loss shared by its micro-batches, when they may split groups: a token budget cuts rows, not groups
// (verl's use_dynamic_bsz). Every aggregation but group-token-mean divides by counts of the whole mini-batch, which
// micro_batch_options gives each micro-batch; group-token-mean divides each group by its own tokens, which a micro-
// batch holding part of the group does not see. There each token's weight in the mini-batch's loss (aggregation_weights
// of the whole mini-batch) goes to the micro-batch as a per-token weight of a token-sum (the geo_mean loss, whose
// mean over rows takes no token weights, keeps its options).
//   const auto shares = dapo::micro_batch_shares(options, counts, mini_mask, splits);
//   for each micro-batch (rows: its rows' indices in the mini-batch; mask: theirs):
//     const auto w = dapo::micro_batch_weights(shares, rows, mask, with_terms);
//     out = dapo::policy_loss(logp, old_logp, adv, mask, shares.loss, w.loss (times any IS weights));
//     loss = out.loss + kl_coef * (w.terms * kl).sum() - entropy_coeff * (w.terms * entropy).sum();
// Then the micro-batches' losses and gradients add up to the mini-batch's in one call.
struct MicroBatchShares {
  PolicyLossOptions loss;       // each micro-batch's policy_loss options
  PolicyLossOptions terms;      // the token-level terms' (a KL loss, an entropy term): the loss's aggregation, vanilla
  torch::Tensor token_weights;  // [B, T] on the host where micro-batches split groups under group-token-mean
};

// options: the mini-batch's; counts: count_mini_batch of the whole mini-batch (summed over ranks); mini_mask [B, T]:
// its mask, read only when `splits_groups` (some micro-batch does not hold whole groups: holds_whole_groups); dtype:
// the weights'.
inline MicroBatchShares micro_batch_shares(const PolicyLossOptions& options, const MiniBatchCounts& counts,
                                           const torch::Tensor& mini_mask, bool splits_groups,
                                           torch::ScalarType dtype = torch::kFloat32) {
  MicroBatchShares shares;
  shares.loss = micro_batch_options(options, counts);
  PolicyLossOptions token_options = options;
  token_options.mode = PolicyLossMode::kVanilla;
  shares.terms = micro_batch_options(token_options, counts);
  if (!splits_groups || shares.terms.aggregation != LossAggregation::kGroupTokenMean) return shares;
  DAPO_REQUIRE(mini_mask.defined() && mini_mask.dim() == 2 && mini_mask.size(0) == counts.rows,
               "dapo::micro_batch_shares", "mini_mask has shape ",
               (mini_mask.defined() ? detail::shape_of(mini_mask) : std::string("(undefined)")), ", expected [",
               counts.rows, ", T]: the whole mini-batch's mask, which split groups need");
  shares.token_weights = aggregation_weights(mini_mask.to(torch::kCPU), shares.terms, dtype);
  if (shares.loss.mode != PolicyLossMode::kGeoMean) {
    shares.loss.aggregation = LossAggregation::kTokenSum;
    shares.loss.global_group_count = 0.0;
  }
  return shares;
}

// One micro-batch's per-token weights, on the host in the shares' dtype (or float32):
// - loss: for policy_loss (multiplied by any other per-token weights, as rollout IS weights); undefined when none;
// - terms: the token-level terms' aggregation weights, made only `with_terms`.
struct MicroBatchWeights {
  torch::Tensor loss, terms;
};

// rows: the micro-batch's rows as indices into the mini-batch; mask [rows, T'] their mask, T' <= T columns (a micro-
// batch trimmed to its longest row).
inline MicroBatchWeights micro_batch_weights(const MicroBatchShares& shares, std::span<const int64_t> rows,
                                             const torch::Tensor& mask, bool with_terms,
                                             torch::ScalarType dtype = torch::kFloat32) {
  constexpr const char* kWhere = "dapo::micro_batch_weights";
  detail::check_defined(mask, "mask", kWhere);
  detail::check_dim(mask, 2, "mask", kWhere);
  DAPO_REQUIRE(mask.size(0) == static_cast<int64_t>(rows.size()), kWhere, "mask has ", mask.size(0), " rows but ",
               rows.size(), " row indices were given");
  MicroBatchWeights weights;
  if (!shares.token_weights.defined()) {
    if (with_terms) weights.terms = aggregation_weights(mask, shares.terms, dtype);
    return weights;
  }
  const torch::Tensor& all = shares.token_weights;
  DAPO_REQUIRE(mask.size(1) <= all.size(1), kWhere, "mask has ", mask.size(1), " columns, the mini-batch ",
               all.size(1));
  for (const int64_t row : rows) {
    DAPO_REQUIRE(row >= 0 && row < all.size(0), kWhere, "row index ", row, " is outside the mini-batch's ", all.size(0),
                 " rows");
  }
  const torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(rows.data()), {static_cast<int64_t>(rows.size())}, torch::kInt64);
  const torch::Tensor taken = all.index_select(0, index).narrow(1, 0, mask.size(1));
  if (shares.loss.aggregation == LossAggregation::kTokenSum) weights.loss = taken;
  if (with_terms) weights.terms = taken;
  return weights;
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
