// The kl_penalty cases of ../shared/fixtures/algo/verl_zoo.json (verl's own kl_penalty), read by their fields.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/shared.hpp"

namespace dapo::test {

struct KlCase {
  std::string name;                          // verl's kl_penalty name ("k3+", "low_var_kl", ...)
  std::vector<double> logprob, ref_logprob;  // flat
  std::vector<double> value, grad_logprob;   // expected: the estimate, d sum(value) / d logprob
};

// Every case, or nothing when the data is missing (the caller skips; see require_shared).
inline std::optional<std::vector<KlCase>> kl_cases() {
  const auto cases = verl_zoo("kl_penalty");
  if (!cases) return std::nullopt;
  REQUIRE(!cases->empty());
  std::vector<KlCase> all;
  for (const auto& item : *cases) {
    KlCase c{item.at("kl_penalty").get<std::string>(), flatten(item.at("logprob")), flatten(item.at("ref_logprob")),
             flatten(item.at("value")), flatten(item.at("grad_logprob"))};
    REQUIRE(c.ref_logprob.size() == c.logprob.size());
    REQUIRE(c.value.size() == c.logprob.size());
    REQUIRE(c.grad_logprob.size() == c.logprob.size());
    all.push_back(std::move(c));
  }
  std::map<std::string, int> by_name;
  for (const KlCase& c : all) ++by_name[c.name];
  MESSAGE("verl_zoo.json kl_penalty: " << all.size() << " cases (" << count_message(by_name) << ")");
  return all;
}

}  // namespace dapo::test
