// Micro-batch and data-parallel accumulation of the policy loss on plain buffers: every golden case of every
// aggregation, cut into micro-batches (and ranks) trimmed to their longest response, adds up to the one-shot loss and
// gradient; ragged masks, empty rows and empty micro-batches; the counts; the errors.
#include <dapo/core/accumulation.hpp>

#include <random>
#include <span>

#include "support/loss_case.hpp"
#include "support/micro_batch_plan.hpp"

namespace {

using dapo::LossAggregation;
using dapo::test::LossCase;

struct Accumulated {
  double loss = 0.0;
  std::vector<double> grad;  // [B, T], assembled from the micro-batches' [rows, cols] pieces
  dapo::MiniBatchCounts counts;
};

// What a trainer does: every rank counts its share and the counts are summed (the all-reduce), then every micro-batch
// runs with micro_batch_options on its trimmed rows and the losses and gradients are added up.
Accumulated accumulate(const LossCase& c, const dapo::PolicyLossOptions& options, const dapo::test::Split& split) {
  using dapo::test::sub_block;
  const int64_t unit_rows = options.aggregation == LossAggregation::kGroupTokenMean ? options.group_size : 1;
  const auto plan = dapo::test::plan_micro_batches(c.mask, c.rows, c.cols, unit_rows, split);
  Accumulated out;
  for (const auto& share : plan.rank_rows) {
    out.counts += dapo::core::count_mini_batch<double>(sub_block(c.mask, c.cols, share, c.cols), share.rows, c.cols);
  }
  const dapo::PolicyLossOptions micro_options = dapo::micro_batch_options(options, out.counts);
  out.grad.assign(c.logp.size(), 0.0);
  for (const auto& micro : plan.micro_batches) {
    const auto& range = micro.range;
    const auto logp = sub_block(c.logp, c.cols, range, micro.cols);
    const auto old_logp = sub_block(c.old_logp, c.cols, range, micro.cols);
    const auto mask = sub_block(c.mask, c.cols, range, micro.cols);
    const auto advantages =
        c.per_token_advantages
            ? sub_block(c.advantages, c.cols, range, micro.cols)
            : std::vector<double>(c.advantages.begin() + range.first, c.advantages.begin() + range.first + range.rows);
    std::vector<double> grad(logp.size());
    out.loss +=
        dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, range.rows, micro.cols, micro_options, grad)
            .loss;
    for (int64_t row = 0; row < range.rows; ++row) {
      std::copy_n(grad.begin() + row * micro.cols, micro.cols, out.grad.begin() + (range.first + row) * c.cols);
    }
  }
  return out;
}

struct OneShot {
  double loss = 0.0;
  std::vector<double> grad;
};

OneShot one_shot(const LossCase& c, const dapo::PolicyLossOptions& options) {
  OneShot out{0.0, std::vector<double>(c.logp.size())};
  out.loss =
      dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, c.rows, c.cols, options, out.grad).loss;
  return out;
}

constexpr double kTolerance = 1e-12;  // absolute and relative, float64

void check_accumulates_to(const LossCase& c, const dapo::PolicyLossOptions& options, double loss,
                          const std::vector<double>& grad) {
  for (const auto& split : dapo::test::kSplits) {
    CAPTURE(split.name());
    const Accumulated accumulated = accumulate(c, options, split);
    CHECK(accumulated.counts == dapo::core::count_mini_batch<double>(c.mask, c.rows, c.cols));
    CHECK(dapo::test::close(accumulated.loss, loss, kTolerance, kTolerance));
    REQUIRE(accumulated.grad.size() == grad.size());
    for (std::size_t i = 0; i < grad.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(accumulated.grad[i], grad[i], kTolerance, kTolerance));
    }
  }
}

// A batch whose row r holds lengths[r] tokens (a prefix), or, with holes, a random subset of them.
LossCase ragged_case(std::mt19937_64& rng, const std::vector<int64_t>& lengths, int64_t cols, bool per_token,
                     bool holes, const dapo::PolicyLossOptions& options) {
  LossCase c = dapo::test::random_loss_case(rng, static_cast<int64_t>(lengths.size()), cols, per_token, options);
  std::bernoulli_distribution keep(0.7);
  for (int64_t row = 0; row < c.rows; ++row) {
    for (int64_t col = 0; col < cols; ++col) {
      const bool inside = col < lengths[static_cast<std::size_t>(row)];
      c.mask[static_cast<std::size_t>(row * cols + col)] = inside && (!holes || col == 0 || keep(rng)) ? 1.0 : 0.0;
    }
  }
  return c;
}

}  // namespace

