// The policy loss on plain buffers: goldens (loss, metrics, d loss / d logp), finite differences, properties, errors.
#include <dapo/core/loss.hpp>

#include <algorithm>
#include <numeric>
#include <random>

#include "support/loss_case.hpp"
#include "support/vectors.hpp"

namespace {

using dapo::test::as;

template <class T>
dapo::core::PolicyLossResult run(const dapo::test::LossCase& c, std::vector<T>* grad = nullptr) {
  const auto logp = as<T>(c.logp), old_logp = as<T>(c.old_logp), advantages = as<T>(c.advantages), mask = as<T>(c.mask);
  if (grad != nullptr) grad->assign(logp.size(), T(0));
  return dapo::core::policy_loss<T>(logp, old_logp, advantages, mask, c.rows, c.cols, c.options,
                                    grad != nullptr ? std::span<T>(*grad) : std::span<T>());
}

}  // namespace

TEST_CASE("core policy_loss matches every golden case (double 1e-9, float 1e-5)") {
  const auto cases = dapo::test::golden_loss_cases();
  if (cases.empty()) return;
  CHECK(cases.size() == 80);
  for (const auto& c : cases) {
    CAPTURE(c.name);
    std::vector<double> grad;
    const auto result = run<double>(c, &grad);
    CHECK(dapo::test::close(result.loss, c.loss, 1e-9, 1e-15));
    CHECK(dapo::test::close(result.clip_fraction, c.clip_fraction, 1e-9, 1e-15));
    CHECK(dapo::test::close(result.dual_clip_fraction, c.dual_clip_fraction, 1e-9, 1e-15));
    CHECK(dapo::test::close(result.approx_kl, c.approx_kl, 1e-9, 1e-15));
    for (std::size_t i = 0; i < grad.size(); ++i) CHECK(dapo::test::close(grad[i], c.grad_logp[i], 1e-9, 1e-15));

    std::vector<float> grad_f;
    const auto result_f = run<float>(c, &grad_f);
    CHECK(dapo::test::close(result_f.loss, c.loss, 1e-5, 1e-6));
    CHECK(dapo::test::close(result_f.approx_kl, c.approx_kl, 1e-5, 1e-6));
    for (std::size_t i = 0; i < grad.size(); ++i) CHECK(dapo::test::close(grad_f[i], c.grad_logp[i], 1e-5, 1e-6));
  }
}

TEST_CASE("core policy_loss gradient agrees with central finite differences in double") {
  std::mt19937_64 rng(7);
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const double dual_clip : {0.0, 3.0}) {
      for (const bool per_token : {false, true}) {
        dapo::PolicyLossOptions options{.dual_clip = dual_clip, .aggregation = aggregation, .group_size = 2};
        auto c = dapo::test::random_loss_case(rng, 6, 9, per_token, options);
        CAPTURE(name);
        CAPTURE(dual_clip);
        std::vector<double> grad;
        run<double>(c, &grad);
        constexpr double kStep = 1e-6;
        for (std::size_t i = 0; i < c.logp.size(); ++i) {
          const double saved = c.logp[i];
          c.logp[i] = saved + kStep;
          const double up = run<double>(c).loss;
          c.logp[i] = saved - kStep;
          const double down = run<double>(c).loss;
          c.logp[i] = saved;
          // The objective is piecewise smooth; a step across a clip boundary is the only way to differ.
          CHECK(dapo::test::close(grad[i], (up - down) / (2 * kStep), 1e-5, 1e-8));
        }
      }
    }
  }
}

TEST_CASE("ratio 1 everywhere: no clipping, zero KL, loss = -mean advantage") {
  const std::vector<double> logp{-1.0, -2.0, -0.5, -3.0, -0.1, -0.2};
  const std::vector<double> advantages{1.0, -0.5};
  const std::vector<double> mask{1, 1, 1, 1, 1, 0};
  const auto result = dapo::core::policy_loss<double>(
      logp, logp, advantages, mask, 2, 3, {.dual_clip = 3.0, .aggregation = dapo::LossAggregation::kTokenMean});
  CHECK(result.clip_fraction == 0.0);
  CHECK(result.dual_clip_fraction == 0.0);
  CHECK(result.approx_kl == 0.0);
  CHECK(result.loss == doctest::Approx(-(3 * 1.0 + 2 * -0.5) / 5.0));
  CHECK(result.token_count == 5.0);
}

