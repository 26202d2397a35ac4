// Soft overlong punishment (DAPO Eq. 13): goldens, the shape of the ramp, errors.
#include <dapo/core/reward.hpp>

#include "support/shared.hpp"

TEST_CASE("overlong_penalty matches every golden case, scalar and span") {
  const auto cases = dapo::test::algo_golden("overlong");
  if (!cases) return;
  for (const auto& item : *cases) {
    const int64_t length = item.at("length");
    const int64_t max_length = item.at("max_length"), cache_length = item.at("cache_length");
    const double factor = item.at("factor");
    CAPTURE(length);
    CHECK(dapo::overlong_penalty(length, max_length, cache_length, factor) == item.at("expected").get<double>());
    const std::vector<int64_t> lengths{length};
    std::vector<double> penalties(1);
    dapo::core::overlong_penalty(lengths, max_length, cache_length, factor, penalties);
    CHECK(penalties[0] == item.at("expected").get<double>());
  }
}

TEST_CASE("overlong_penalty is 0, then a linear ramp to -factor, then flat") {
  CHECK(dapo::overlong_penalty(12, 20, 4, 2.0) == 0.0);
  CHECK(dapo::overlong_penalty(16, 20, 4, 2.0) == 0.0);
  CHECK(dapo::overlong_penalty(18, 20, 4, 2.0) == -1.0);
  CHECK(dapo::overlong_penalty(20, 20, 4, 2.0) == -2.0);
  CHECK(dapo::overlong_penalty(21, 20, 4, 2.0) == -2.0);
  CHECK(dapo::overlong_penalty(20, 20, 0, 1.0) == 0.0);  // no soft zone: a hard cut after L_max
  CHECK(dapo::overlong_penalty(21, 20, 0, 1.0) == -1.0);
}

TEST_CASE("overlong_penalty rejects bad options") {
  CHECK_THROWS_WITH_AS(dapo::overlong_penalty(1, 0, 0), doctest::Contains("max_length is 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::overlong_penalty(1, 10, 11), doctest::Contains("cache_length is 11"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::overlong_penalty(-1, 10, 2), doctest::Contains("length is -1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::overlong_penalty(1, 10, 2, -1.0), doctest::Contains("factor is -1"),
                       std::invalid_argument);
  std::vector<double> out(2);
  CHECK_THROWS_WITH_AS(dapo::core::overlong_penalty(std::vector<int64_t>{3}, 10, 2, 1.0, out),
                       doctest::Contains("penalties has 2 elements but lengths has 1"), std::invalid_argument);
}
