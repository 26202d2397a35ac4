// Escaping, number printing and slugs for the report's SVG and HTML.
#include "qwen_gsm8k/report/markup.hpp"

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace qwen::detail {
namespace {

// Appends one ASCII character, escaped; control characters other than tab and newline are dropped.
void append_escaped(std::string& out, char c) {
  switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    case '\'':
      out += "&#39;";
      break;
    default:
      if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
  }
}

}  // namespace

std::string escape_markup(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (std::size_t i = 0; i < text.size();) {
    const dapo::utf8::Sequence sequence = dapo::utf8::decode(text, i);
    if (!sequence.valid) {
      out += dapo::utf8::kReplacementUtf8;  // per byte, not per maximal subpart: the report has always done so
      ++i;
    } else if (sequence.length > 1) {
      out.append(text.substr(i, sequence.length));
      i += sequence.length;
    } else {
      append_escaped(out, text[i++]);
    }
  }
  return out;
}

std::size_t display_length(std::string_view text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string print_number(const char* pattern, int precision, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, precision, value);
  return buffer;
}

std::string pixel(double value) {
  return print_number("%.*f", 1, value);
}

std::string general(double value) {
  return print_number("%.*g", 6, value);
}

std::string slug_of(const std::string& title) {
  std::string slug;
  for (const char c : title) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0) {
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  return slug.empty() ? "chart" : slug;
}

}  // namespace qwen::detail
