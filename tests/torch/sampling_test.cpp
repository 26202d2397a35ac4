// informative_groups on tensors: goldens and errors.
#include <dapo/sampling.hpp>

#include "support/shared.hpp"
#include "support/tensors.hpp"

TEST_CASE("torch informative_groups matches every golden case") {
  const auto cases = dapo::test::algo_golden("informative_groups");
  if (!cases) return;
  for (const auto& item : *cases) {
    const auto scores = item.at("scores").get<std::vector<double>>();
    const auto expected = item.at("expected").get<std::vector<bool>>();
    const auto actual =
        dapo::informative_groups(dapo::test::tensor(scores, {static_cast<int64_t>(scores.size())}, torch::kFloat32),
                                 item.at("group_size").get<int64_t>());
    REQUIRE(dapo::test::dtype_name(actual) == "Bool");
    REQUIRE(actual.numel() == static_cast<int64_t>(expected.size()));
    for (std::size_t g = 0; g < expected.size(); ++g)
      CHECK(actual[static_cast<int64_t>(g)].item<bool>() == expected[g]);
  }
}

TEST_CASE("torch informative_groups rejects NaN scores and bad groups") {
  auto scores = torch::ones({4});
  scores[1] = std::nan("");
  CHECK_THROWS_WITH_AS(dapo::informative_groups(scores, 2), doctest::Contains("scores[1] is nan"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::informative_groups(torch::ones({4}), 3),
                       doctest::Contains("group_size = 3 does not divide"), std::invalid_argument);
}
