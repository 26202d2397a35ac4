// Rollout correction by verl's names: every rollout_is and rollout_rs case of verl_zoo.json (verl's own
// rollout_corr_helper functions, float64), counted per kind, in double (1e-10) and float (1e-5 on the weights, the
// same mask); the threshold parsing and its errors.
#include <dapo/core/rollout_correction.hpp>

#include <map>
#include <string>
#include <vector>

#include "support/shared.hpp"

namespace {

// verl's threshold as the file gives it: a number or a "L_U" string, as verl's own parser reads it.
std::string threshold_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

TEST_CASE("core rollout_is_weights matches every rollout_is case of verl_zoo.json (token and sequence, TIS, IcePop)") {
  const auto cases = dapo::test::verl_zoo("rollout_is");
  if (!cases) return;
  std::map<std::string, int> per_kind;
  for (const auto& item : *cases) {
    const std::string level = item.at("rollout_is").get<std::string>();
    const std::string threshold = threshold_text(item.at("rollout_is_threshold"));
    CAPTURE(level);
    CAPTURE(threshold);
    const auto log_ratio = dapo::test::flatten(item.at("log_ratio"));
    const auto mask = dapo::test::flatten(item.at("response_mask"));
    const auto expected = dapo::test::flatten(item.at("weights"));
    const auto rows = static_cast<int64_t>(item.at("log_ratio").size());
    const int64_t cols = rows > 0 ? static_cast<int64_t>(item.at("log_ratio").at(0).size()) : 0;
    REQUIRE(expected.size() == log_ratio.size());
    const dapo::RolloutIsOptions options = dapo::parse_rollout_is(level, threshold);
    std::vector<double> weights(log_ratio.size());
    dapo::core::rollout_is_weights<double>(log_ratio, mask, rows, cols, options, weights);
    const std::vector<float> log_ratio_f(log_ratio.begin(), log_ratio.end()), mask_f(mask.begin(), mask.end());
    std::vector<float> weights_f(log_ratio.size());
    dapo::core::rollout_is_weights<float>(log_ratio_f, mask_f, rows, cols, options, weights_f);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(weights[i], expected[i], 1e-10, 1e-14));
      CHECK(dapo::test::close(weights_f[i], expected[i], 1e-5, 1e-6));
    }
    ++per_kind[level + (options.lower > 0.0 ? " icepop" : " tis")];
  }
  MESSAGE("verl_zoo.json rollout_is: " << cases->size() << " cases (" << dapo::test::count_message(per_kind) << ")");
  for (const char* kind : {"token tis", "token icepop", "sequence tis", "sequence icepop"}) {
    CAPTURE(kind);
    CHECK(per_kind[kind] > 0);
  }
}

TEST_CASE("core rollout_rejection_mask matches every rollout_rs case of verl_zoo.json") {
  const auto cases = dapo::test::verl_zoo("rollout_rs");
  if (!cases) return;
  std::map<std::string, int> per_option;
  for (const auto& item : *cases) {
    const std::string names = item.at("rollout_rs").get<std::string>();
    const std::string threshold = threshold_text(item.at("rollout_rs_threshold"));
    CAPTURE(names);
    CAPTURE(threshold);
    const auto log_ratio = dapo::test::flatten(item.at("log_ratio"));
    const auto mask = dapo::test::flatten(item.at("response_mask"));
    const auto expected = dapo::test::flatten(item.at("mask"));
    const auto rows = static_cast<int64_t>(item.at("log_ratio").size());
    const int64_t cols = rows > 0 ? static_cast<int64_t>(item.at("log_ratio").at(0).size()) : 0;
    REQUIRE(expected.size() == log_ratio.size());
    const auto options = dapo::parse_rollout_rs(names, threshold);
    std::vector<double> kept(log_ratio.size());
    dapo::core::rollout_rejection_mask<double>(log_ratio, mask, rows, cols, options, kept);
    CHECK(kept == expected);  // 0/1 decisions: exact
    for (const auto& option : options) ++per_option[option.name];
  }
  MESSAGE("verl_zoo.json rollout_rs: " << cases->size() << " cases (" << dapo::test::count_message(per_option) << ")");
  for (const char* option :
       {"token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2"}) {
    CAPTURE(option);
    CHECK(per_option[option] > 0);
  }
}

TEST_CASE("rollout correction: verl's threshold forms, the product of several options, and named errors") {
  CHECK(dapo::parse_rollout_is("token", "2.0").lower == 0.0);
  CHECK(dapo::parse_rollout_is("sequence", "0.5_2.0").lower == 0.5);
  CHECK_THROWS_WITH_AS(dapo::parse_rollout_is("batch", "2"), doctest::Contains("rollout_is is 'batch', expected token"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::parse_rollout_is("token", "2.0_0.5"), doctest::Contains("expected 0 < L <= U"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::parse_rollout_is("token", "two"), doctest::Contains("expected a number U or L_U"),
                       std::invalid_argument);
  const auto k1 = dapo::parse_rollout_rs("token_k1", "2.0");
  REQUIRE(k1.size() == 1);
  CHECK(k1[0].lower == doctest::Approx(std::log(0.5)));  // "U" means [1/U, U]
  CHECK_THROWS_WITH_AS(dapo::parse_rollout_rs("token_k2", "0.1_0.2"),
                       doctest::Contains("threshold '0.1_0.2' of token_k2 must be a single upper bound"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::parse_rollout_rs("token_k4", "1"), doctest::Contains("rollout_rs option 'token_k4'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::parse_rollout_rs("token_k2,seq_max_k3", "1,2,3"),
                       doctest::Contains("one threshold for all options or one per option (2)"), std::invalid_argument);
  // Two options: a token dropped by either is dropped; a row whose max k2 is too large goes whole.
  const std::vector<double> log_ratio{0.0, 0.9, 0.1, 0.0, 0.05, 0.0}, mask{1, 1, 1, 1, 1, 0};
  std::vector<double> kept(6);
  const auto metrics = dapo::core::rollout_rejection_mask<double>(
      log_ratio, mask, 2, 3, dapo::parse_rollout_rs("token_k2,seq_max_k2", "0.3,0.2"), kept);
  CHECK(kept == std::vector<double>{0, 0, 0, 1, 1, 0});
  CHECK(metrics.at("rollout_rs_seq_masked_fraction") == doctest::Approx(0.5));
}
