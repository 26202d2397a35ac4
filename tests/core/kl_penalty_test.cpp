// KL-penalty estimators on plain buffers: every kl_penalty case of verl_zoo.json (verl's own kl_penalty, value and
// gradient) in double and float, verl's names, the straight-through variants, and errors that name the argument.
#include <dapo/core/kl_penalty.hpp>

#include <string>
#include <vector>

#include "support/kl_case.hpp"

TEST_CASE("core kl_penalty matches every kl_penalty case of verl_zoo.json: value and gradient, double and float") {
  const auto cases = dapo::test::kl_cases();
  if (!cases) return;
  for (const dapo::test::KlCase& kc : *cases) {
    CAPTURE(kc.name);
    CAPTURE(kc.logprob.size());
    const auto& logprob = kc.logprob;
    const auto& ref = kc.ref_logprob;
    const auto& expected = kc.value;
    const auto& expected_grad = kc.grad_logprob;
    const dapo::KlPenalty penalty = dapo::parse_kl_penalty(kc.name);
    std::vector<double> value(logprob.size()), grad(logprob.size());
    dapo::core::kl_penalty<double>(logprob, ref, penalty, value, grad);
    const std::vector<float> logprob_f(logprob.begin(), logprob.end()), ref_f(ref.begin(), ref.end());
    std::vector<float> value_f(logprob.size()), grad_f(logprob.size());
    dapo::core::kl_penalty<float>(logprob_f, ref_f, penalty, value_f, grad_f);
    for (std::size_t i = 0; i < logprob.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(value[i], expected[i], 1e-10, 1e-14));
      CHECK(dapo::test::close(grad[i], expected_grad[i], 1e-10, 1e-14));
      // float32 inputs: the difference d loses ~1e-7 * |logprob|; bounds stated for |logprob| up to ~20.
      CHECK(dapo::test::close(value_f[i], expected[i], 1e-5, 1e-5));
      CHECK(dapo::test::close(grad_f[i], expected_grad[i], 1e-5, 1e-5));
    }
  }
}

TEST_CASE("kl_penalty names: verl's aliases, the + suffix, and an unknown name refused naming the accepted ones") {
  using dapo::KlEstimator;
  const std::pair<const char*, KlEstimator> names[] = {
      {"kl", KlEstimator::kK1}, {"k1", KlEstimator::kK1},         {"abs", KlEstimator::kAbs}, {"mse", KlEstimator::kK2},
      {"k2", KlEstimator::kK2}, {"low_var_kl", KlEstimator::kK3}, {"k3", KlEstimator::kK3}};
  for (const auto& [name, estimator] : names) {
    CAPTURE(name);
    CHECK(dapo::parse_kl_penalty(name).estimator == estimator);
    CHECK_FALSE(dapo::parse_kl_penalty(name).straight_through);
    CHECK(dapo::parse_kl_penalty(std::string(name) + "+").straight_through);
  }
  CHECK(dapo::kl_penalty_name(dapo::parse_kl_penalty("low_var_kl+")) == "k3+");
  CHECK_THROWS_WITH_AS(dapo::parse_kl_penalty("full"), doctest::Contains("kl_penalty is 'full', expected kl/k1"),
                       std::invalid_argument);
}

TEST_CASE("straight through: the estimator's value with k2's gradient; k3 is flat where its clamps hold") {
  const std::vector<double> logprob{-1.0, -2.5, -0.1, -30.0}, ref{-1.2, -0.5, -0.1, -1.0};
  std::vector<double> k3(4), k3_grad(4), plus(4), plus_grad(4), k2(4), k2_grad(4);
  dapo::core::kl_penalty<double>(logprob, ref, dapo::parse_kl_penalty("k3"), k3, k3_grad);
  dapo::core::kl_penalty<double>(logprob, ref, dapo::parse_kl_penalty("k3+"), plus, plus_grad);
  dapo::core::kl_penalty<double>(logprob, ref, dapo::parse_kl_penalty("k2"), k2, k2_grad);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(plus[i] == k3[i]);
    CHECK(plus_grad[i] == k2_grad[i]);
    CHECK(k2_grad[i] == logprob[i] - ref[i]);
  }
  CHECK(k3[2] == 0.0);       // the same log-probs: no divergence
  CHECK(k3[3] == 10.0);      // exp(29) - 30: clamped to 10
  CHECK(k3_grad[3] == 0.0);  // and flat there
  CHECK(k3_grad[0] == doctest::Approx(1.0 - std::exp(-0.2)));
}

TEST_CASE("core kl_penalty refuses buffers of different lengths, naming them") {
  const std::vector<double> logprob{-1.0, -2.0}, ref{-1.0};
  std::vector<double> value(2), grad(1);
  CHECK_THROWS_WITH_AS(dapo::core::kl_penalty<double>(logprob, ref, {}, value),
                       doctest::Contains("ref_logprob has 1 elements but logprob has 2"), std::invalid_argument);
  const std::vector<double> ref2{-1.0, -2.0};
  CHECK_THROWS_WITH_AS(dapo::core::kl_penalty<double>(logprob, ref2, {}, value, grad),
                       doctest::Contains("grad_logprob has 1 elements but logprob has 2"), std::invalid_argument);
}