TEST_CASE("decoupled clip: a positive advantage is clipped above 1 + clip_high, a negative one below 1 - clip_low") {
  const std::vector<double> old_logp{0.0, 0.0};
  const std::vector<double> mask{1, 1};
  // Row 0: ratio e^0.3 = 1.35 > 1.28 with A > 0 -> clipped. Row 1: ratio e^-0.3 = 0.74 < 0.8 with A < 0 -> clipped.
  const std::vector<double> logp{0.3, -0.3};
  const std::vector<double> advantages{1.0, -1.0};
  std::vector<double> grad(2);
  auto result = dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 2, 1, {}, grad);
  CHECK(result.clip_fraction == 1.0);
  CHECK(grad[0] == 0.0);
  CHECK(grad[1] == 0.0);
  CHECK(result.loss == doctest::Approx((-1.28 + 0.8) / 2));
  // Ratio 1.25 sits inside [0.8, 1.28]: Clip-Higher lets the positive token still move (GRPO's 1.2 would not).
  const std::vector<double> inside{std::log(1.25), std::log(0.85)};
  result = dapo::core::policy_loss<double>(inside, old_logp, advantages, mask, 2, 1, {}, grad);
  CHECK(result.clip_fraction == 0.0);
  CHECK(grad[0] == doctest::Approx(-1.25 / 2));
  result = dapo::core::policy_loss<double>(inside, old_logp, advantages, mask, 2, 1,
                                           {.clip_low = 0.2, .clip_high = 0.2}, grad);
  CHECK(result.clip_fraction == 0.5);
  CHECK(grad[0] == 0.0);
}

TEST_CASE("dual clip caps the loss of negative-advantage tokens at -A * c") {
  const std::vector<double> logp{2.0}, old_logp{0.0}, advantages{-1.0}, mask{1.0};
  std::vector<double> grad(1);
  const auto capped = dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 1, 1, {.dual_clip = 3.0}, grad);
  CHECK(capped.loss == doctest::Approx(3.0));
  CHECK(capped.dual_clip_fraction == 1.0);
  CHECK(grad[0] == 0.0);
  const auto uncapped = dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 1, 1, {}, grad);
  CHECK(uncapped.loss == doctest::Approx(std::exp(2.0)));
  CHECK(uncapped.dual_clip_fraction == 0.0);
  CHECK(grad[0] == doctest::Approx(std::exp(2.0)));
}

TEST_CASE("permuting groups (and rows within a group) does not change the token-mean loss") {
  std::mt19937_64 rng(11);
  const auto c = dapo::test::random_loss_case(rng, 8, 7, false, {.group_size = 2});
  const double reference = run<double>(c).loss;
  std::vector<int64_t> order(c.rows);
  std::iota(order.begin(), order.end(), 0);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    auto permuted = c;
    for (int64_t b = 0; b < c.rows; ++b) {
      std::copy_n(c.logp.begin() + order[b] * c.cols, c.cols, permuted.logp.begin() + b * c.cols);
      std::copy_n(c.old_logp.begin() + order[b] * c.cols, c.cols, permuted.old_logp.begin() + b * c.cols);
      std::copy_n(c.mask.begin() + order[b] * c.cols, c.cols, permuted.mask.begin() + b * c.cols);
      permuted.advantages[b] = c.advantages[order[b]];
    }
    CHECK(run<double>(permuted).loss == doctest::Approx(reference).epsilon(1e-12));
  }
}

TEST_CASE("token-mean weighs tokens, seq-mean-token-mean weighs responses") {
  // One long and one short response, both ratio 1: token-mean averages all 4 tokens, GRPO averages the two rows.
  const std::vector<double> logp{-1, -1, -1, -1, -1, -1}, advantages{1.0, -1.0}, mask{1, 1, 1, 1, 0, 0};
  auto loss = [&](dapo::LossAggregation aggregation) {
    return dapo::core::policy_loss<double>(logp, logp, advantages, mask, 2, 3, {.aggregation = aggregation}).loss;
  };
  CHECK(loss(dapo::LossAggregation::kTokenMean) == doctest::Approx(-(3 * 1.0 - 1.0) / 4));
  CHECK(loss(dapo::LossAggregation::kSeqMeanTokenMean) == doctest::Approx(0.0));
  CHECK(loss(dapo::LossAggregation::kSeqMeanTokenSum) == doctest::Approx(-(3.0 - 1.0) / 2));
  CHECK(loss(dapo::LossAggregation::kSeqMeanTokenSumNorm) == doctest::Approx(-(3.0 - 1.0) / (3 * 2)));
}

TEST_CASE("global_token_count divides token-mean by the count of all micro-batches") {
  const std::vector<double> logp{-1, -1}, advantages{2.0}, mask{1, 1};
  const auto local = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 2, {});
  const auto global = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 2, {.global_token_count = 8.0});
  CHECK(local.loss == doctest::Approx(-2.0));
  CHECK(global.loss == doctest::Approx(-2.0 * 2 / 8));
  CHECK(global.approx_kl == 0.0);
}

TEST_CASE("an all-masked batch gives zeros; an empty group under group-token-mean is an error") {
  const std::vector<double> logp{-1, -1, -1, -1}, advantages{1.0, 2.0}, mask{0, 0, 0, 0};
  std::vector<double> grad(4, 7.0);
  const auto result = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 2, 2, {}, grad);
  CHECK(result.loss == 0.0);
  CHECK(result.clip_fraction == 0.0);
  CHECK(grad == std::vector<double>(4, 0.0));
  const std::vector<double> half{1, 1, 0, 0};
  CHECK_THROWS_WITH_AS(
      dapo::core::policy_loss<double>(logp, logp, advantages, half, 2, 2,
                                      {.aggregation = dapo::LossAggregation::kGroupTokenMean, .group_size = 1}),
      doctest::Contains("group 1 (rows 1..1) has no masked token"), std::invalid_argument);
}

