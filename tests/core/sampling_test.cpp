// Dynamic sampling on plain buffers: the filter's goldens and the round-by-round collector.
#include <dapo/core/sampling.hpp>

#include <memory>
#include <string>

#include "support/shared.hpp"

TEST_CASE("core informative_groups matches every golden case") {
  const auto cases = dapo::test::algo_golden("informative_groups");
  if (!cases) return;
  for (const auto& item : *cases) {
    const auto scores = item.at("scores").get<std::vector<double>>();
    const auto expected = item.at("expected").get<std::vector<bool>>();
    const auto informative = std::make_unique<bool[]>(expected.size());
    dapo::core::informative_groups<double>(scores, item.at("group_size").get<int64_t>(),
                                           std::span<bool>(informative.get(), expected.size()));
    for (std::size_t g = 0; g < expected.size(); ++g) CHECK(informative[g] == expected[g]);
  }
}

TEST_CASE("DynamicSampler keeps informative groups across rounds and drops the surplus") {
  dapo::core::DynamicSampler<std::string> sampler({.target_groups = 3, .group_size = 2, .max_rounds = 0});
  // Round 1: prompts a (all wrong), b (mixed), c (all right).
  auto stats = sampler.add_round({"a", "b", "c"}, std::vector<double>{0, 0, 1, 0, 1, 1});
  CHECK(stats.round == 1);
  CHECK(stats.kept == 1);
  CHECK(stats.filtered == 2);
  CHECK_FALSE(sampler.ready());
  // Round 2: d, e mixed; f mixed -> 4 kept, one more than needed.
  stats = sampler.add_round({"d", "e", "f"}, std::vector<double>{1, 0, 0, 1, 1, 0});
  CHECK(stats.kept == 3);
  REQUIRE(sampler.ready());
  const auto batch = sampler.take();
  CHECK(batch == std::vector<std::string>{"b", "d", "e"});
  CHECK(sampler.last_rounds() == 2);
  CHECK(sampler.last_filtered() == 2);
  CHECK(sampler.last_surplus() == 1);
  // The next step starts empty.
  CHECK(sampler.kept() == 0);
  CHECK(sampler.rounds() == 0);
}

TEST_CASE("DynamicSampler throws a clear error when max_rounds are used up") {
  dapo::core::DynamicSampler<int> sampler({.target_groups = 2, .group_size = 2, .max_rounds = 2});
  sampler.add_round({1, 2}, std::vector<double>{1, 1, 0, 1});
  CHECK_THROWS_WITH_AS(sampler.add_round({3, 4}, std::vector<double>{0, 0, 1, 1}),
                       doctest::Contains("2 generation rounds (max_rounds = 2) kept 1 informative groups of the 2 "
                                         "wanted"),
                       std::runtime_error);
  dapo::core::DynamicSampler<int> fresh({.target_groups = 2, .group_size = 2, .max_rounds = 2});
  CHECK_THROWS_WITH_AS(fresh.take(), doctest::Contains("only 0 of 2 groups collected"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(fresh.add_round({1}, std::vector<double>{1, 0, 1}),
                       doctest::Contains("accuracy has 3 elements, expected groups.size() * group_size = 1 * 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::DynamicSampler<int>({.target_groups = 0, .group_size = 2}),
                       doctest::Contains("target_groups is 0"), std::invalid_argument);
}
