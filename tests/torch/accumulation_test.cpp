// Micro-batch and data-parallel accumulation through the tensor front end: the golden cases of every aggregation, cut
// into trimmed micro-batches (and ranks), give the golden loss, and autograd through the sum of the micro-batch losses
// gives the golden gradient and the one-shot backward's; fused and reference alike. count_mini_batch on tensors.
#include <dapo/dapo.hpp>  // the umbrella: <dapo/loss.hpp> must bring the whole accumulation API
#include <dapo/reference/loss.hpp>

#include <random>

#include "support/loss_case.hpp"
#include "support/loss_fns.hpp"
#include "support/micro_batch_plan.hpp"
#include "support/tensors.hpp"

namespace {

using dapo::LossAggregation;
using dapo::test::LossCase;

using dapo::test::kFused;
using dapo::test::kReference;
using dapo::test::LossFn;

struct Batch {
  torch::Tensor logp, old_logp, advantages, mask;  // [B, T], [B, T], [B] or [B, T], [B, T]
};

Batch batch_of(const LossCase& c, torch::ScalarType dtype, bool bool_mask) {
  using dapo::test::tensor;
  Batch batch{
      tensor(c.logp, {c.rows, c.cols}, dtype).requires_grad_(true), tensor(c.old_logp, {c.rows, c.cols}, dtype),
      c.per_token_advantages ? tensor(c.advantages, {c.rows, c.cols}, dtype) : tensor(c.advantages, {c.rows}, dtype),
      tensor(c.mask, {c.rows, c.cols}, dtype)};
  if (bool_mask) batch.mask = batch.mask.to(torch::kBool);
  return batch;
}

struct Accumulated {
  double loss = 0.0;
  std::vector<double> grad;  // d loss / d logp [B, T] by autograd
};

// Every rank counts its share of the mask, the counts are summed, and the sum of the micro-batch losses (each on its
// trimmed rows, with micro_batch_options) is backpropagated once, as gradient accumulation does.
Accumulated accumulate(const LossCase& c, const dapo::PolicyLossOptions& options, const dapo::test::Split& split,
                       LossFn loss_fn, torch::ScalarType dtype, bool bool_mask) {
  const Batch batch = batch_of(c, dtype, bool_mask);
  const int64_t unit_rows = options.aggregation == LossAggregation::kGroupTokenMean ? options.group_size : 1;
  const auto plan = dapo::test::plan_micro_batches(c.mask, c.rows, c.cols, unit_rows, split);
  dapo::MiniBatchCounts counts;
  for (const auto& share : plan.rank_rows)
    counts += dapo::count_mini_batch(batch.mask.narrow(0, share.first, share.rows));
  CHECK(counts == dapo::count_mini_batch(batch.mask));
  const dapo::PolicyLossOptions micro_options = dapo::micro_batch_options(options, counts);
  torch::Tensor total = torch::zeros({}, batch.logp.options().dtype(torch::kFloat64));
  for (const auto& micro : plan.micro_batches) {
    auto rows = [&](const torch::Tensor& t) { return t.narrow(0, micro.range.first, micro.range.rows); };
    auto block = [&](const torch::Tensor& t) { return rows(t).narrow(1, 0, micro.cols); };
    const auto out = loss_fn(block(batch.logp), block(batch.old_logp),
                             c.per_token_advantages ? block(batch.advantages) : rows(batch.advantages),
                             block(batch.mask), micro_options);
    total = total + out.loss.to(torch::kFloat64);
  }
  total.backward();
  return {total.item<double>(), dapo::test::values(batch.logp.grad())};
}

Accumulated one_shot(const LossCase& c, const dapo::PolicyLossOptions& options, LossFn loss_fn) {
  const Batch batch = batch_of(c, torch::kFloat64, false);
  const auto out = loss_fn(batch.logp, batch.old_logp, batch.advantages, batch.mask, options);
  out.loss.backward();
  return {out.loss.item<double>(), dapo::test::values(batch.logp.grad())};
}

void check_close(const Accumulated& actual, double loss, const std::vector<double>& grad, double tolerance) {
  CHECK(dapo::test::close(actual.loss, loss, tolerance, tolerance));
  REQUIRE(actual.grad.size() == grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) {
    CAPTURE(i);
    CHECK(dapo::test::close(actual.grad[i], grad[i], tolerance, tolerance));
  }
}

}  // namespace

TEST_CASE("tensor front end: micro-batches and ranks of every golden case add up to the golden loss and gradient") {
  const auto cases = dapo::test::golden_loss_cases();
  if (cases.empty()) return;
  int checked = 0;
  for (const auto& c : cases) {
    std::vector<dapo::PolicyLossOptions> variants{c.options};
    if (c.options.aggregation == LossAggregation::kSeqMeanTokenSumNorm) {
      REQUIRE(c.options.norm_length == static_cast<double>(c.cols));  // so 0 (the mini-batch's T) means the same
      variants.push_back(c.options);
      variants.back().norm_length = 0.0;
    }
    for (const auto& options : variants) {
      for (const LossFn loss_fn : {kFused, kReference}) {
        CAPTURE(c.name);
        CAPTURE(options.norm_length);
        CAPTURE(loss_fn == kFused);
        const Accumulated expected = one_shot(c, options, loss_fn);
        check_close(expected, c.loss, c.grad_logp, 1e-12);
        for (const auto& split : dapo::test::kSplits) {
          CAPTURE(split.name());
          check_close(accumulate(c, options, split, loss_fn, torch::kFloat64, false), c.loss, c.grad_logp, 1e-12);
          check_close(accumulate(c, options, split, loss_fn, torch::kFloat64, true), expected.loss, expected.grad,
                      1e-12);
          if (loss_fn == kFused) {
            check_close(accumulate(c, options, split, loss_fn, torch::kFloat32, true), c.loss, c.grad_logp, 1e-5);
          }
          ++checked;
        }
      }
    }
  }
  CHECK(checked == (80 + 16) * 2 * 4);
}