TEST_CASE("every golden case, every aggregation: micro-batches and ranks add up to the golden loss and gradient") {
  const auto cases = dapo::test::golden_loss_cases();
  if (cases.empty()) return;
  int checked_cases = 0;
  std::vector<int> per_aggregation(dapo::kAggregationNames.size());
  for (const auto& c : cases) {
    CAPTURE(c.name);
    check_accumulates_to(c, c.options, c.loss, c.grad_logp);
    ++checked_cases;
    ++per_aggregation[static_cast<std::size_t>(c.options.aggregation)];
    if (c.options.aggregation == LossAggregation::kSeqMeanTokenSumNorm) {
      // The goldens use norm_length = T; 0 must mean the mini-batch's T, not a trimmed micro-batch's.
      REQUIRE(c.options.norm_length == static_cast<double>(c.cols));
      auto options = c.options;
      options.norm_length = 0.0;
      check_accumulates_to(c, options, c.loss, c.grad_logp);
    }
  }
  CHECK(checked_cases == static_cast<int>(cases.size()));
  // golden.json covers the five aggregations before token-sum (verl_zoo.json covers token-sum).
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    CAPTURE(name);
    if (aggregation != LossAggregation::kTokenSum) CHECK(per_aggregation[static_cast<std::size_t>(aggregation)] > 0);
  }
}

TEST_CASE("ragged masks, empty rows and all-empty micro-batches accumulate to the one-shot loss") {
  std::mt19937_64 rng(1010);
  // Rows 1, 4 and 7 are empty, no group of two is.
  const std::vector<int64_t> no_empty_group{13, 0, 5, 1, 0, 7, 9, 0};
  // Rows 0 and 1 are empty: the first micro-batch of a 4-way split holds no token and is trimmed to 0 columns.
  const std::vector<int64_t> empty_first_rows{0, 0, 13, 5, 1, 0, 0, 9};
  int checked = 0;
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const double dual_clip : {0.0, 3.0}) {
      for (const bool per_token : {false, true}) {
        for (const bool holes : {false, true}) {
          for (const double norm_length : {0.0, 16.0}) {
            if (norm_length != 0.0 && aggregation != LossAggregation::kSeqMeanTokenSumNorm) continue;
            const dapo::PolicyLossOptions options{
                .dual_clip = dual_clip, .aggregation = aggregation, .group_size = 2, .norm_length = norm_length};
            std::vector<std::vector<int64_t>> masks{no_empty_group};
            if (aggregation != LossAggregation::kGroupTokenMean) masks.push_back(empty_first_rows);
            for (const auto& lengths : masks) {
              const LossCase c = ragged_case(rng, lengths, 13, per_token, holes, options);
              CAPTURE(name);
              CAPTURE(dual_clip);
              CAPTURE(per_token);
              CAPTURE(holes);
              CAPTURE(norm_length);
              CAPTURE(lengths[0]);
              const OneShot expected = one_shot(c, options);
              CHECK(expected.loss != 0.0);
              check_accumulates_to(c, options, expected.loss, expected.grad);
              ++checked;
            }
          }
        }
      }
    }
  }
  CHECK(checked == 104);  // 6 aggregations x 16 + seq-mean-token-sum-norm's 8 with a norm_length
}

TEST_CASE("a mini-batch without any masked token accumulates to 0 (every aggregation but group-token-mean)") {
  std::mt19937_64 rng(3);
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    if (aggregation == LossAggregation::kGroupTokenMean) continue;  // an empty group has no mean: an error
    CAPTURE(name);
    const LossCase c = ragged_case(rng, {0, 0, 0, 0}, 5, false, false, {.aggregation = aggregation});
    const auto counts = dapo::core::count_mini_batch<double>(c.mask, c.rows, c.cols);
    CHECK(counts == dapo::MiniBatchCounts{.tokens = 0, .rows = 4, .nonempty_rows = 0, .cols = 5});
    check_accumulates_to(c, c.options, 0.0, std::vector<double>(c.logp.size(), 0.0));
  }
}

TEST_CASE("global counts equal to the call's own give the same bits as no global count") {
  std::mt19937_64 rng(17);
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    CAPTURE(name);
    const LossCase c = ragged_case(rng, {9, 0, 4, 7, 1, 9}, 9, true, true,
                                   {.dual_clip = 3.0, .aggregation = aggregation, .group_size = 2});
    const OneShot plain = one_shot(c, c.options);
    const auto options =
        dapo::micro_batch_options(c.options, dapo::core::count_mini_batch<double>(c.mask, c.rows, c.cols));
    const OneShot global = one_shot(c, options);
    CHECK(global.loss == plain.loss);
    CHECK(global.grad == plain.grad);
  }
}

