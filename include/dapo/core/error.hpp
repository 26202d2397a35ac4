// Error reporting shared by every dapo header: messages that name the function, the argument, its value and what
// was expected, plus the header and line that threw. Not a logging facility: dapo never prints.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dapo {

// The parts streamed into one string (doubles with 17 digits, so values in messages round-trip).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  out.precision(17);
  (out << ... << parts);
  return out.str();
}

// "[4, 10]": how every dapo message (and the qwen_gsm8k driver's) writes a shape.
inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

namespace detail {

// Strips the directories from __FILE__ so messages stay short ("loss.hpp:42").
constexpr std::string_view file_name(std::string_view path) {
  const auto slash = path.find_last_of("/\\");
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

using dapo::concat;  // the names the headers use inside detail
using dapo::shape_string;

}  // namespace detail
}  // namespace dapo

// DAPO_REQUIRE(cond, "dapo::fn", "message parts", ...) throws std::invalid_argument:
//   "dapo::fn: message parts (loss.hpp:42)"
#define DAPO_REQUIRE(condition, where, ...)                                                                         \
  do {                                                                                                              \
    if (!(condition)) {                                                                                             \
      throw std::invalid_argument(::dapo::detail::concat(where, ": ", __VA_ARGS__, " (",                            \
                                                         ::dapo::detail::file_name(__FILE__), ":", __LINE__, ")")); \
    }                                                                                                               \
  } while (false)