TEST_CASE("tensor front end: ragged masks with empty rows and an all-empty micro-batch accumulate to the one-shot") {
  std::mt19937_64 rng(77);
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    CAPTURE(name);
    LossCase c =
        dapo::test::random_loss_case(rng, 8, 11, true, {.dual_clip = 3.0, .aggregation = aggregation, .group_size = 2});
    // Rows 0 and 1 empty (under group-token-mean only row 1), the others ragged with holes.
    const std::vector<int64_t> lengths{aggregation == LossAggregation::kGroupTokenMean ? 4 : 0, 0, 11, 3, 1, 0, 7, 9};
    for (int64_t row = 0; row < c.rows; ++row) {
      for (int64_t col = 0; col < c.cols; ++col) {
        const bool hole = col % 4 == 2;
        c.mask[static_cast<std::size_t>(row * c.cols + col)] = col < lengths[row] && !hole ? 1.0 : 0.0;
      }
    }
    for (const LossFn loss_fn : {kFused, kReference}) {
      CAPTURE(loss_fn == kFused);
      const Accumulated expected = one_shot(c, c.options, loss_fn);
      for (const auto& split : dapo::test::kSplits) {
        CAPTURE(split.name());
        check_close(accumulate(c, c.options, split, loss_fn, torch::kFloat64, false), expected.loss, expected.grad,
                    1e-12);
      }
    }
  }
}

TEST_CASE("count_mini_batch on tensors: bool and floating masks, any device's; errors name the mask") {
  const auto mask = torch::tensor({1, 1, 0, 0, 0, 0, 1, 0, 1}, torch::kFloat32).reshape({3, 3});
  const dapo::MiniBatchCounts expected{.tokens = 4, .rows = 3, .nonempty_rows = 2, .cols = 3};
  CHECK(dapo::count_mini_batch(mask) == expected);
  CHECK(dapo::count_mini_batch(mask.to(torch::kBool)) == expected);
  CHECK(dapo::count_mini_batch(mask.to(torch::kBFloat16)) == expected);
  CHECK(dapo::count_mini_batch(mask.to(torch::kFloat64).t().contiguous().t()) == expected);  // column-major
  CHECK(dapo::count_mini_batch(torch::zeros({0, 5})) == dapo::MiniBatchCounts{.cols = 5});

  CHECK_THROWS_WITH_AS(dapo::count_mini_batch(torch::ones({4})),
                       doctest::Contains("dapo::count_mini_batch: mask has shape [4], expected 2 dimensions"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::count_mini_batch(torch::ones({2, 2}, torch::kLong)),
                       doctest::Contains("mask has dtype Long, expected bool or a floating dtype holding 0 and 1"),
                       std::invalid_argument);
  auto half = mask.clone();
  half[1][2] = 0.5;
  CHECK_THROWS_WITH_AS(dapo::count_mini_batch(half),
                       doctest::Contains("dapo::count_mini_batch: mask[1, 2] is 0.5, expected 0 or 1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::count_mini_batch(torch::Tensor()), doctest::Contains("mask is an undefined tensor"),
                       std::invalid_argument);
}

TEST_CASE("tensor front ends check the global counts against the batch: fused in its pass, reference by tensor ops") {
  const auto logp = torch::zeros({3, 4}, torch::kFloat64);
  const auto advantages = torch::tensor({1.0, -1.0, 0.5}, torch::kFloat64);
  const auto mask = torch::tensor({1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, torch::kBool).reshape({3, 4});
  for (const LossFn loss_fn : {kFused, kReference}) {
    CAPTURE(loss_fn == kFused);
    CHECK_THROWS_WITH_AS(
        loss_fn(logp, logp, advantages, mask,
                {.aggregation = LossAggregation::kSeqMeanTokenSum, .global_row_count = 1}),
        doctest::Contains("global_row_count is 1 but this batch alone holds 2 rows with a masked token"),
        std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        loss_fn(logp, logp, advantages, mask,
                {.aggregation = LossAggregation::kSeqMeanTokenSumNorm, .global_row_count = 1}),
        doctest::Contains("global_row_count is 1 but this batch alone holds 2 rows with a masked token"),
        std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        loss_fn(logp, logp, advantages, mask,
                {.aggregation = LossAggregation::kGroupTokenMean, .group_size = 3, .global_group_count = 0.5}),
        doctest::Contains("global_group_count is 0.5 but this batch alone holds 1 groups"), std::invalid_argument);
    // Two non-empty rows out of a mini-batch's eight: the seq-mean-token-sum loss is this batch's sum / 8.
    const auto out = loss_fn(logp, logp, advantages, mask,
                             {.aggregation = LossAggregation::kSeqMeanTokenSum, .global_row_count = 8});
    CHECK(out.loss.item<double>() == doctest::Approx(-(2 * 1.0 + 1 * 0.5) / 8));
  }
}
