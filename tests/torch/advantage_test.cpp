// group_advantages and verl's estimators on tensors: goldens in double and float, agreement with the core, errors.
#include <dapo/advantage.hpp>

#include "support/shared.hpp"
#include "support/tensors.hpp"
#include "support/zoo_advantage_case.hpp"

TEST_CASE("torch group_advantages matches every golden case in double and float") {
  const auto cases = dapo::test::algo_golden("advantages");
  if (!cases) return;
  for (const auto& item : *cases) {
    const auto rewards = item.at("rewards").get<std::vector<double>>();
    const auto expected = item.at("expected").get<std::vector<double>>();
    const dapo::AdvantageOptions options{item.at("scale_by_std").get<bool>(), item.at("epsilon").get<double>()};
    const int64_t group_size = item.at("group_size");
    const int64_t n = static_cast<int64_t>(rewards.size());
    const auto in_double =
        dapo::test::values(dapo::group_advantages(dapo::test::tensor(rewards, {n}), group_size, options));
    const auto as_float =
        dapo::group_advantages(dapo::test::tensor(rewards, {n}, torch::kFloat32), group_size, options);
    CHECK(dapo::test::dtype_name(as_float) == "Float");
    const auto in_float = dapo::test::values(as_float);
    std::vector<double> from_core(rewards.size());
    dapo::core::group_advantages<double>(rewards, group_size, from_core, options);
    for (std::size_t i = 0; i < rewards.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(in_double[i], expected[i], 1e-9, 1e-12));
      CHECK(dapo::test::close(in_float[i], expected[i], 1e-5, 1e-6));
      CHECK(dapo::test::close(in_double[i], from_core[i], 1e-12, 1e-14));
    }
  }
}

TEST_CASE("torch group_advantages: each group sums to zero") {
  const auto rewards = torch::rand({64}, torch::kFloat64) * 3.5;
  const auto advantages = dapo::group_advantages(rewards, 8);
  CHECK(advantages.reshape({8, 8}).sum(1).abs().max().item<double>() < 1e-12);
}

TEST_CASE("torch group_advantages with std_over_batch equals the core's (TRL's scale_rewards=\"batch\")") {
  const auto rewards = torch::rand({24}, torch::kFloat64) * 2.5;
  const dapo::AdvantageOptions options{.epsilon = 1e-4, .std_over_batch = true};
  const auto actual = dapo::test::values(dapo::group_advantages(rewards, 6, options));
  const auto values = dapo::test::values(rewards);
  std::vector<double> from_core(values.size());
  dapo::core::group_advantages<double>(values, 6, from_core, options);
  const auto batch_std = rewards.std().item<double>();  // unbiased
  for (std::size_t i = 0; i < values.size(); ++i) {
    CAPTURE(i);
    CHECK(dapo::test::close(actual[i], from_core[i], 1e-12, 1e-14));
  }
  // the scale is the batch's std: rescaled by it, the advantages are the centred rewards
  const auto centred = dapo::test::values(dapo::group_advantages(rewards, 6, {.scale_by_std = false}));
  for (std::size_t i = 0; i < values.size(); ++i)
    CHECK(dapo::test::close(actual[i] * (batch_std + 1e-4), centred[i], 1e-12, 1e-14));
}

TEST_CASE("torch group_advantages rejects bad tensors naming what is wrong") {
  CHECK_THROWS_WITH_AS(dapo::group_advantages(torch::zeros({2, 4}), 4),
                       doctest::Contains("rewards has shape [2, 4], expected 1 dimension"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::group_advantages(torch::zeros({6}, torch::kLong), 2),
                       doctest::Contains("rewards has dtype Long, expected a floating dtype"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::group_advantages(torch::zeros({6}), 4),
                       doctest::Contains("rewards has 6 elements, which group_size = 4 does not divide"),
                       std::invalid_argument);
  auto rewards = torch::zeros({6});
  rewards[3] = std::nan("");
  CHECK_THROWS_WITH_AS(dapo::group_advantages(rewards, 2), doctest::Contains("rewards[3] is nan"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::group_advantages(torch::Tensor(), 2), doctest::Contains("rewards is an undefined tensor"),
                       std::invalid_argument);
}

TEST_CASE("torch estimate_advantages matches every advantage case of verl_zoo.json, float64 and float32") {
  const auto cases = dapo::test::zoo_advantage_cases();
  if (!cases) return;
  for (const auto& c : *cases) {
    for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
      CAPTURE(c.name);
      CAPTURE(dtype);
      const auto rewards = dapo::test::tensor(c.token_level_rewards, {c.rows, c.cols}, dtype);
      const auto mask = dapo::test::tensor(c.response_mask, {c.rows, c.cols}, dtype).to(torch::kBool);
      const auto index = torch::tensor(c.index, torch::kInt64);
      const auto out = dapo::estimate_advantages(rewards, mask, index, c.options);
      CHECK((out.advantages.scalar_type() == dtype));
      const auto advantages = dapo::test::values(out.advantages), returns = dapo::test::values(out.returns);
      const double relative = dtype == torch::kFloat64 ? 1e-10 : 1e-5,
                   absolute = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
      for (std::size_t i = 0; i < advantages.size(); ++i) {
        CAPTURE(i);
        CHECK(dapo::test::close(advantages[i], c.advantages[i], relative, absolute));
        CHECK(dapo::test::close(returns[i], c.returns[i], relative, absolute));
      }
    }
  }
  CHECK_THROWS_WITH_AS(dapo::estimate_advantages(torch::zeros({2, 3}), torch::ones({2, 3}), torch::zeros({2})),
                       doctest::Contains("index has shape [2] and dtype Float, expected [2] of an integer dtype"),
                       std::invalid_argument);
}
