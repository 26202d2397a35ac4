// Aggregation weights: for every aggregation, sum(w * X) is the policy loss whose per-token losses are X (vanilla at
// ratio 1 with per-token advantages -X), its gradient is w * X, and the micro-batch shares' weights add up to the
// whole mini-batch's; a bad shape is refused naming the argument.
#include <dapo/core/accumulation.hpp>
#include <dapo/core/aggregation_weights.hpp>
#include <dapo/core/loss.hpp>

#include <random>
#include <vector>

#include "support/shared.hpp"

namespace {

using dapo::LossAggregation;

constexpr int64_t kRows = 8, kCols = 7, kGroupSize = 4;
constexpr double kTolerance = 1e-12;  // relative and absolute, float64

struct Batch {
  std::vector<double> mask, terms;  // [kRows, kCols]
};

// A ragged mask (row 2 empty, row 5 full) and terms in [-2, 2]: every group of kGroupSize rows has a token.
Batch random_batch(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> length(1, kCols);
  std::uniform_real_distribution<double> term(-2.0, 2.0);
  Batch batch{std::vector<double>(kRows * kCols, 0.0), std::vector<double>(kRows * kCols)};
  for (int64_t row = 0; row < kRows; ++row) {
    const int64_t tokens = row == 2 ? 0 : row == 5 ? kCols : length(rng);
    for (int64_t col = 0; col < tokens; ++col) batch.mask[row * kCols + col] = 1.0;
  }
  for (double& value : batch.terms) value = term(rng);
  return batch;
}

std::vector<double> weights_of(std::span<const double> mask, int64_t rows, const dapo::PolicyLossOptions& options) {
  std::vector<double> weights(mask.size());
  dapo::core::aggregation_weights<double, double>(mask, rows, kCols, options, weights);
  return weights;
}

double weighted_sum(std::span<const double> weights, std::span<const double> terms) {
  double sum = 0.0;
  for (std::size_t i = 0; i < weights.size(); ++i) sum += weights[i] * terms[i];
  return sum;
}

const LossAggregation kAggregations[] = {LossAggregation::kTokenMean,           LossAggregation::kGroupTokenMean,
                                         LossAggregation::kSeqMeanTokenMean,    LossAggregation::kSeqMeanTokenSum,
                                         LossAggregation::kSeqMeanTokenSumNorm, LossAggregation::kTokenSum};

}  // namespace

TEST_CASE("aggregation weights aggregate any per-token term as the policy loss aggregates its losses") {
  for (const LossAggregation aggregation : kAggregations) {
    for (const double epsilon : {0.0, dapo::kVerlCountEpsilon}) {
      CAPTURE(dapo::aggregation_name(aggregation));
      CAPTURE(epsilon);
      const Batch batch = random_batch(7);
      dapo::PolicyLossOptions options;
      options.aggregation = aggregation;
      options.group_size = kGroupSize;
      options.count_epsilon = epsilon;
      options.norm_length = aggregation == LossAggregation::kSeqMeanTokenSumNorm ? 11.0 : 0.0;
      const std::vector<double> weights = weights_of(batch.mask, kRows, options);
      // Vanilla at ratio 1 (logp = old_logp) with per-token advantage -X: each token's loss is X, d/dlogp is X.
      const std::vector<double> logp(batch.mask.size(), -0.5);
      std::vector<double> advantages(batch.terms.size()), grad(batch.mask.size());
      for (std::size_t i = 0; i < advantages.size(); ++i) advantages[i] = -batch.terms[i];
      const double loss =
          dapo::core::policy_loss<double>(logp, logp, advantages, batch.mask, kRows, kCols, options, grad).loss;
      CHECK(dapo::test::close(weighted_sum(weights, batch.terms), loss, kTolerance, kTolerance));
      for (std::size_t i = 0; i < weights.size(); ++i) {
        CAPTURE(i);
        CHECK(dapo::test::close(weights[i] * batch.terms[i], grad[i], kTolerance, kTolerance));
        if (batch.mask[i] == 0.0) CHECK(weights[i] == 0.0);
      }
    }
  }
}

TEST_CASE("aggregation weights of micro-batch shares add up to the mini-batch's") {
  const Batch batch = random_batch(11);
  const dapo::MiniBatchCounts counts = dapo::core::count_mini_batch<double>(batch.mask, kRows, kCols);
  for (const LossAggregation aggregation : kAggregations) {
    CAPTURE(dapo::aggregation_name(aggregation));
    dapo::PolicyLossOptions options;
    options.aggregation = aggregation;
    options.group_size = kGroupSize;
    const double whole = weighted_sum(weights_of(batch.mask, kRows, options), batch.terms);
    const dapo::PolicyLossOptions share = dapo::micro_batch_options(options, counts);
    double shares = 0.0;
    for (int64_t first = 0; first < kRows; first += kGroupSize) {  // two micro-batches of one group each
      const auto begin = static_cast<std::ptrdiff_t>(first * kCols), end = begin + kGroupSize * kCols;
      const std::vector<double> mask(batch.mask.begin() + begin, batch.mask.begin() + end);
      const std::vector<double> terms(batch.terms.begin() + begin, batch.terms.begin() + end);
      shares += weighted_sum(weights_of(mask, kGroupSize, share), terms);
    }
    CHECK(dapo::test::close(shares, whole, kTolerance, kTolerance));
  }
}

TEST_CASE("aggregation weights refuse a weights buffer of another size, naming it") {
  const Batch batch = random_batch(3);
  const auto weigh = [&](const dapo::PolicyLossOptions& options, std::vector<double>& out) {
    dapo::core::aggregation_weights<double, double>(batch.mask, kRows, kCols, options, out);
  };
  std::vector<double> short_weights(batch.mask.size() - 1);
  CHECK_THROWS_WITH_AS(weigh({}, short_weights), doctest::Contains("weights has 55 elements but mask has 56"),
                       std::invalid_argument);
  dapo::PolicyLossOptions grouped;
  grouped.aggregation = LossAggregation::kGroupTokenMean;
  grouped.group_size = 3;
  std::vector<double> out(batch.mask.size());
  CHECK_THROWS_WITH_AS(weigh(grouped, out), doctest::Contains("group_size 3"), std::invalid_argument);
}
