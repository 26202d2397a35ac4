// Text for the report's SVG and HTML (internal to report/): escaping, numbers as the charts print them, file slugs.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qwen::detail {

// Text for XML and HTML, in element content and in quoted attributes alike. Control characters other than tab and
// newline are not allowed in XML 1.0 and are dropped; each byte that is not part of valid UTF-8 becomes U+FFFD.
// Either would otherwise make the whole SVG unreadable.
std::string escape_markup(std::string_view text);

// Characters, not bytes: what the legend and the margins are sized by.
std::size_t display_length(std::string_view text);

// printf of one double with a precision: print_number("%.*f", 1, x).
std::string print_number(const char* pattern, int precision, double value);
// A coordinate in the SVG: one decimal.
std::string pixel(double value);
// A value shown to the reader: six significant digits.
std::string general(double value);

// A lower-case file name for a chart title: "Response length" -> "response-length"; "chart" when nothing is left.
std::string slug_of(const std::string& title);

}  // namespace qwen::detail
