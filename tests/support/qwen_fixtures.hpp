// Test support for the Qwen model: the tiny checkpoints of ../shared/fixtures/qwen2 and their expected.json, and a
// scratch directory per test.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "support/shared.hpp"

namespace dapo::test {

// ../shared/fixtures/qwen2/<name>, or nothing (the caller skips; see require_shared).
inline std::optional<std::filesystem::path> qwen_fixture(const std::string& name) {
  const auto dir = require_shared("fixtures/qwen2/" + name);
  if (!dir) return std::nullopt;
  return *dir / "fixtures" / "qwen2" / name;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path.string());
  return nlohmann::json::parse(in);
}

// A fresh, empty directory under the system temp dir, removed when the object goes.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device random;
    path_ =
        std::filesystem::temp_directory_path() / ("dapo-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace dapo::test
