// overlong_penalty on tensors: goldens, dtype, errors.
#include <dapo/reward.hpp>

#include "support/shared.hpp"
#include "support/tensors.hpp"

TEST_CASE("torch overlong_penalty matches every golden case") {
  const auto cases = dapo::test::algo_golden("overlong");
  if (!cases) return;
  for (const auto& item : *cases) {
    const auto lengths = torch::tensor({item.at("length").get<int64_t>()}, torch::kLong);
    const auto penalty = dapo::overlong_penalty(lengths, item.at("max_length"), item.at("cache_length"),
                                                item.at("factor").get<double>());
    CHECK(dapo::test::dtype_name(penalty) == "Float");
    CHECK(penalty.item<double>() == item.at("expected").get<double>());
  }
}

TEST_CASE("torch overlong_penalty equals the scalar form elementwise, including a zero soft zone") {
  const auto lengths = torch::arange(0, 30, torch::kInt32);
  for (const int64_t cache : {0, 4, 20}) {
    const auto penalties = dapo::test::values(dapo::overlong_penalty(lengths, 20, cache, 0.5));
    for (int64_t length = 0; length < 30; ++length) {
      CHECK(penalties[length] == doctest::Approx(dapo::overlong_penalty(length, 20, cache, 0.5)));
    }
  }
}

TEST_CASE("torch overlong_penalty rejects floating or negative lengths") {
  CHECK_THROWS_WITH_AS(dapo::overlong_penalty(torch::ones({3}), 10, 2),
                       doctest::Contains("lengths has dtype Float, expected an integer dtype"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::overlong_penalty(torch::tensor({3, -2}, torch::kLong), 10, 2),
                       doctest::Contains("lengths[1] is negative"), std::invalid_argument);
}
