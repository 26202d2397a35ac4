// Where two texts first differ, and a printable excerpt around a byte: for messages that compare two renderings (a
// model's chat template against the built-in one, ours against transformers').
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <string>

namespace qwen {

// The first byte where `ours` and `theirs` differ (the shorter one's length when one is a prefix of the other).
inline std::size_t first_difference(const std::string& ours, const std::string& theirs) {
  return static_cast<std::size_t>(std::mismatch(ours.begin(), ours.end(), theirs.begin(), theirs.end()).first -
                                  ours.begin());
}

// `text` around byte `at` (`context` bytes either side) as a quoted JSON string, control characters and invalid UTF-8
// escaped, "..." marking what was cut; cuts fall between characters.
inline std::string excerpt(const std::string& text, std::size_t at, std::size_t context = 64) {
  const auto boundary = [&](std::size_t pos) {
    pos = std::min(pos, text.size());
    while (pos > 0 && pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
    return pos;
  };
  const std::size_t begin = boundary(at > context ? at - context : 0);
  const std::size_t end = boundary(at + context);
  const std::string quoted =
      nlohmann::json(text.substr(begin, end - begin)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return (begin > 0 ? "..." : "") + quoted + (end < text.size() ? "..." : "");
}

}  // namespace qwen
