// The advantage cases of ../shared/fixtures/algo/verl_zoo.json (verl's own estimators), read by their fields.
#pragma once

#include <dapo/core/advantage_estimator.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/shared.hpp"

namespace dapo::test {

struct ZooAdvantageCase {
  std::string estimator;  // as the file names it ("grpo_no_std" is verl's grpo with norm_adv_by_std_in_grpo false)
  int64_t rows = 0, cols = 0;
  std::vector<double> token_level_rewards, response_mask, advantages, returns;  // [B, T]
  std::vector<int64_t> index;  // the prompt ids, numbered in order of first appearance
  AdvantageEstimatorOptions options;
  std::string name;
};

inline std::optional<std::vector<ZooAdvantageCase>> zoo_advantage_cases() {
  const auto cases = verl_zoo("advantage");
  if (!cases) return std::nullopt;
  std::vector<ZooAdvantageCase> all;
  std::map<std::string, int> per_estimator;
  for (const auto& item : *cases) {
    ZooAdvantageCase c;
    c.estimator = item.at("estimator").get<std::string>();
    c.rows = static_cast<int64_t>(item.at("token_level_rewards").size());
    c.cols = c.rows > 0 ? static_cast<int64_t>(item.at("token_level_rewards").at(0).size()) : 0;
    c.token_level_rewards = flatten(item.at("token_level_rewards"));
    c.response_mask = flatten(item.at("response_mask"));
    c.advantages = flatten(item.at("advantages"));
    c.returns = flatten(item.at("returns"));
    std::map<std::string, int64_t> ids;
    for (const auto& id : item.at("index")) {
      const std::string key = id.is_string() ? id.get<std::string>() : id.dump();
      c.index.push_back(ids.emplace(key, static_cast<int64_t>(ids.size())).first->second);
    }
    const auto& config = item.at("config");
    const auto& kwargs = item.at("kwargs");
    c.options.estimator = advantage_estimator_from_name(c.estimator == "grpo_no_std" ? "grpo" : c.estimator);
    c.options.norm_adv_by_std = kwargs.value("norm_adv_by_std_in_grpo", config.value("norm_adv_by_std_in_grpo", true));
    c.options.epsilon = item.value("epsilon", 1e-6);
    c.options.gamma = config.value("gamma", 1.0);
    c.options.f_norm = kwargs.value("f_norm", 1.0);
    const auto size = static_cast<std::size_t>(c.rows * c.cols);
    REQUIRE(c.response_mask.size() == size);
    REQUIRE(c.advantages.size() == size);
    REQUIRE(c.returns.size() == size);
    REQUIRE(c.index.size() == static_cast<std::size_t>(c.rows));
    c.name = c.estimator + " #" + std::to_string(all.size());
    ++per_estimator[c.estimator];
    all.push_back(std::move(c));
  }
  MESSAGE("verl_zoo.json advantage: " << all.size() << " cases (" << count_message(per_estimator) << ")");
  for (const char* estimator :
       {"grpo", "grpo_passk", "rloo", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg"}) {
    CAPTURE(estimator);
    CHECK(per_estimator[estimator] > 0);
  }
  return all;
}

}  // namespace dapo::test
