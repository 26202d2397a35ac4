// The advantage estimators by verl's names: every advantage case of verl_zoo.json (verl's own functions, float64) in
// double (1e-10) and float (1e-5), advantages and returns; groups by a prompt index whose rows are not adjacent; and
// the errors that name what is wrong.
#include <dapo/core/advantage_estimator.hpp>

#include <string>
#include <vector>

#include "support/zoo_advantage_case.hpp"

TEST_CASE("core estimate_advantages matches every advantage case of verl_zoo.json: advantages and returns") {
  const auto cases = dapo::test::zoo_advantage_cases();
  if (!cases) return;
  for (const auto& c : *cases) {
    CAPTURE(c.name);
    std::vector<double> advantages(c.advantages.size()), returns(c.returns.size());
    dapo::core::estimate_advantages<double>(c.token_level_rewards, c.response_mask, c.index, c.rows, c.cols, c.options,
                                            advantages, returns);
    const std::vector<float> rewards_f(c.token_level_rewards.begin(), c.token_level_rewards.end()),
        mask_f(c.response_mask.begin(), c.response_mask.end());
    std::vector<float> advantages_f(c.advantages.size()), returns_f(c.returns.size());
    dapo::core::estimate_advantages<float>(rewards_f, mask_f, c.index, c.rows, c.cols, c.options, advantages_f,
                                           returns_f);
    for (std::size_t i = 0; i < advantages.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(advantages[i], c.advantages[i], 1e-10, 1e-12));
      CHECK(dapo::test::close(returns[i], c.returns[i], 1e-10, 1e-12));
      CHECK(dapo::test::close(advantages_f[i], c.advantages[i], 1e-5, 1e-5));
      CHECK(dapo::test::close(returns_f[i], c.returns[i], 1e-5, 1e-5));
    }
  }
}

TEST_CASE("estimators group rows by the prompt index wherever they sit, and name their errors") {
  using dapo::AdvantageEstimator;
  // Two prompts interleaved: rows 0, 2 are prompt 7; rows 1, 3 prompt 3. One token per row.
  const std::vector<double> rewards{1.0, 0.0, 0.0, 1.0}, mask{1.0, 1.0, 1.0, 1.0};
  const std::vector<int64_t> index{7, 3, 7, 3};
  std::vector<double> advantages(4);
  dapo::core::estimate_advantages<double>(rewards, mask, index, 4, 1, {.estimator = AdvantageEstimator::kRloo},
                                          advantages);
  CHECK(advantages == std::vector<double>{1.0, -1.0, -1.0, 1.0});  // s - mean of the others
  dapo::core::estimate_advantages<double>(
      rewards, mask, index, 4, 1, {.estimator = AdvantageEstimator::kGrpo, .norm_adv_by_std = false}, advantages);
  CHECK(advantages == std::vector<double>{0.5, -0.5, -0.5, 0.5});
  CHECK_THROWS_WITH_AS(
      dapo::core::estimate_advantages<double>(rewards, mask, std::vector<int64_t>{1, 1, 1, 2}, 4, 1,
                                              {.estimator = AdvantageEstimator::kGrpoPassk}, advantages),
      doctest::Contains("grpo_passk needs at least 2 rows per prompt; index 2 has 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      dapo::core::estimate_advantages<double>(rewards, mask, std::vector<int64_t>{1, 1, 1}, 4, 1, {}, advantages),
      doctest::Contains("index has 3 elements, expected B = 4"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::advantage_estimator_from_name("gae"),
                       doctest::Contains("unknown advantage estimator 'gae', expected one of grpo, grpo_passk"),
                       std::invalid_argument);
}
