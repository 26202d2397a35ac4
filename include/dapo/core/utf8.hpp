// UTF-8 as Unicode §3.9 defines it (Table 3-7 of well-formed byte sequences): decode one character, encode one, and
// replace malformed bytes with U+FFFD exactly as Python's bytes.decode("utf-8", errors="replace") does. No
// normalisation, no character classes; strings are bytes in std::string / std::string_view.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dapo::utf8 {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";
inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

// What starts at one position of a byte string.
struct Sequence {
  char32_t code_point = 0;  // the character when valid, else 0
  // Valid: the character's length in bytes (1 to 4). Invalid: the length of the "maximal subpart" (1 to 3 bytes) that
  // one U+FFFD replaces, as Python, Rust's from_utf8_lossy and WHATWG do. 0 only at or past the end of the text.
  std::size_t length = 0;
  bool valid = false;
};

// The sequence that starts at text[pos]. Overlong forms, surrogates (U+D800..U+DFFF), code points above U+10FFFF,
// stray continuation bytes, the bytes C0, C1, F5..FF and sequences cut short by the end of `text` are invalid.
constexpr Sequence decode(std::string_view text, std::size_t pos) noexcept {
  if (pos >= text.size()) return {};
  const auto lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) return {lead, 1, true};
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte depends on the lead byte
  char32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, code_point = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, code_point = lead & 0x07;
    if (lead == 0xF0) low = 0x90;   // no overlong forms
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return {0, 1, false};
  }
  for (std::size_t i = 1; i < length; ++i) {
    if (pos + i >= text.size()) return {0, i, false};
    const auto byte = static_cast<unsigned char>(text[pos + i]);
    if (byte < low || byte > high) return {0, i, false};
    code_point = (code_point << 6) | (byte & 0x3F);
    low = 0x80, high = 0xBF;
  }
  return {code_point, length, true};
}

// Whether a code point has a UTF-8 form: at most U+10FFFF and not a surrogate.
constexpr bool is_scalar_value(char32_t code_point) noexcept {
  return code_point <= kMaxCodePoint && (code_point < 0xD800 || code_point > 0xDFFF);
}

// Appends the UTF-8 form of `code_point`; one without a UTF-8 form (see is_scalar_value) appends U+FFFD.
inline void append(std::string& out, char32_t code_point) {
  if (!is_scalar_value(code_point)) code_point = kReplacementCharacter;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// The number of leading bytes of `text` that are well-formed UTF-8 (text.size() when all are).
constexpr std::size_t valid_prefix_length(std::string_view text) noexcept {
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {  // ASCII runs skip the decoder
      ++pos;
      continue;
    }
    const Sequence sequence = decode(text, pos);
    if (!sequence.valid) break;
    pos += sequence.length;
  }
  return pos;
}

constexpr bool is_valid(std::string_view text) noexcept {
  return valid_prefix_length(text) == text.size();
}

// `bytes` with each maximal subpart of a malformed sequence replaced by one U+FFFD: Python's
// bytes.decode("utf-8", errors="replace"), re-encoded. Valid input is returned as it is, without a copy.
inline std::string replace_invalid(std::string bytes) {
  std::size_t pos = valid_prefix_length(bytes);
  if (pos == bytes.size()) return bytes;
  std::string out = bytes.substr(0, pos);
  while (pos < bytes.size()) {
    const Sequence sequence = decode(bytes, pos);
    if (sequence.valid) {
      out.append(bytes, pos, sequence.length);
    } else {
      out += kReplacementUtf8;
    }
    pos += sequence.length;
  }
  return out;
}

}  // namespace dapo::utf8
