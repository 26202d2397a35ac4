// Group advantages on plain buffers: goldens, properties, errors.
#include <dapo/core/advantage.hpp>

#include <cmath>
#include <numeric>

#include "support/shared.hpp"

TEST_CASE("core group_advantages matches every golden case in double and float") {
  const auto cases = dapo::test::algo_golden("advantages");
  if (!cases) return;
  for (const auto& item : *cases) {
    const auto rewards = item.at("rewards").get<std::vector<double>>();
    const auto expected = item.at("expected").get<std::vector<double>>();
    const dapo::AdvantageOptions options{item.at("scale_by_std").get<bool>(), item.at("epsilon").get<double>()};
    const int64_t group_size = item.at("group_size");
    std::vector<double> actual(rewards.size());
    dapo::core::group_advantages<double>(rewards, group_size, actual, options);
    std::vector<float> rewards_f(rewards.begin(), rewards.end()), actual_f(rewards.size());
    dapo::core::group_advantages<float>(rewards_f, group_size, actual_f, options);
    for (std::size_t i = 0; i < rewards.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(actual[i], expected[i], 1e-9, 1e-12));
      CHECK(dapo::test::close(actual_f[i], expected[i], 1e-5, 1e-6));
    }
  }
}

TEST_CASE("advantages of each group sum to zero and have unit sample std when scaled") {
  const std::vector<double> rewards{0.0, 3.5, 1.0, 2.0, 5.0, 5.0, 5.0, 4.0, -1.0, 0.5, 0.25, 8.0};
  std::vector<double> advantages(rewards.size());
  dapo::core::group_advantages<double>(rewards, 4, advantages, {true, 1e-12});
  for (int group = 0; group < 3; ++group) {
    const auto first = advantages.begin() + group * 4;
    const double sum = std::accumulate(first, first + 4, 0.0);
    const double squares = std::inner_product(first, first + 4, first, 0.0);
    CHECK(std::abs(sum) < 1e-12);
    CHECK(squares / 3.0 == doctest::Approx(1.0).epsilon(1e-9));
  }
  // Dr. GRPO: only centred.
  dapo::core::group_advantages<double>(rewards, 4, advantages, {false, 0.0});
  CHECK(advantages[0] == doctest::Approx(0.0 - 6.5 / 4.0));
}

TEST_CASE("std_over_batch: the group's mean, the std of the whole batch (TRL's scale_rewards=\"batch\")") {
  const std::vector<double> rewards{0.0, 3.5, 1.0, 2.0, 5.0, 5.0, 5.0, 4.0, -1.0, 0.5, 0.25, 8.0};
  const double mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / 12.0;
  double squares = 0.0;
  for (const double r : rewards) squares += (r - mean) * (r - mean);
  const double std = std::sqrt(squares / 11.0);  // unbiased, as torch.std and TRL's nanstd
  std::vector<double> advantages(rewards.size());
  dapo::core::group_advantages<double>(rewards, 4, advantages, {.epsilon = 1e-4, .std_over_batch = true});
  for (std::size_t i = 0; i < rewards.size(); ++i) {
    const auto first = rewards.begin() + static_cast<std::ptrdiff_t>(i / 4 * 4);
    const double group_mean = std::accumulate(first, first + 4, 0.0) / 4.0;
    CAPTURE(i);
    CHECK(advantages[i] == doctest::Approx((rewards[i] - group_mean) / (std + 1e-4)).epsilon(1e-12));
  }
  // scale_by_std = false wins: only centred.
  dapo::core::group_advantages<double>(rewards, 4, advantages, {.scale_by_std = false, .std_over_batch = true});
  CHECK(advantages[0] == doctest::Approx(0.0 - 6.5 / 4.0));
}

TEST_CASE("group_advantages rejects bad input with messages naming it") {
  std::vector<double> rewards{1.0, 2.0, 3.0, 4.0, 5.0, 6.0};
  std::vector<double> out(rewards.size());
  CHECK_THROWS_WITH_AS(dapo::core::group_advantages<double>(rewards, 4, out),
                       doctest::Contains("rewards has 6 elements, which group_size = 4 does not divide"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::group_advantages<double>(rewards, 1, out), doctest::Contains("group_size is 1"),
                       std::invalid_argument);
  rewards[4] = std::nan("");
  CHECK_THROWS_WITH_AS(dapo::core::group_advantages<double>(rewards, 2, out), doctest::Contains("rewards[4] is nan"),
                       std::invalid_argument);
  rewards[4] = 5.0;
  std::vector<double> short_out(3);
  CHECK_THROWS_WITH_AS(dapo::core::group_advantages<double>(rewards, 2, short_out),
                       doctest::Contains("advantages has 3 elements but rewards has 6"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::group_advantages<double>(rewards, 2, out, {true, 0.0}),
                       doctest::Contains("epsilon is 0"), std::invalid_argument);
}
