// NFC through utf8proc and Split through PCRE2 (JIT-compiled where available), as `tokenizers` runs them.
#include "qwen_gsm8k/text/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <dapo/core/error.hpp>
#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/text/unicode_ranges.hpp"

namespace qwen::detail {
namespace {

using dapo::concat;

std::string pcre2_message(int error_code) {
  std::array<PCRE2_UCHAR, 256> message{};
  pcre2_get_error_message(error_code, message.data(), message.size());
  return reinterpret_cast<const char*>(message.data());
}

// Unicode's White_Space characters: what Oniguruma, the regex engine of `tokenizers`, matches with \s. PCRE2 with
// PCRE2_UCP matches one more, U+180E MONGOLIAN VOWEL SEPARATOR (a space until Unicode 6.3, still in PCRE2's \h), so
// " \u180e7" would split as " ", "\u180e", "7" instead of " \u180e", "7".
constexpr std::string_view kWhiteSpace =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
    R"(\x{205F}\x{3000})";

// An escape that stands for a set of code points which is spelled out as class ranges.
struct SpelledEscape {
  std::string_view ranges;    // the set, as PCRE2 class ranges without brackets
  std::string_view positive;  // the plain escape for the set: \s, \p{L} or \p{N}
  bool negated = false;       // the escape means the complement of `ranges`
  std::size_t length = 0;     // of the escape in the pattern, backslash included
};

// The escape whose backslash is at pattern[at] when it is one that is spelled out: \s, \S, and the letter and number
// properties \p{L}, \p{N} and their negations \P{L}, \p{^L}, ... in every spelling that PCRE2 accepts (\pL, \p{ l },
// ...: case, spaces, '_' and '-' are ignored in names); nullopt for any other escape.
std::optional<SpelledEscape> spelled_escape(std::string_view pattern, std::size_t at) {
  const char kind = pattern[at + 1];
  if (kind == 's' || kind == 'S') return SpelledEscape{kWhiteSpace, "\\s", kind == 'S', 2};
  if ((kind != 'p' && kind != 'P') || at + 2 >= pattern.size()) return std::nullopt;
  std::string_view written = pattern.substr(at + 2, 1);
  std::size_t length = 3;
  if (written == "{") {
    const std::size_t close = pattern.find('}', at + 3);
    if (close == std::string_view::npos) return std::nullopt;  // PCRE2 has refused the pattern already
    written = pattern.substr(at + 3, close - (at + 3));
    length = close + 1 - at;
  }
  std::string name;  // as PCRE2 compares names
  for (const char c : written) {
    if (c != ' ' && c != '_' && c != '-') name += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  bool negated = kind == 'P';
  if (!name.empty() && name.front() == '^') {
    negated = !negated;
    name.erase(0, 1);
  }
  if (name == "l") return SpelledEscape{kUnicodeLetters, "\\p{L}", negated, length};
  if (name == "n") return SpelledEscape{kUnicodeNumbers, "\\p{N}", negated, length};
  return std::nullopt;
}

// `pattern` with the classes that PCRE2 would take from its own tables spelled out as Oniguruma reads them: \s as
// kWhiteSpace, \p{L} and \p{N} as Unicode 16.0's letters and numbers (unicode_ranges.hpp; the tables of `tokenizers`
// 0.23 are 16.0) whatever Unicode version the build's PCRE2 has (14.0 in Debian 12's 10.42, 17.0 in Debian sid's
// 10.49), and \S, \P{L} and \P{N} as their complements. Escapes, \Q...\E quotes and character classes are followed
// so that only real escapes are replaced. A negated escape inside a class has no spelling (PCRE2 has no class
// subtraction) and is refused. Other properties (\p{Lu}, \p{Han}, and \d, \w or [:alpha:] under PCRE2_UCP) keep
// PCRE2's tables; the patterns of GPT-2 and Qwen2 have none.
std::string with_spelled_classes(std::string_view pattern, const std::string& where) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      if (const auto escape = spelled_escape(pattern, i)) {
        if (escape->negated && in_class) {
          throw std::runtime_error(concat(where, ": the split pattern has ", pattern.substr(i, escape->length),
                                          " inside a character class at offset ", i,
                                          ", which is not supported (hint: write [^", escape->positive,
                                          "...] instead)"));
        }
        if (in_class) {
          out += escape->ranges;
        } else {
          out += escape->negated ? "[^" : "[";
          out += escape->ranges;
          out += ']';
        }
        i += escape->length - 1;
        continue;
      }
      const char escaped = pattern[++i];
      if (escaped == 'Q') {  // a quote runs to \E or to the end: copied as it is
        const std::size_t end = pattern.find("\\E", i + 1);
        const std::size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i - 1, stop - (i - 1)));
        i = stop - 1;
      } else {
        out += c;
        out += escaped;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a literal ] first in a class
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:] in a class
      const std::size_t end = pattern.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i + 1, end + 2 - (i + 1)));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

pcre2_code* compile(std::string_view pattern, uint32_t options, const std::string& where) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    throw std::runtime_error(concat(where, ": the split pattern does not compile at offset ", error_offset, ": ",
                                    pcre2_message(error_code),
                                    " (hint: the pattern is read as a PCRE2 regex with Unicode properties)"));
  }
  return code;
}

}  // namespace

bool may_change_under_nfc(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; });
}

std::string to_nfc(std::string_view text) {
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &normalized, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) throw std::runtime_error(concat("qwen::Tokenizer: NFC failed: ", utf8proc_errmsg(length)));
  std::string out(reinterpret_cast<const char*>(normalized), static_cast<std::size_t>(length));
  std::free(normalized);
  return out;
}

void SplitRegex::CodeDeleter::operator()(pcre2_code* code) const noexcept {
  pcre2_code_free(code);
}

SplitRegex::SplitRegex(std::string_view pattern, bool literal, const std::string& where) {
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  code_.reset(compile(pattern, options, where));  // as written first, so that an error names an offset in it
  if (!literal) code_.reset(compile(with_spelled_classes(pattern, where), options, where));
  pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // the interpreter still works where the JIT is unavailable
}

SplitRegex::Matches::Matches(const SplitRegex& regex, std::string_view text)
    : code_(regex.code_.get()), text_(text), match_data_(pcre2_match_data_create_from_pattern(code_, nullptr)) {
  if (match_data_ == nullptr) throw std::bad_alloc();
}

SplitRegex::Matches::~Matches() {
  pcre2_match_data_free(match_data_);
}

std::optional<SplitRegex::Match> SplitRegex::Matches::next() {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text_.data());
  while (search_ < text_.size()) {
    const int rc = pcre2_match(code_, subject, text_.size(), search_, PCRE2_NO_UTF_CHECK, match_data_, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw std::runtime_error(
          concat("qwen::Tokenizer::encode: the split regex failed at byte ", search_, ": ", pcre2_message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data_);
    const std::size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // an empty match is no piece; step over one character and search on
      const dapo::utf8::Sequence sequence = dapo::utf8::decode(text_, start);
      search_ = start + (sequence.valid ? sequence.length : 1);
      continue;
    }
    search_ = end;
    return Match{start, end};
  }
  search_ = text_.size();
  return std::nullopt;
}

}  // namespace qwen::detail
