// The commands the docs give: a ```sh block's words, continuation lines joined, for the tests that parse them with
// the program's own command line (tests/qwen/documented_commands_test.cpp, memory_plan_test.cpp).
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dapo::test {

// Shell text with its continuation lines (a backslash at the end of a line) joined.
inline std::string joined_lines(const std::string& text) {
  std::string joined;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {
      joined += ' ';
      ++i;
    } else {
      joined += text[i];
    }
  }
  return joined;
}

// The words of the first ```sh block after `heading` in a Markdown file, continuation lines joined.
inline std::vector<std::string> documented_command(const std::filesystem::path& file, const std::string& heading) {
  std::ifstream in(file);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto section = doc.find(heading);
  REQUIRE(section != std::string::npos);
  const auto begin = doc.find("```sh\n", section);
  REQUIRE(begin != std::string::npos);
  const auto end = doc.find("```", begin + 6);
  REQUIRE(end != std::string::npos);
  std::istringstream words(joined_lines(doc.substr(begin + 6, end - begin - 6)));
  std::vector<std::string> out;
  for (std::string word; words >> word;) out.push_back(word);
  return out;
}

}  // namespace dapo::test
