// The transformers leg's reference directory (scripts/transformers-check.sh): what Hugging Face transformers,
// tokenizers and Jinja2 computed in the Debian sid root (tests/transformers/references.py), read by the tests of
// this folder. They run only in that leg, which names the directory in DAPO_TRANSFORMERS_REFERENCES; without it every
// test here fails, naming the variable (a run that compared nothing must not pass).
#pragma once

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace dapo::test {

// How many mismatching cases a failing comparison prints as failures (write_mismatches keeps them all).
inline constexpr std::size_t kShownMismatches = 5;

// DAPO_TRANSFORMERS_REFERENCES, checked to be a directory.
inline std::filesystem::path transformers_references() {
  const char* dir = std::getenv("DAPO_TRANSFORMERS_REFERENCES");
  if (dir == nullptr || *dir == '\0') {
    FAIL(
        "DAPO_TRANSFORMERS_REFERENCES is not set: these tests compare with files made by transformers "
        "(scripts/transformers-check.sh makes them and runs this program)");
  }
  if (!std::filesystem::is_directory(dir)) FAIL("DAPO_TRANSFORMERS_REFERENCES=" << dir << " is not a directory");
  return dir;
}

// One file of the reference directory, parsed; a missing or malformed file fails the test naming it.
inline nlohmann::json read_reference(const std::string& name) {
  const std::filesystem::path path = transformers_references() / name;
  std::ifstream in(path);
  if (!in) FAIL("cannot read " << path << " (made by tests/transformers/references.py)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    FAIL(path << " is not valid JSON: " << error.what());
  }
  return {};
}

// Writes the cases that disagreed beside the references (`name`, a JSON array in the regression files' format), so
// that they can be added to the committed regression cases; returns the path.
inline std::filesystem::path write_mismatches(const std::string& name, const nlohmann::json& cases) {
  const std::filesystem::path path = transformers_references() / name;
  std::ofstream(path) << cases.dump(1) << '\n';
  return path;
}

}  // namespace dapo::test