TEST_CASE("trimmed micro-batches with norm_length 0: dividing by each one's own T (the old driver's way) is wrong") {
  std::mt19937_64 rng(5);
  const dapo::PolicyLossOptions options{.aggregation = LossAggregation::kSeqMeanTokenSumNorm};
  const LossCase c = ragged_case(rng, {12, 12, 3, 2}, 12, false, false, options);
  const double expected = one_shot(c, options).loss;
  CHECK(dapo::test::close(accumulate(c, options, {1, 2}).loss, expected, kTolerance, kTolerance));
  // The share rows / B times each micro-batch's own loss, whose norm_length 0 means its own trimmed T (12, then 3).
  double naive = 0.0;
  for (const auto& micro : dapo::test::plan_micro_batches(c.mask, c.rows, c.cols, 1, {1, 2}).micro_batches) {
    using dapo::test::sub_block;
    const auto& range = micro.range;
    const auto loss = dapo::core::policy_loss<double>(
        sub_block(c.logp, c.cols, range, micro.cols), sub_block(c.old_logp, c.cols, range, micro.cols),
        std::span(c.advantages).subspan(static_cast<std::size_t>(range.first), static_cast<std::size_t>(range.rows)),
        sub_block(c.mask, c.cols, range, micro.cols), range.rows, micro.cols, options);
    naive += loss.loss * static_cast<double>(range.rows) / static_cast<double>(c.rows);
  }
  CHECK_FALSE(dapo::test::close(naive, expected, 1e-3));
}

