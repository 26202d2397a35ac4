// Rollout correction on tensors: every rollout_is and rollout_rs case of verl_zoo.json through the tensor API
// (float64, bool masks), the same numbers as the plain-buffer core.
#include <dapo/rollout_correction.hpp>

#include <string>
#include <vector>

#include "support/shared.hpp"
#include "support/tensors.hpp"

TEST_CASE("torch rollout correction: verl_zoo.json's IS weights and rejection masks through the tensor API") {
  for (const char* section : {"rollout_is", "rollout_rs"}) {
    const auto cases = dapo::test::verl_zoo(section);
    if (!cases) return;
    int checked = 0;
    for (const auto& item : *cases) {
      const auto rows = static_cast<int64_t>(item.at("log_ratio").size());
      const int64_t cols = rows > 0 ? static_cast<int64_t>(item.at("log_ratio").at(0).size()) : 0;
      const auto log_ratio =
          dapo::test::tensor(dapo::test::flatten(item.at("log_ratio")), {rows, cols}, torch::kFloat64);
      const auto mask = dapo::test::tensor(dapo::test::flatten(item.at("response_mask")), {rows, cols}, torch::kFloat64)
                            .to(torch::kBool);
      const auto text = [](const nlohmann::json& value) {
        return value.is_string() ? value.get<std::string>() : value.dump();
      };
      std::vector<double> got, expected;
      if (std::string(section) == "rollout_is") {
        const auto options =
            dapo::parse_rollout_is(item.at("rollout_is").get<std::string>(), text(item.at("rollout_is_threshold")));
        got = dapo::test::values(dapo::rollout_is_weights(log_ratio, mask, options).values);
        expected = dapo::test::flatten(item.at("weights"));
      } else {
        const auto options =
            dapo::parse_rollout_rs(item.at("rollout_rs").get<std::string>(), text(item.at("rollout_rs_threshold")));
        got = dapo::test::values(dapo::rollout_rejection_mask(log_ratio, mask, options).values);
        expected = dapo::test::flatten(item.at("mask"));
      }
      REQUIRE(got.size() == expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(dapo::test::close(got[i], expected[i], 1e-10, 1e-14));
      ++checked;
    }
    CAPTURE(section);
    CHECK(checked > 0);
  }
}
