// Words joined by a separator ("a, b, c"): lists in messages and help texts.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace qwen {

inline std::string joined(const std::vector<std::string>& words, const std::string& separator) {
  std::string text;
  for (std::size_t i = 0; i < words.size(); ++i) text += (i == 0 ? "" : separator) + words[i];
  return text;
}

}  // namespace qwen