TEST_CASE("count_mini_batch counts tokens, rows, non-empty rows and columns; counts of shares add up") {
  const std::vector<double> mask{1, 1, 0,  //
                                 0, 0, 0,  //
                                 1, 0, 1,  //
                                 0, 1, 0};
  const auto counts = dapo::core::count_mini_batch<double>(mask, 4, 3);
  CHECK(counts == dapo::MiniBatchCounts{.tokens = 5, .rows = 4, .nonempty_rows = 3, .cols = 3});
  const auto top = dapo::core::count_mini_batch<double>(std::span(mask).first(6), 2, 3);
  const auto bottom = dapo::core::count_mini_batch<double>(std::span(mask).last(6), 2, 3);
  CHECK(top + bottom == counts);
  // Shares padded to different widths: the whole is as wide as the widest.
  auto narrow = dapo::core::count_mini_batch<double>(std::vector<double>{1, 0}, 1, 2);
  narrow += counts;
  CHECK(narrow == dapo::MiniBatchCounts{.tokens = 6, .rows = 5, .nonempty_rows = 4, .cols = 3});

  const bool flags[] = {true, false, false, false};
  CHECK(dapo::core::count_mini_batch<bool>(flags, 2, 2) ==
        dapo::MiniBatchCounts{.tokens = 1, .rows = 2, .nonempty_rows = 1, .cols = 2});
  const std::vector<float> floats{0, 0, 0, 1};
  CHECK(dapo::core::count_mini_batch<float>(floats, 2, 2).nonempty_rows == 1);
  CHECK(dapo::core::count_mini_batch<double>({}, 0, 7) == dapo::MiniBatchCounts{.cols = 7});

  CHECK_THROWS_WITH_AS(dapo::core::count_mini_batch<double>(mask, 4, 4),
                       doctest::Contains("dapo::core::count_mini_batch: mask has 12 elements, expected B * T = 4 * 4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::count_mini_batch<double>(std::vector<double>{1, 0, 0.5, 1}, 2, 2),
                       doctest::Contains("mask[1, 0] is 0.5, expected 0 or 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::count_mini_batch<double>({}, -1, 0),
                       doctest::Contains("shape [-1, 0] has a negative extent"), std::invalid_argument);
}

TEST_CASE("micro_batch_options sets the global count of its aggregation, and norm_length when it is 0") {
  const dapo::MiniBatchCounts counts{.tokens = 30, .rows = 8, .nonempty_rows = 6, .cols = 12};
  auto options_for = [&](LossAggregation aggregation, double norm_length = 0.0) {
    return dapo::micro_batch_options(
        {.dual_clip = 3.0, .aggregation = aggregation, .group_size = 4, .norm_length = norm_length}, counts);
  };
  const auto token_mean = options_for(LossAggregation::kTokenMean);
  CHECK(token_mean.global_token_count == 30.0);
  CHECK(token_mean.global_row_count == 0.0);
  CHECK(token_mean.dual_clip == 3.0);
  CHECK(options_for(LossAggregation::kGroupTokenMean).global_group_count == 2.0);
  CHECK(options_for(LossAggregation::kSeqMeanTokenMean).global_row_count == 6.0);
  CHECK(options_for(LossAggregation::kSeqMeanTokenSum).global_row_count == 6.0);
  const auto norm = options_for(LossAggregation::kSeqMeanTokenSumNorm);
  CHECK(norm.global_row_count == 8.0);
  CHECK(norm.norm_length == 12.0);
  CHECK(options_for(LossAggregation::kSeqMeanTokenSumNorm, 1024.0).norm_length == 1024.0);
}

TEST_CASE("micro_batch_options rejects inconsistent counts and options it cannot serve") {
  using dapo::micro_batch_options;
  const dapo::MiniBatchCounts counts{.tokens = 30, .rows = 8, .nonempty_rows = 6, .cols = 12};
  auto with = [&](auto change) {
    auto changed = counts;
    change(changed);
    return changed;
  };
  CHECK_THROWS_WITH_AS(micro_batch_options({}, with([](auto& c) { c.nonempty_rows = 9; })),
                       doctest::Contains("dapo::micro_batch_options: mini_batch has 9 nonempty_rows, expected a value "
                                         "in [0, rows = 8]"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(micro_batch_options({}, with([](auto& c) { c.tokens = 97; })),
                       doctest::Contains("mini_batch has 97 tokens, expected a value in [nonempty_rows, rows * cols] "
                                         "= [6, 8 * 12]"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(micro_batch_options({}, with([](auto& c) { c.tokens = std::nan(""); })),
                       doctest::Contains("mini_batch has nan tokens"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(micro_batch_options({}, with([](auto& c) { c.rows = -1; })),
                       doctest::Contains("mini_batch has rows -1 and cols 12, expected both >= 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(micro_batch_options({.aggregation = LossAggregation::kGroupTokenMean, .group_size = 3}, counts),
                       doctest::Contains("dapo::micro_batch_options: batch has 8 rows, which group_size = 3 does not "
                                         "divide"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(micro_batch_options({.aggregation = LossAggregation::kGroupTokenMean}, counts),
                       doctest::Contains("group-token-mean needs group_size >= 1, got 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      micro_batch_options({.aggregation = LossAggregation::kSeqMeanTokenSum, .global_token_count = 30}, counts),
      doctest::Contains("global_token_count is 30 but aggregation is seq-mean-token-sum"), std::invalid_argument);
}

TEST_CASE("global counts: only for their aggregations, finite, >= 0, and at least the call's own count") {
  const std::vector<double> logp(6, -1.0), advantages{1.0, -1.0}, mask{1, 1, 1, 1, 0, 0};
  auto loss = [&](const dapo::PolicyLossOptions& options) {
    return dapo::core::policy_loss<double>(logp, logp, advantages, mask, 2, 3, options).loss;
  };
  using A = LossAggregation;
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kTokenMean, .global_row_count = 2}),
                       doctest::Contains("global_row_count is 2 but aggregation is token-mean; a global row count only "
                                         "applies to seq-mean-token-mean, seq-mean-token-sum, "
                                         "seq-mean-token-sum-norm and the geo_mean loss"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kSeqMeanTokenMean, .global_group_count = 2}),
                       doctest::Contains("global_group_count is 2 but aggregation is seq-mean-token-mean; a global "
                                         "group count only applies to group-token-mean"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kGroupTokenMean, .group_size = 1, .global_token_count = 4}),
                       doctest::Contains("a global token count only applies to token-mean"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kSeqMeanTokenSum, .global_row_count = -1}),
                       doctest::Contains("global_row_count is -1, expected a finite value >= 0 (0 = this call's own "
                                         "count)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kGroupTokenMean, .group_size = 1, .global_group_count = INFINITY}),
                       doctest::Contains("global_group_count is inf, expected a finite value >= 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kGroupTokenMean, .group_size = 1, .global_group_count = 1}),
                       doctest::Contains("global_group_count is 1 but this batch alone holds 2 groups (2 rows / "
                                         "group_size 1)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kSeqMeanTokenSumNorm, .global_row_count = 1.5}),
                       doctest::Contains("global_row_count is 1.5 but this batch alone holds 2 rows"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.aggregation = A::kSeqMeanTokenMean, .global_row_count = 1}),
                       doctest::Contains("global_row_count is 1 but this batch alone holds 2 rows with a masked token"),
                       std::invalid_argument);
  // Enough: each mode divides by its global count.
  CHECK(loss({.aggregation = A::kSeqMeanTokenSum, .global_row_count = 4}) == doctest::Approx(-(3.0 - 1.0) / 4));
  CHECK(loss({.aggregation = A::kGroupTokenMean, .group_size = 1, .global_group_count = 4}) ==
        doctest::Approx((-1.0 + 1.0) / 4));
  CHECK(loss({.aggregation = A::kSeqMeanTokenSumNorm, .global_row_count = 4}) == doctest::Approx(-(3.0 - 1.0) / 12));

  // The check is public; the detail name still compiles for callers written before.
  CHECK_THROWS_WITH_AS(
      dapo::check_policy_loss_options({.aggregation = A::kTokenMean, .global_group_count = 1}, 4, "my_trainer"),
      doctest::Contains("my_trainer: global_group_count is 1 but aggregation is token-mean"), std::invalid_argument);
  CHECK_NOTHROW(dapo::detail::check_policy_loss_options({}, 4, "my_trainer"));
}
