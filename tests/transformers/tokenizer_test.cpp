// qwen::Tokenizer against Hugging Face tokenizers (the Rust library): every random string and id sequence of
// tokenizer_cases.json (made by tokenizer_cases.py) must give tokenizers' ids and both decodings, case by case.
#include "qwen_gsm8k/text/tokenizer.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "support/shared.hpp"
#include "transformers/references.hpp"

namespace {

using nlohmann::json;
using qwen::Tokenizer;

using dapo::test::kShownMismatches;

// A string as a JSON literal with every non-ASCII character escaped, so that odd spaces and marks stay visible.
std::string escaped(const std::string& text) {
  return json(text).dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
}

// What differs between our results and tokenizers' for one case ("text" present: an encode case; absent: a decode
// case of "ids"); empty when nothing does. An exception of ours is a difference too, so that the other cases still run.
std::string compare_case(const Tokenizer& tokenizer, const json& item) {
  const auto expected_ids = item.at("ids").get<std::vector<int32_t>>();
  std::string differences;
  try {
    if (item.contains("text")) {
      const auto ids = tokenizer.encode(item.at("text").get<std::string>());
      if (ids != expected_ids) differences += "ids: ours " + json(ids).dump() + "; ";
    }
    for (const bool skip_special_tokens : {false, true}) {
      const char* field = skip_special_tokens ? "decoded_skip_special" : "decoded";
      const std::string decoded = tokenizer.decode(expected_ids, skip_special_tokens);
      if (decoded != item.at(field).get<std::string>()) {
        differences += std::string(field) + ": ours " + escaped(decoded) + ", tokenizers " +
                       escaped(item.at(field).get<std::string>()) + "; ";
      }
    }
  } catch (const std::exception& error) {
    differences += std::string("ours threw: ") + error.what();
  }
  return differences;
}

// Checks every case of `items`; prints the first few mismatches, and returns all of them, each with a "description"
// saying what made it (`made_by`) and what differed (the format of tests/fixtures/tokenizer_regressions.json's cases).
json mismatching_cases(const Tokenizer& tokenizer, const json& items, const std::string& made_by) {
  json mismatches = json::array();
  for (std::size_t i = 0; i < items.size(); ++i) {
    const json& item = items[i];
    const std::string differences = compare_case(tokenizer, item);
    if (differences.empty()) continue;
    if (mismatches.size() < kShownMismatches) {
      MESSAGE(
          "case " << i
                  << (item.contains("text") ? " text " + escaped(item.at("text").get<std::string>()) : std::string())
                  << "\n  tokenizers ids " << item.at("ids").dump() << "\n  " << differences);
    }
    json mismatch = item;
    mismatch["description"] = made_by + ": " + differences;
    mismatches.push_back(std::move(mismatch));
  }
  return mismatches;
}

// The cases under `key`, after checking that the file holds as many as it says under `count_key` (a file cut short,
// or one with no cases, must not pass).
const json& cases_of(const json& references, const char* key, const char* count_key) {
  REQUIRE_MESSAGE(references.contains(key), "tokenizer_cases.json has no \"" << key << "\"");
  const json& items = references.at(key);
  REQUIRE(items.is_array());
  REQUIRE_MESSAGE(references.contains(count_key), "tokenizer_cases.json has no \"" << count_key << "\"");
  const auto stated = references.at(count_key).get<std::size_t>();
  REQUIRE_MESSAGE(items.size() == stated,
                  "tokenizer_cases.json states " << stated << " " << key << " but holds " << items.size());
  REQUIRE_MESSAGE(!items.empty(), "tokenizer_cases.json holds no " << key << ": nothing would be compared");
  return items;
}

}  // namespace

TEST_CASE("tokenizers: random strings and id sequences give Hugging Face tokenizers' ids and decodings") {
  const json references = dapo::test::read_reference("tokenizer_cases.json");
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!shared) return;
  const Tokenizer tokenizer = Tokenizer::from_directory(*shared / "fixtures" / "tokenizer" / "qwen2.5");
  const std::string made_by = "tokenizers " + references.value("tokenizers", std::string("?"));
  MESSAGE("tokenizer_cases.json: seed " << references.value("seed", json()).dump() << ", " << made_by);

  json mismatches = mismatching_cases(tokenizer, cases_of(references, "cases", "count"), made_by);
  const std::size_t string_mismatches = mismatches.size();
  for (json& mismatch : mismatching_cases(tokenizer, cases_of(references, "decode_cases", "decode_count"), made_by)) {
    mismatches.push_back(std::move(mismatch));
  }
  const std::size_t decode_mismatches = mismatches.size() - string_mismatches;
  if (!mismatches.empty()) {
    MESSAGE("all " << mismatches.size() << " mismatching cases written to "
                   << dapo::test::write_mismatches("tokenizer_mismatches.json", mismatches));
  }
  CHECK(string_mismatches == 0);
  CHECK(decode_mismatches == 0);
}
