// Test support: where ../shared is, loading its JSON goldens, and comparing numbers with a tolerance.
// A test that needs ../shared calls require_shared(): a fresh clone without the data skips with a message naming what
// is missing and how to provide it; under CI=true the missing data fails the test instead.
#pragma once

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dapo::test {

// Where the reference data should be: DAPO_SHARED_DIR if set, else ../shared beside the source tree.
inline std::filesystem::path shared_dir() {
  const char* from_env = std::getenv("DAPO_SHARED_DIR");
  return from_env != nullptr ? std::filesystem::path(from_env)
                             : std::filesystem::path(DAPO_SOURCE_DIR) / ".." / "shared";
}

// CI=true (or 1), as GitHub Actions and most CI services set it.
inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1");
}

// The shared directory, when every path `needed` names inside it exists (e.g. "data/gsm8k",
// "fixtures/tokenizer/qwen2.5"). Otherwise: under CI the test fails here, naming the missing data (a CI run that
// skips its goldens proves nothing); elsewhere it returns nothing after a MESSAGE naming what is missing and how to
// provide it, and the caller returns (skips).
template <typename... Needed>
std::optional<std::filesystem::path> require_shared(const Needed&... needed) {
  static_assert(sizeof...(needed) > 0, "name the paths inside shared/ that the test reads");
  const std::filesystem::path dir = shared_dir();
  std::string missing;
  for (const std::filesystem::path& path : {dir / needed...}) {
    if (!std::filesystem::exists(path)) missing += (missing.empty() ? "" : ", ") + path.string();
  }
  if (missing.empty()) return dir;
  const std::string source =
      std::getenv("DAPO_SHARED_DIR") != nullptr ? "from DAPO_SHARED_DIR" : "the default ../shared";
  if (running_in_ci()) {
    FAIL("CI=true and the reference data " << missing << " is missing (" << source
                                           << "); CI must place shared/ beside the checkout or set DAPO_SHARED_DIR");
  }
  MESSAGE("skipped: reference data " << missing << " not found (" << source
                                     << "); set DAPO_SHARED_DIR to a shared/ directory, or place shared/ beside the "
                                        "checkout, to run this test");
  return std::nullopt;
}

// A section of a JSON golden file under shared/fixtures/algo/ ("golden.json", "verl_zoo.json"), or nothing (the caller
// skips; see require_shared).
inline std::optional<nlohmann::json> algo_fixture(const std::string& file, const std::string& section) {
  const auto dir = require_shared("fixtures/algo/" + file);
  if (!dir) return std::nullopt;
  const auto path = *dir / "fixtures" / "algo" / file;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path.string());
  const nlohmann::json golden = nlohmann::json::parse(in);
  REQUIRE_MESSAGE(golden.contains(section), path.string() << " has no section " << section);
  // In place: json converts itself to any type, so a plain return is ambiguous for some compilers (g++ 16).
  return std::optional<nlohmann::json>(std::in_place, golden.at(section));
}

// The section of golden.json (the DAPO/GRPO goldens).
inline std::optional<nlohmann::json> algo_golden(const std::string& section) {
  return algo_fixture("golden.json", section);
}

// The section of verl_zoo.json (cases made by running verl's own functions).
inline std::optional<nlohmann::json> verl_zoo(const std::string& section) {
  return algo_fixture("verl_zoo.json", section);
}

// |actual - expected| <= absolute + relative * |expected|
inline bool close(double actual, double expected, double relative, double absolute = 0.0) {
  return std::abs(actual - expected) <= absolute + relative * std::abs(expected);
}

// "name count, name count, ..." of a count per kind, for the messages that say what a golden file held.
inline std::string count_message(const std::map<std::string, int>& counts) {
  std::string text;
  for (const auto& [key, count] : counts) text += (text.empty() ? "" : ", ") + key + " " + std::to_string(count);
  return text;
}

inline std::vector<double> flatten(const nlohmann::json& value) {
  std::vector<double> flat;
  if (value.is_array()) {
    for (const auto& item : value) {
      const auto inner = flatten(item);
      flat.insert(flat.end(), inner.begin(), inner.end());
    }
  } else {
    flat.push_back(value.get<double>());
  }
  return flat;
}

}  // namespace dapo::test
