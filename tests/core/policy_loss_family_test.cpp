// The loss family beyond verl's cases: every SIMD width of the float kernel against the double one for each
// token-level loss (per-row and per-token advantages, weights, far log-ratios and tiny probabilities), the names,
// and the option errors that name the option.
#include <dapo/core/loss.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/loss_case.hpp"
#include "support/vectors.hpp"

namespace {

using dapo::test::as;

}  // namespace

TEST_CASE("every token-level loss: each SIMD width of the float kernel agrees with the double kernel") {
  using dapo::PolicyLossMode;
  std::mt19937_64 rng(2027);
  std::vector<int> widths{1};
  for (const int lanes : {4, 8, 16}) {
    if (lanes <= dapo::simd::widest_float_lanes()) widths.push_back(lanes);
  }
  int checked = 0;
  for (const auto& [mode, name] : dapo::kPolicyLossNames) {
    if (!dapo::is_token_level(mode)) continue;
    for (const auto aggregation : {dapo::LossAggregation::kTokenMean, dapo::LossAggregation::kSeqMeanTokenMean}) {
      for (const bool per_token : {false, true}) {
        for (const bool weighted : {false, true}) {
          dapo::PolicyLossOptions options{.aggregation = aggregation, .mode = mode, .dro_beta = 0.5};
          if (mode == PolicyLossMode::kDppoTv || mode == PolicyLossMode::kDppoKl) {
            options.clip_low = 0.05;
            options.clip_high = 0.08;
            options.ratio_cap = 4.0;
          }
          auto c = dapo::test::random_loss_case(rng, 6, 37, per_token, options);
          // A few far log-ratios (beyond the +-20 clamp), tiny probabilities (exp below float's range) and large
          // ratios, so every select of every loss is taken somewhere.
          c.logp[3] = c.old_logp[3] + 25.0;
          c.logp[5] = c.old_logp[5] - 30.0;
          c.logp[7] = -120.0;
          c.old_logp[9] = -95.0;
          c.logp[11] = c.old_logp[11] + 1.7;
          std::vector<double> weights;
          if (weighted) {
            std::uniform_real_distribution<double> uniform(0.0, 2.0);
            for (std::size_t i = 0; i < c.logp.size(); ++i) weights.push_back(uniform(rng));
          }
          std::vector<double> expected_grad(c.logp.size());
          const auto expected = dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, c.rows,
                                                                c.cols, options, expected_grad, weights);
          const auto logp = as<float>(c.logp), old_logp = as<float>(c.old_logp), advantages = as<float>(c.advantages),
                     weights_f = as<float>(weights), mask = as<float>(c.mask);
          for (const int lanes : widths) {
            CAPTURE(name);
            CAPTURE(dapo::aggregation_name(aggregation));
            CAPTURE(per_token);
            CAPTURE(weighted);
            CAPTURE(lanes);
            std::vector<float> grad(c.logp.size());
            const dapo::core::PolicyLossInputs<float, float, float> inputs{
                logp.data(), old_logp.data(), advantages.data(), mask.data(),
                c.rows,      c.cols,          per_token,         weighted ? weights_f.data() : nullptr};
            const auto out = dapo::core::policy_loss_kernel<float>(inputs, options, grad.data(), "test",
                                                                   dapo::core::SerialFor{}, lanes);
            // Relative to the loss's scale: a ratio of e^20 makes single terms large.
            const double scale = 1.0 + std::abs(expected.loss);
            CHECK(std::abs(out.result.loss - expected.loss) <= 1e-5 * scale);
            CHECK(out.result.clip_fraction == doctest::Approx(expected.clip_fraction));
            CHECK(out.result.dual_clip_fraction == doctest::Approx(expected.dual_clip_fraction));
            CHECK(dapo::test::close(out.result.approx_kl, expected.approx_kl, 1e-5, 1e-5));
            for (std::size_t i = 0; i < grad.size(); ++i) {
              CAPTURE(i);
              CHECK(dapo::test::close(grad[i] * out.grad_scale, expected_grad[i], 1e-5, 1e-6));
            }
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked == 8 * 2 * 2 * 2 * static_cast<int>(widths.size()));
}

TEST_CASE("policy loss names: verl's loss_mode names both ways, and an unknown one refused naming them all") {
  for (const auto& [mode, name] : dapo::kPolicyLossNames) {
    CHECK(dapo::policy_loss_from_name(name) == mode);
    CHECK(dapo::policy_loss_name(mode) == name);
  }
  CHECK_THROWS_WITH_AS(dapo::policy_loss_from_name("grpo"),
                       doctest::Contains("unknown policy loss 'grpo', expected one of vanilla, gspo, sapo, cispo, "
                                         "geo_mean, dppo_tv, dppo_kl, dro, kl_cov, clip_cov, gpg"),
                       std::invalid_argument);
  CHECK(dapo::aggregation_from_name("token-sum") == dapo::LossAggregation::kTokenSum);
  CHECK(dapo::verl_aggregation(dapo::PolicyLossMode::kGspo, dapo::LossAggregation::kTokenMean) ==
        dapo::LossAggregation::kSeqMeanTokenMean);
  CHECK(dapo::verl_aggregation(dapo::PolicyLossMode::kCispo, dapo::LossAggregation::kTokenSum) ==
        dapo::LossAggregation::kTokenSum);
}

TEST_CASE("the family's options are checked, each error naming the option and the loss") {
  const std::vector<double> logp{-1.0, -2.0}, advantages{1.0}, mask{1.0, 1.0};
  auto loss = [&](const dapo::PolicyLossOptions& options) {
    return dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 2, options).loss;
  };
  using M = dapo::PolicyLossMode;
  CHECK_THROWS_WITH_AS(loss({.mode = M::kDro}), doctest::Contains("dro_beta is 0, expected a finite value > 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.dual_clip = 3.0, .mode = M::kCispo}),
                       doctest::Contains("dual_clip is 3 but the loss is cispo; the dual clip is vanilla's"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.mode = M::kSapo, .tau_neg = 0.0}),
                       doctest::Contains("tau_neg is 0, expected a finite value > 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.mode = M::kKlCov, .kl_cov_ratio = 1.5}),
                       doctest::Contains("kl_cov_ratio is 1.5, expected a value in (0, 1]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.clip_low = 1.5, .mode = M::kGspo}),
                       doctest::Contains("clip_low is 1.5, expected a value in [0, 1]"), std::invalid_argument);
  CHECK(loss({.clip_low = 1.5, .mode = M::kGeoMean}) == doctest::Approx(-1.0));  // a log-ratio bound: any >= 0
  CHECK_THROWS_WITH_AS(loss({.mode = M::kClipCov}),
                       doctest::Contains("the clip_cov loss draws tokens at random: pass a choice"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(loss({.mode = M::kGpg, .count_epsilon = -1.0}),
                       doctest::Contains("count_epsilon is -1, expected a value in [0, 1)"), std::invalid_argument);
  const std::vector<double> weights{1.0};
  std::vector<double> grad(2);
  CHECK_THROWS_WITH_AS(dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 2, {}, grad, weights),
                       doctest::Contains("weights has 1 elements, expected 0 (none) or 2"), std::invalid_argument);
}

TEST_CASE("token-sum: the plain masked sum, and every loss's value at ratio 1 is its policy-gradient surrogate") {
  // At logp == old_logp every ratio is 1: vanilla, gspo, cispo... give -A per token (cispo, dppo, gpg, dro: -A logp).
  const std::vector<double> logp{-0.5, -1.5, -2.0, -0.25}, advantages{2.0, -1.0}, mask{1.0, 1.0, 1.0, 0.0};
  using M = dapo::PolicyLossMode;
  const auto sum = [&](M mode) {
    const dapo::PolicyLossOptions options{
        .aggregation = dapo::LossAggregation::kTokenSum, .mode = mode, .dro_beta = 1.0};
    return dapo::core::policy_loss<double>(logp, logp, advantages, mask, 2, 2, options).loss;
  };
  CHECK(sum(M::kVanilla) == doctest::Approx(-2.0 - 2.0 + 1.0));
  CHECK(sum(M::kGspo) == doctest::Approx(-2.0 - 2.0 + 1.0));
  CHECK(sum(M::kSapo) == doctest::Approx(-2.0 * (2.0 * 2.0) + 2.0 / 1.05));  // gate 2 / tau, A 2 (two tokens), -1
  CHECK(sum(M::kCispo) == doctest::Approx(-(2.0 * -0.5 + 2.0 * -1.5 - 1.0 * -2.0)));
  CHECK(sum(M::kGpg) == doctest::Approx(-(2.0 * -0.5 + 2.0 * -1.5 - 1.0 * -2.0)));
  CHECK(sum(M::kDro) == doctest::Approx(-(2.0 * -0.5 + 2.0 * -1.5 - 1.0 * -2.0)));
}

TEST_CASE("TRL's two-sided clip delta: the unclipped ratio capped at delta, flat above it; every SIMD width agrees") {
  // One token, ratio 3, A = -1, clip 0.2 / 0.28, delta 2: -A * min(3, 2) = 2 beats -A * 1.28, and is flat in logp.
  const std::vector<double> logp{std::log(3.0)}, old_logp{0.0}, advantages{-1.0}, mask{1.0};
  std::vector<double> grad(1);
  const dapo::PolicyLossOptions two_sided{.delta = 2.0};
  CHECK(dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 1, 1, two_sided, grad).loss ==
        doctest::Approx(2.0));
  CHECK(grad[0] == 0.0);
  CHECK(dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 1, 1, {}, grad).loss == doctest::Approx(3.0));
  CHECK(grad[0] == doctest::Approx(3.0));  // -A * ratio without delta
  CHECK_THROWS_WITH_AS(dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 1, 1, {.delta = 1.25}),
                       doctest::Contains("delta is 1.25, expected 0 (off) or a finite value > 1 + clip_high = 1.28"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::policy_loss<double>(logp, old_logp, advantages, mask, 1, 1,
                                                       {.mode = dapo::PolicyLossMode::kCispo, .delta = 2.0}),
                       doctest::Contains("the two-sided clip is vanilla's"), std::invalid_argument);
  std::mt19937_64 rng(17);
  std::vector<int> widths{1};
  for (const int lanes : {4, 8, 16}) {
    if (lanes <= dapo::simd::widest_float_lanes()) widths.push_back(lanes);
  }
  for (const double dual_clip : {0.0, 3.0}) {
    const dapo::PolicyLossOptions options{.dual_clip = dual_clip, .delta = 1.5};
    auto c = dapo::test::random_loss_case(rng, 6, 37, false, options);
    for (std::size_t i = 0; i < c.logp.size(); i += 5) c.logp[i] = c.old_logp[i] + 0.9;  // ratios past delta
    std::vector<double> expected_grad(c.logp.size());
    const auto expected = dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, c.rows, c.cols,
                                                          options, expected_grad);
    const auto logp = as<float>(c.logp), old_logp = as<float>(c.old_logp), advantages = as<float>(c.advantages),
               mask = as<float>(c.mask);
    for (const int lanes : widths) {
      CAPTURE(dual_clip);
      CAPTURE(lanes);
      std::vector<float> grad_f(c.logp.size());
      const dapo::core::PolicyLossInputs<float, float, float> inputs{
          logp.data(), old_logp.data(), advantages.data(), mask.data(), c.rows, c.cols, false};
      const auto out =
          dapo::core::policy_loss_kernel<float>(inputs, options, grad_f.data(), "test", dapo::core::SerialFor{}, lanes);
      CHECK(dapo::test::close(out.result.loss, expected.loss, 1e-5, 1e-6));
      for (std::size_t i = 0; i < grad_f.size(); ++i) {
        CHECK(dapo::test::close(grad_f[i] * out.grad_scale, expected_grad[i], 1e-5, 1e-6));
      }
    }
  }
}

TEST_CASE("clip_cov: the candidates by covariance, the caller's draw among them, their loss and gradient 0") {
  // One row, ratio 1 everywhere (nothing clipped). Means: A 0.375, logp -1.625; cov = 1.64, 1.27, 0.14, -0.86, so
  // tokens 0 and 1 lie in (1, 5).
  const std::vector<double> logp{-1.0, -2.0, -0.5, -3.0}, advantages{3.0, -3.0, 0.5, 1.0}, mask{1, 1, 1, 1};
  std::vector<int64_t> asked;
  const dapo::ClipCovChoice first = [&](int64_t candidates, int64_t count) {
    asked = {candidates, count};
    std::vector<int64_t> picks;
    for (int64_t i = 0; i < count; ++i) picks.push_back(i);
    return picks;
  };
  std::vector<double> grad(4);
  const dapo::PolicyLossOptions both{.mode = dapo::PolicyLossMode::kClipCov, .clip_cov_ratio = 0.5};
  auto out = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 4, both, grad, {}, first);
  CHECK(asked == std::vector<int64_t>{2, 2});
  CHECK(out.loss == doctest::Approx((-0.5 - 1.0) / 4));
  CHECK(out.clip_fraction == doctest::Approx(0.5));
  CHECK(grad == std::vector<double>{0.0, 0.0, -0.5 / 4, -1.0 / 4});
  const dapo::PolicyLossOptions one{.mode = dapo::PolicyLossMode::kClipCov, .clip_cov_ratio = 0.25};
  out = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 4, one, grad, {}, first);
  CHECK(asked == std::vector<int64_t>{2, 1});
  CHECK(out.loss == doctest::Approx((3.0 - 0.5 - 1.0) / 4));
  // Any standard generator draws distinct candidates.
  std::mt19937_64 rng(4);
  out = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 4, both, grad, {}, dapo::clip_cov_choice(rng));
  CHECK(out.clip_fraction == doctest::Approx(0.5));
  const dapo::ClipCovChoice bad = [](int64_t, int64_t) { return std::vector<int64_t>{7, 0}; };
  CHECK_THROWS_WITH_AS(dapo::core::policy_loss<double>(logp, logp, advantages, mask, 1, 4, both, grad, {}, bad),
                       doctest::Contains("the clip_cov choice gave 7, expected an index below 2"),
                       std::invalid_argument);
}
