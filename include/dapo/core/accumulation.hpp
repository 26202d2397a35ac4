// Gradient accumulation for the policy loss: a mini-batch (one optimizer step) split into micro-batches and over
// data-parallel ranks gives the same loss and gradient as the mini-batch in one call, for every LossAggregation.
// Count the whole mini-batch once (count_mini_batch, summed over ranks), call micro_batch_options, and compute every
// micro-batch's loss with the options it returns: each is then exactly its share, so the losses and the gradients
// simply add up (as verl passes the global batch's counts to agg_loss). No LibTorch here; <dapo/loss.hpp> adds
// dapo::count_mini_batch for a mask tensor.
//
// Shapes: B = rows (responses) of the mini-batch, all micro-batches and ranks together; T = its columns.
//   mask [B, T] row-major, bool or a floating type holding 0 and 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>

#include "dapo/core/error.hpp"
#include "dapo/core/loss.hpp"

namespace dapo {

// What the aggregations of a mini-batch divide by. Counts of disjoint parts add up with +=, so each rank may count its
// own share and all-reduce tokens, rows and nonempty_rows with a sum and cols with a max.
struct MiniBatchCounts {
  double tokens = 0;          // masked tokens (token-mean)
  int64_t rows = 0;           // rows (group-token-mean: rows / group_size groups; seq-mean-token-sum-norm)
  int64_t nonempty_rows = 0;  // rows with at least one masked token (seq-mean-token-mean, seq-mean-token-sum)
  int64_t cols = 0;           // T, the columns of the mini-batch's mask (seq-mean-token-sum-norm with norm_length 0)

  MiniBatchCounts& operator+=(const MiniBatchCounts& other) {
    tokens += other.tokens;
    rows += other.rows;
    nonempty_rows += other.nonempty_rows;
    cols = std::max(cols, other.cols);  // the parts are padded to different widths; the whole is the widest
    return *this;
  }
  friend MiniBatchCounts operator+(MiniBatchCounts left, const MiniBatchCounts& right) { return left += right; }
  bool operator==(const MiniBatchCounts&) const = default;
};

namespace detail {

template <class M>
MiniBatchCounts count_mask(const M* mask, int64_t rows, int64_t cols, const char* where) {
  MiniBatchCounts counts{.rows = rows, .cols = cols};
  for (int64_t row = 0; row < rows; ++row) {
    double row_tokens = 0.0;
    for (int64_t col = 0; col < cols; ++col) {
      const auto value = static_cast<double>(mask[row * cols + col]);
      DAPO_REQUIRE(value == 0.0 || value == 1.0, where, "mask[", row, ", ", col, "] is ", value, ", expected 0 or 1");
      row_tokens += value;
    }
    counts.tokens += row_tokens;
    counts.nonempty_rows += row_tokens > 0.0 ? 1 : 0;
  }
  return counts;
}

}  // namespace detail

namespace core {

// The counts of a mini-batch's mask [rows, cols] (or of one rank's share of it: add the shares with +=).
template <class M>
requires std::same_as<M, bool> || std::floating_point<M> MiniBatchCounts count_mini_batch(std::span<const M> mask,
                                                                                          int64_t rows, int64_t cols) {
  constexpr const char* kWhere = "dapo::core::count_mini_batch";
  DAPO_REQUIRE(rows >= 0 && cols >= 0, kWhere, "shape [", rows, ", ", cols, "] has a negative extent");
  DAPO_REQUIRE(mask.size() == static_cast<std::size_t>(rows * cols), kWhere, "mask has ", mask.size(),
               " elements, expected B * T = ", rows, " * ", cols);
  return detail::count_mask(mask.data(), rows, cols, kWhere);
}

}  // namespace core

// The options for every micro-batch of the mini-batch counted in mini_batch, on any rank: options with the global
// count of its aggregation set from the whole mini-batch, so that each micro-batch's loss is its exact share.
//   token-mean:              global_token_count = tokens         (loss = token sum / the mini-batch's tokens)
//   group-token-mean:        global_group_count = rows / group_size (each group's mean / the mini-batch's groups)
//   seq-mean-token-mean/sum: global_row_count = nonempty_rows    (each row's mean or sum / its non-empty rows)
//   seq-mean-token-sum-norm: global_row_count = rows, and norm_length = cols when it is 0: a micro-batch trimmed to
//                            its longest response must still divide by the mini-batch's T, not its own.
//   token-sum:               nothing (no divisor)
//   the geo_mean loss:       global_row_count = rows (its loss is the plain mean of its rows' losses)
// kl_cov and clip_cov choose tokens among the call's own and cannot be split: they are refused.
// Micro-batches must hold whole groups under group-token-mean. A mini-batch with no masked token gives 0 (global
// count 0 means the call's own, which is 0 too). Checks the options (as check_policy_loss_options does for a batch
// of mini_batch.rows) and that the counts are consistent.
inline PolicyLossOptions micro_batch_options(const PolicyLossOptions& options, const MiniBatchCounts& mini_batch) {
  constexpr const char* kWhere = "dapo::micro_batch_options";
  const MiniBatchCounts& counts = mini_batch;
  DAPO_REQUIRE(counts.rows >= 0 && counts.cols >= 0, kWhere, "mini_batch has rows ", counts.rows, " and cols ",
               counts.cols, ", expected both >= 0");
  DAPO_REQUIRE(counts.nonempty_rows >= 0 && counts.nonempty_rows <= counts.rows, kWhere, "mini_batch has ",
               counts.nonempty_rows, " nonempty_rows, expected a value in [0, rows = ", counts.rows, "]");
  DAPO_REQUIRE(std::isfinite(counts.tokens) && counts.tokens >= static_cast<double>(counts.nonempty_rows) &&
                   counts.tokens <= static_cast<double>(counts.rows) * static_cast<double>(counts.cols),
               kWhere, "mini_batch has ", counts.tokens,
               " tokens, expected a value in [nonempty_rows, rows * cols] = [", counts.nonempty_rows, ", ", counts.rows,
               " * ", counts.cols, "]");
  check_policy_loss_options(options, counts.rows, kWhere);

  DAPO_REQUIRE(options.mode != PolicyLossMode::kKlCov && options.mode != PolicyLossMode::kClipCov, kWhere, "the ",
               policy_loss_name(options.mode),
               " loss chooses its tokens by a covariance over the call's own tokens, so micro-batches would choose "
               "other tokens than the mini-batch in one call; compute it on the whole mini-batch");
  PolicyLossOptions result = options;
  if (options.mode == PolicyLossMode::kGeoMean) {  // the plain mean of the rows' losses, whatever the aggregation
    result.global_row_count = static_cast<double>(counts.rows);
    return result;
  }
  switch (options.aggregation) {
    case LossAggregation::kTokenMean:
      result.global_token_count = counts.tokens;
      break;
    case LossAggregation::kGroupTokenMean:
      result.global_group_count = static_cast<double>(counts.rows / options.group_size);
      break;
    case LossAggregation::kSeqMeanTokenMean:
    case LossAggregation::kSeqMeanTokenSum:
      result.global_row_count = static_cast<double>(counts.nonempty_rows);
      break;
    case LossAggregation::kSeqMeanTokenSumNorm:
      result.global_row_count = static_cast<double>(counts.rows);
      if (result.norm_length == 0.0) result.norm_length = static_cast<double>(counts.cols);
      break;
    case LossAggregation::kTokenSum:  // no divisor: the micro-batches' sums add up as they are
      break;
  }
  return result;
}

}  // namespace dapo
