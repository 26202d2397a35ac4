// verl's agg_loss on plain buffers: a [B, T] matrix of per-token losses (a policy loss, a KL penalty, an entropy) and
// its mask to the scalar loss, by loss_agg_mode, with verl's keyword arguments for data parallel and its divisors,
// and d loss / d loss_mat. The policy losses aggregate inside their own kernels (<dapo/core/loss.hpp>); this is the
// aggregation for any other per-token term, and the definition they are tested against.
//
// Shapes: loss_mat, mask [B, T], row-major; mask holds 0 and 1. With D = dp_size (verl scales each rank's loss by it,
// because data parallel averages the ranks' gradients):
//   token-mean               D * sum(mask * L) / (batch_num_tokens or this call's tokens)
//   token-sum                D * sum(mask * L)
//   seq-mean-token-mean      D * sum_b [row b has a token] * sum_t(mask * L) / (tokens_b + 1e-8) / R
//   seq-mean-token-sum       D * sum(mask * L) / R
//   seq-mean-token-sum-norm  D * sum(mask * L) / R / (loss_scale_factor or T)
// where R = global_batch_size or this call's rows with a token. group-token-mean is dapo's own (policy_loss).
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "dapo/core/error.hpp"
#include "dapo/core/policy_loss_options.hpp"

namespace dapo {

struct AggLossOptions {  // verl's agg_loss keyword arguments; 0 means "not given"
  int64_t dp_size = 1;
  double batch_num_tokens = 0.0;           // token-mean: the global batch's masked tokens (required when dp_size > 1)
  double global_batch_size = 0.0;          // seq-mean-*: the global batch's rows (required when dp_size > 1)
  double loss_scale_factor = 0.0;          // seq-mean-token-sum-norm: the divisor per row (default T)
  double row_epsilon = kVerlCountEpsilon;  // seq-mean-token-mean: added to each row's token count, as verl does
};

namespace core {

template <std::floating_point T>
double agg_loss(std::span<const T> loss_mat, std::span<const T> mask, int64_t rows, int64_t cols, LossAggregation mode,
                const AggLossOptions& options = {}, std::span<T> grad_loss_mat = {}) {
  constexpr const char* kWhere = "dapo::core::agg_loss";
  DAPO_REQUIRE(rows >= 0 && cols >= 0, kWhere, "shape [", rows, ", ", cols, "] has a negative extent");
  const auto size = static_cast<std::size_t>(rows * cols);
  DAPO_REQUIRE(loss_mat.size() == size, kWhere, "loss_mat has ", loss_mat.size(), " elements, expected B * T = ", rows,
               " * ", cols);
  DAPO_REQUIRE(mask.size() == size, kWhere, "mask has ", mask.size(), " elements but loss_mat has ", size);
  DAPO_REQUIRE(grad_loss_mat.empty() || grad_loss_mat.size() == size, kWhere, "grad_loss_mat has ",
               grad_loss_mat.size(), " elements, expected 0 (no gradient) or ", size);
  DAPO_REQUIRE(mode != LossAggregation::kGroupTokenMean, kWhere,
               "group-token-mean is not one of verl's agg_loss modes (dapo::policy_loss computes it)");
  DAPO_REQUIRE(options.dp_size >= 1, kWhere, "dp_size is ", options.dp_size, ", expected >= 1");
  DAPO_REQUIRE(options.batch_num_tokens >= 0.0 && options.global_batch_size >= 0.0 &&
                   options.loss_scale_factor >= 0.0 && options.row_epsilon >= 0.0,
               kWhere, "batch_num_tokens ", options.batch_num_tokens, ", global_batch_size ", options.global_batch_size,
               ", loss_scale_factor ", options.loss_scale_factor, ", row_epsilon ", options.row_epsilon,
               ": expected values >= 0 (0 = not given)");
  const bool token_mode = mode == LossAggregation::kTokenMean;
  const bool seq_mode = mode != LossAggregation::kTokenMean && mode != LossAggregation::kTokenSum;
  DAPO_REQUIRE(options.dp_size == 1 || !token_mode || options.batch_num_tokens > 0.0, kWhere, "dp_size is ",
               options.dp_size, ": token-mean needs the global batch_num_tokens");
  DAPO_REQUIRE(options.dp_size == 1 || !seq_mode || options.global_batch_size > 0.0, kWhere, "dp_size is ",
               options.dp_size, ": ", aggregation_name(mode), " needs the global global_batch_size");

  // Each row's weight w_b: loss = D * sum_b w_b * sum_t mask * L, as the policy kernels aggregate.
  std::vector<double> row_weight(static_cast<std::size_t>(rows), 1.0);
  double tokens = 0.0, nonempty_rows = 0.0;
  for (int64_t b = 0; b < rows; ++b) {
    double row_tokens = 0.0;
    for (int64_t t = 0; t < cols; ++t) {
      const auto m = static_cast<double>(mask[static_cast<std::size_t>(b * cols + t)]);
      DAPO_REQUIRE(m == 0.0 || m == 1.0, kWhere, "mask[", b, ", ", t, "] is ", m, ", expected 0 or 1");
      row_tokens += m;
    }
    tokens += row_tokens;
    nonempty_rows += row_tokens > 0.0 ? 1.0 : 0.0;
    if (mode == LossAggregation::kSeqMeanTokenMean) {
      row_weight[static_cast<std::size_t>(b)] = row_tokens > 0.0 ? 1.0 / (row_tokens + options.row_epsilon) : 0.0;
    }
  }
  double scale = static_cast<double>(options.dp_size);
  const double row_count = options.global_batch_size > 0.0 ? options.global_batch_size : nonempty_rows;
  switch (mode) {
    case LossAggregation::kTokenMean: {
      const double count = options.batch_num_tokens > 0.0 ? options.batch_num_tokens : tokens;
      scale = count > 0.0 ? scale / count : 0.0;
      break;
    }
    case LossAggregation::kTokenSum:
      break;
    case LossAggregation::kSeqMeanTokenSumNorm: {
      const double norm = options.loss_scale_factor > 0.0 ? options.loss_scale_factor : static_cast<double>(cols);
      scale = row_count > 0.0 && norm > 0.0 ? scale / row_count / norm : 0.0;
      break;
    }
    default:  // seq-mean-token-mean, seq-mean-token-sum
      scale = row_count > 0.0 ? scale / row_count : 0.0;
      break;
  }
  double loss = 0.0;
  for (int64_t b = 0; b < rows; ++b) {
    double row_sum = 0.0;
    const double weight = row_weight[static_cast<std::size_t>(b)] * scale;
    for (int64_t t = 0; t < cols; ++t) {
      const auto i = static_cast<std::size_t>(b * cols + t);
      const bool on = static_cast<double>(mask[i]) != 0.0;
      if (on) row_sum += static_cast<double>(loss_mat[i]);
      if (!grad_loss_mat.empty()) grad_loss_mat[i] = static_cast<T>(on ? weight : 0.0);
    }
    loss += row_sum * row_weight[static_cast<std::size_t>(b)];
  }
  return loss * scale;
}

}  // namespace core
}  // namespace dapo
