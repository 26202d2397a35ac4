// dapo::utf8: decoding one sequence (valid, overlong, surrogate, above U+10FFFF, truncated), encoding, and the
// U+FFFD replacement, against values from Python 3's bytes.decode("utf-8", errors="replace").
#include <doctest/doctest.h>
#include <dapo/core/utf8.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace {

using dapo::utf8::decode;
using dapo::utf8::replace_invalid;
using dapo::utf8::Sequence;

const std::string kFffd(dapo::utf8::kReplacementUtf8);

std::string encoded(char32_t code_point) {
  std::string out;
  dapo::utf8::append(out, code_point);
  return out;
}

bool is(const Sequence& sequence, char32_t code_point, std::size_t length) {
  return sequence.valid && sequence.code_point == code_point && sequence.length == length;
}

// Invalid, with the length of the maximal subpart that one U+FFFD replaces.
bool is_invalid(const Sequence& sequence, std::size_t length) {
  return !sequence.valid && sequence.code_point == 0 && sequence.length == length;
}

}  // namespace

TEST_CASE("utf8::decode: one character of each length, at any position") {
  CHECK(is(decode("A", 0), 0x41, 1));
  CHECK(is(decode("\xC3\xA9", 0), 0xE9, 2));               // é
  CHECK(is(decode("\xE2\x82\xAC", 0), 0x20AC, 3));         // €
  CHECK(is(decode("\xF0\x9F\x98\x80", 0), 0x1F600, 4));    // 😀, a 4-byte emoji
  CHECK(is(decode("a\xF0\x9F\x98\x80z", 1), 0x1F600, 4));  // in the middle of a text
  CHECK(is(decode(std::string_view("\0", 1), 0), 0, 1));   // NUL is a character
  CHECK(is(decode("\xC2\x80", 0), 0x80, 2));               // the ends of each length
  CHECK(is(decode("\xDF\xBF", 0), 0x7FF, 2));
  CHECK(is(decode("\xE0\xA0\x80", 0), 0x800, 3));
  CHECK(is(decode("\xED\x9F\xBF", 0), 0xD7FF, 3));  // just below the surrogates
  CHECK(is(decode("\xEE\x80\x80", 0), 0xE000, 3));  // just above them
  CHECK(is(decode("\xEF\xBF\xBF", 0), 0xFFFF, 3));
  CHECK(is(decode("\xF0\x90\x80\x80", 0), 0x10000, 4));
  CHECK(is(decode("\xF4\x8F\xBF\xBF", 0), 0x10FFFF, 4));
  CHECK(decode("abc", 3).length == 0);  // at the end: nothing
  CHECK_FALSE(decode("abc", 3).valid);
}

TEST_CASE("utf8::decode: malformed sequences, with the maximal subpart one U+FFFD replaces") {
  // Overlong forms: the lead bytes C0 and C1 never start a character; E0 and F0 need a large enough second byte.
  CHECK(is_invalid(decode("\xC0\xAF", 0), 1));
  CHECK(is_invalid(decode("\xC1\xBF", 0), 1));
  CHECK(is_invalid(decode("\xE0\x80\xAF", 0), 1));
  CHECK(is_invalid(decode("\xE0\x9F\xBF", 0), 1));
  CHECK(is_invalid(decode("\xF0\x80\x80\xAF", 0), 1));
  CHECK(is_invalid(decode("\xF0\x8F\xBF\xBF", 0), 1));
  // Surrogates U+D800..U+DFFF (ED A0..BF ..) are not characters.
  CHECK(is_invalid(decode("\xED\xA0\x80", 0), 1));
  CHECK(is_invalid(decode("\xED\xBF\xBF", 0), 1));
  // Above U+10FFFF: F4 90.., and the leads F5..FF.
  CHECK(is_invalid(decode("\xF4\x90\x80\x80", 0), 1));
  CHECK(is_invalid(decode("\xF5\x80\x80\x80", 0), 1));
  CHECK(is_invalid(decode("\xF8\x88\x80\x80\x80", 0), 1));
  CHECK(is_invalid(decode("\xFF", 0), 1));
  // A stray continuation byte.
  CHECK(is_invalid(decode("\x80", 0), 1));
  CHECK(is_invalid(decode("\xBF", 0), 1));
  // Truncated: by the end of the text or by a byte that does not continue; the started part is one subpart.
  CHECK(is_invalid(decode("\xC3", 0), 1));
  CHECK(is_invalid(decode("\xE2\x82", 0), 2));
  CHECK(is_invalid(decode("\xE2\x82"
                          "A",
                          0),
                   2));
  CHECK(is_invalid(decode("\xF0\x9F\x98", 0), 3));  // an emoji cut short
  CHECK(is_invalid(decode("\xF0\x9F\x98"
                          "A",
                          0),
                   3));
  CHECK(is_invalid(decode("\xF0\x9F\xC3\xA9", 0), 2));  // a new lead byte ends the subpart
}