TEST_CASE("core policy_loss rejects bad shapes and options with messages naming them") {
  const std::vector<double> four(4, -1.0), two(2, 1.0), mask(4, 1.0);
  using dapo::core::policy_loss;
  CHECK_THROWS_WITH_AS(policy_loss<double>(std::span(four).first(3), four, two, mask, 2, 2),
                       doctest::Contains("logp has 3 elements, expected B * T = 2 * 2"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, std::vector<double>(3), mask, 2, 2),
                       doctest::Contains("advantages has 3 elements, expected B = 2 or B * T = 4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, two, std::vector<double>{1, 0.5, 1, 1}, 2, 2),
                       doctest::Contains("mask[0, 1] is 0.5, expected 0 or 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, two, mask, 2, 2, {.clip_low = -0.1}),
                       doctest::Contains("clip_low is -0.1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, two, mask, 2, 2, {.clip_high = -1}),
                       doctest::Contains("clip_high is -1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, two, mask, 2, 2, {.dual_clip = 0.5}),
                       doctest::Contains("dual_clip is 0.5, expected 0 (disabled) or a finite value > 1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      policy_loss<double>(four, four, two, mask, 2, 2, {.aggregation = dapo::LossAggregation::kGroupTokenMean}),
      doctest::Contains("group-token-mean needs group_size >= 1, got 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, two, mask, 2, 2,
                                           {.aggregation = dapo::LossAggregation::kGroupTokenMean, .group_size = 3}),
                       doctest::Contains("batch has 2 rows, which group_size = 3 does not divide"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      policy_loss<double>(four, four, two, mask, 2, 2,
                          {.aggregation = dapo::LossAggregation::kSeqMeanTokenMean, .global_token_count = 10}),
      doctest::Contains("a global token count only applies to token-mean"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(policy_loss<double>(four, four, two, mask, 2, 2, {.global_token_count = 3}),
                       doctest::Contains("global_token_count is 3 but this batch alone holds 4 masked tokens"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::aggregation_from_name("token_mean"),
                       doctest::Contains("unknown loss aggregation 'token_mean', expected one of token-mean"),
                       std::invalid_argument);
}

TEST_CASE("every SIMD width of the float kernel agrees with the double kernel (all aggregations, dual clip, masks)") {
  std::mt19937_64 rng(21);
  std::vector<int> widths{1};
  for (const int lanes : {4, 8, 16}) {
    if (lanes <= dapo::simd::widest_float_lanes()) widths.push_back(lanes);
  }
  MESSAGE("float kernel widths tested: " << widths.size()
                                         << " (widest on this CPU: " << dapo::simd::widest_float_lanes() << ")");
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const double dual_clip : {0.0, 3.0}) {
      for (const bool per_token : {false, true}) {
        // 37 columns: full vectors plus a ragged tail for every width.
        const auto c = dapo::test::random_loss_case(
            rng, 8, 37, per_token, {.dual_clip = dual_clip, .aggregation = aggregation, .group_size = 4});
        std::vector<double> expected_grad(c.logp.size());
        const auto expected = dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, c.rows, c.cols,
                                                              c.options, expected_grad);
        const auto logp = as<float>(c.logp), old_logp = as<float>(c.old_logp), advantages = as<float>(c.advantages);
        std::vector<unsigned char> bytes(c.mask.begin(), c.mask.end());
        const bool* mask = reinterpret_cast<const bool*>(bytes.data());
        for (const int lanes : widths) {
          CAPTURE(name);
          CAPTURE(lanes);
          std::vector<float> grad(c.logp.size());
          const dapo::core::PolicyLossInputs<float, float, bool> inputs{
              logp.data(), old_logp.data(), advantages.data(), mask, c.rows, c.cols, per_token};
          const auto out = dapo::core::policy_loss_kernel<float>(inputs, c.options, grad.data(), "test",
                                                                 dapo::core::SerialFor{}, lanes);
          CHECK(dapo::test::close(out.result.loss, expected.loss, 1e-5, 1e-6));
          CHECK(out.result.clip_fraction == doctest::Approx(expected.clip_fraction));
          CHECK(out.result.dual_clip_fraction == doctest::Approx(expected.dual_clip_fraction));
          CHECK(dapo::test::close(out.result.approx_kl, expected.approx_kl, 1e-5, 1e-6));
          for (std::size_t i = 0; i < grad.size(); ++i) {
            CHECK(dapo::test::close(grad[i] * out.grad_scale, expected_grad[i], 1e-5, 1e-7));
          }
        }
      }
    }
  }
  CHECK_THROWS_WITH_AS(dapo::core::policy_loss_kernel<float>(dapo::core::PolicyLossInputs<float, float, bool>{},
                                                             dapo::PolicyLossOptions{}, static_cast<float*>(nullptr),
                                                             "test", dapo::core::SerialFor{}, 3),
                       doctest::Contains("float_lanes is 3"), std::invalid_argument);
}
