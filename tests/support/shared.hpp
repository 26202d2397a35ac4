// Test support: where ../shared is, loading its JSON goldens, and comparing numbers with a tolerance.
// Tests that need ../shared call shared_dir() and skip (with a message naming the path) when it returns nothing.
#pragma once

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace dapo::test {

// DAPO_SHARED_DIR if set, else ../shared beside the source tree.
inline std::optional<std::filesystem::path> shared_dir() {
  const char* from_env = std::getenv("DAPO_SHARED_DIR");
  const std::filesystem::path dir = from_env != nullptr ? from_env : std::filesystem::path(DAPO_SOURCE_DIR) / ".." / "shared";
  if (!std::filesystem::is_directory(dir)) return std::nullopt;
  return dir;
}

// The golden file's section, or nothing (after printing why the caller skips).
inline std::optional<nlohmann::json> algo_golden(const std::string& section) {
  const auto dir = shared_dir();
  if (!dir) {
    MESSAGE("skipped: reference data not found (set DAPO_SHARED_DIR or place shared/ beside the checkout)");
    return std::nullopt;
  }
  const auto path = *dir / "fixtures" / "algo" / "golden.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path.string());
  const nlohmann::json golden = nlohmann::json::parse(in);
  REQUIRE(golden.contains(section));
  return golden.at(section);
}

// |actual - expected| <= absolute + relative * |expected|
inline bool close(double actual, double expected, double relative, double absolute = 0.0) {
  return std::abs(actual - expected) <= absolute + relative * std::abs(expected);
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