TEST_CASE("utf8::append encodes each length; code points without a UTF-8 form become U+FFFD") {
  CHECK(encoded(0x41) == "A");
  CHECK(encoded(0x7F) == "\x7F");
  CHECK(encoded(0x80) == "\xC2\x80");
  CHECK(encoded(0xE9) == "\xC3\xA9");
  CHECK(encoded(0x7FF) == "\xDF\xBF");
  CHECK(encoded(0x800) == "\xE0\xA0\x80");
  CHECK(encoded(0x20AC) == "\xE2\x82\xAC");
  CHECK(encoded(0xFFFF) == "\xEF\xBF\xBF");
  CHECK(encoded(0x10000) == "\xF0\x90\x80\x80");
  CHECK(encoded(0x1F600) == "\xF0\x9F\x98\x80");
  CHECK(encoded(0x10FFFF) == "\xF4\x8F\xBF\xBF");
  CHECK(encoded(0xD800) == kFffd);  // a surrogate
  CHECK(encoded(0xDFFF) == kFffd);
  CHECK(encoded(0x110000) == kFffd);  // above U+10FFFF
  CHECK(encoded(0xFFFFFFFF) == kFffd);
}

TEST_CASE("utf8: every scalar value round-trips through append and decode") {
  std::size_t mismatches = 0, scalar_values = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (!dapo::utf8::is_scalar_value(cp)) continue;
    ++scalar_values;
    const std::string text = encoded(cp);
    const std::size_t length = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (!is(decode(text, 0), cp, length) || text.size() != length) ++mismatches;
  }
  CHECK(scalar_values == 0x110000 - 0x800);
  CHECK(mismatches == 0);
}

TEST_CASE("utf8: the well-formed 3-byte strings are exactly those Unicode's Table 3-7 allows") {
  // ASCII^3, ASCII + a 2-byte character either way round, or one 3-byte character (U+0800..U+FFFF less surrogates).
  constexpr uint64_t kTwoByteCharacters = 0x800 - 0x80;
  constexpr uint64_t kExpected = 128 * 128 * 128 + 2 * 128 * kTwoByteCharacters + (0x10000 - 0x800 - 0x800);
  uint64_t valid = 0;
  std::string text(3, '\0');
  for (uint32_t bytes = 0; bytes < (1u << 24); ++bytes) {
    text[0] = static_cast<char>(bytes >> 16), text[1] = static_cast<char>(bytes >> 8),
    text[2] = static_cast<char>(bytes);
    if (dapo::utf8::is_valid(text)) ++valid;
  }
  CHECK(valid == kExpected);
}

TEST_CASE("utf8::replace_invalid gives Python's errors='replace' result") {
  CHECK(replace_invalid("plain ASCII") == "plain ASCII");
  CHECK(replace_invalid("caf\xC3\xA9 \xF0\x9F\x98\x80") == "caf\xC3\xA9 \xF0\x9F\x98\x80");  // valid: unchanged
  CHECK(replace_invalid("") == "");
  CHECK(replace_invalid("\xE4\xBD") == kFffd);                                  // truncated 3-byte: one
  CHECK(replace_invalid("\xF0\x80") == kFffd + kFffd);                          // F0 needs 90..BF next: two
  CHECK(replace_invalid("\xED\xA0\x80") == kFffd + kFffd + kFffd);              // a surrogate: three
  CHECK(replace_invalid("\xC0\xAF") == kFffd + kFffd);                          // overlong: two
  CHECK(replace_invalid("\xE0\x80\xAF") == kFffd + kFffd + kFffd);              // overlong 3-byte: three
  CHECK(replace_invalid("\xF4\x90\x80\x80") == kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF: four
  CHECK(replace_invalid("\xF5\x80\x80\x80") == kFffd + kFffd + kFffd + kFffd);
  CHECK(replace_invalid("\xE4\xBD\xA0\xE5") == "\xE4\xBD\xA0" + kFffd);  // 你 then a cut character
  CHECK(replace_invalid("a\xF0\x9F\x98"
                        "b") == "a" + kFffd + "b");     // an emoji cut short: one
  CHECK(replace_invalid("\x80\x80") == kFffd + kFffd);  // stray continuations
  CHECK(replace_invalid("\xFF\xFE") == kFffd + kFffd);
  // Unicode's own example (Table 3-8): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  CHECK(replace_invalid("a\xF1\x80\x80\xE1\x80\xC2"
                        "b\x80"
                        "c\x80\xBF"
                        "d") == "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  CHECK(dapo::utf8::valid_prefix_length("ab\xC3\xA9\xFF"
                                        "c") == 4);
  CHECK(dapo::utf8::is_valid(replace_invalid("\xF0\x9F\x98\xED\xA0\x80\xC0")));
}

static_assert(dapo::utf8::decode("\xE2\x82\xAC", 0).code_point == 0x20AC, "decode is constexpr");
static_assert(!dapo::utf8::is_valid("\xED\xA0\x80"));
