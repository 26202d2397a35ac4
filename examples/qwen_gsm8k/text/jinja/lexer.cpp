// The lexer of the Jinja subset (lexer.hpp): text between tags with Hugging Face's whitespace control applied,
// and the tokens inside {{ }} and {% %}. Comments are dropped here.
#include "qwen_gsm8k/text/jinja/lexer.hpp"

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <string>
#include <system_error>
#include <utility>

#include "qwen_gsm8k/text/jinja/ast.hpp"
#include "qwen_gsm8k/text/jinja/text.hpp"

namespace qwen::jinja::detail {
namespace {

using std::string_view;

// Python's one-letter escapes and what they stand for.
constexpr string_view kEscapeLetters = "\\'\"abfnrtv";
constexpr string_view kEscapeValues = "\\'\"\a\b\f\n\r\t\v";

// The Python whitespace character (one of is_python_space) that starts at text[pos], as its length in bytes; 0 when
// there is none. Jinja's \s is Unicode-aware, so lstrip_blocks and `-` strip U+3000 as well as spaces.
std::size_t space_at(string_view text, std::size_t pos) {
  const auto sequence = dapo::utf8::decode(text, pos);
  return sequence.valid && is_python_space(sequence.code_point) ? sequence.length : 0;
}

std::size_t skip_spaces(string_view text, std::size_t pos) {
  while (const std::size_t length = space_at(text, pos)) pos += length;
  return pos;
}

bool all_spaces(string_view text) {
  return !text.empty() && skip_spaces(text, 0) == text.size();
}

class Lexer {
 public:
  explicit Lexer(string_view source) : source_(source) {}

  std::vector<Token> run() {
    while (pos_ < source_.size()) {
      const std::size_t tag = find_tag(pos_);
      if (tag == string_view::npos) {
        add_text(std::string(source_.substr(pos_)));
        break;
      }
      const char kind = source_[tag + 1];
      const char sign =
          tag + 2 < source_.size() && (source_[tag + 2] == '-' || source_[tag + 2] == '+') ? source_[tag + 2] : '\0';
      add_text(text_before(tag, kind, sign));
      pos_ = tag + 2 + (sign != '\0' ? 1 : 0);
      if (kind == '#') {
        skip_comment(tag);
      } else {
        lex_tag(tag, kind == '{');
      }
    }
    tokens_.push_back({TokenKind::end, source_.size(), source_.size(), {}, {}});
    return std::move(tokens_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t at = source_.find('{', from); at != string_view::npos; at = source_.find('{', at + 1)) {
      if (at + 1 < source_.size() && (source_[at + 1] == '{' || source_[at + 1] == '%' || source_[at + 1] == '#')) {
        return at;
      }
    }
    return string_view::npos;
  }

  // The text between the previous tag and the one at `tag`, after `-` (strip all whitespace before the tag) or
  // lstrip_blocks (strip spaces between the line's start and a {% or {# tag alone on it; `+` turns that off).
  std::string text_before(std::size_t tag, char kind, char sign) const {
    string_view text = source_.substr(pos_, tag - pos_);
    if (sign == '-') {
      std::size_t keep = 0;
      for (std::size_t at = 0; at < text.size();) {
        const std::size_t length = space_at(text, at);
        if (length == 0) {
          at += std::max<std::size_t>(dapo::utf8::decode(text, at).length, 1);
          keep = at;
        } else {
          at += length;
        }
      }
      return std::string(text.substr(0, keep));
    }
    if (sign != '+' && kind != '{') {
      const std::size_t newline = text.rfind('\n');
      const std::size_t line_start = newline == string_view::npos ? 0 : newline + 1;
      if ((line_start > 0 || line_starting_) && all_spaces(text.substr(line_start))) {
        return std::string(text.substr(0, line_start));
      }
    }
    return std::string(text);
  }

  void add_text(std::string text) {
    if (!text.empty()) tokens_.push_back({TokenKind::text, pos_, pos_ + text.size(), std::move(text), {}});
  }

  // After a tag's end: `-` strips all whitespace that follows, trim_blocks one newline after %} and #}, `+` nothing.
  void after_tag_end(std::size_t end, char sign, bool block) {
    pos_ = end;
    if (sign == '-') {
      pos_ = skip_spaces(source_, pos_);
    } else if (sign != '+' && block && pos_ < source_.size() && source_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
  }

  void skip_comment(std::size_t tag) {
    const std::size_t close = source_.find("#}", pos_);
    if (close == string_view::npos) fail(source_, tag, "the comment {# is not closed (no #} follows)");
    const char sign = close > pos_ && (source_[close - 1] == '-' || source_[close - 1] == '+') ? source_[close - 1] : 0;
    after_tag_end(close + 2, sign, true);
  }

  // The tokens of a {{ ... }} or {% ... %} tag and its end. The end only counts outside brackets, so that
  // {{ {'a': {'b': 1}} }} reads as Jinja reads it.
  void lex_tag(std::size_t tag, bool variable) {
    tokens_.push_back({variable ? TokenKind::variable_begin : TokenKind::block_begin, tag, pos_, {}, {}});
    std::string open_brackets;
    for (;;) {
      pos_ = skip_spaces(source_, pos_);
      if (pos_ >= source_.size()) {
        fail(source_, tag,
             variable ? "the tag {{ is not closed (no }} follows)" : "the tag {% is not closed (no %} follows)");
      }
      if (open_brackets.empty() && lex_tag_end(variable)) return;
      lex_token(open_brackets);
    }
  }

  bool lex_tag_end(bool variable) {
    const string_view close = variable ? "}}" : "%}";
    const string_view rest = source_.substr(pos_);
    char sign = '\0';
    if (rest.size() >= 3 && (rest[0] == '-' || (rest[0] == '+' && !variable)) && rest.substr(1, 2) == close) {
      sign = rest[0];
    } else if (rest.substr(0, 2) != close) {
      return false;
    }
    const std::size_t end = pos_ + 2 + (sign != '\0' ? 1 : 0);
    tokens_.push_back({variable ? TokenKind::variable_end : TokenKind::block_end, pos_, end, {}, {}});
    after_tag_end(end, sign, !variable);
    return true;
  }

  void lex_token(std::string& open_brackets) {
    const std::size_t begin = pos_;
    const char c = source_[pos_];
    if (c >= '0' && c <= '9') return lex_number();
    if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      while (pos_ < source_.size() &&
             (source_[pos_] == '_' || std::isalnum(static_cast<unsigned char>(source_[pos_])))) {
        ++pos_;
      }
      tokens_.push_back({TokenKind::name, begin, pos_, std::string(source_.substr(begin, pos_ - begin)), {}});
      return;
    }
    if (c == '\'' || c == '"') return lex_string();
    static constexpr std::array<string_view, 6> kTwoCharacter = {"//", "**", "==", "!=", ">=", "<="};
    for (const string_view op : kTwoCharacter) {
      if (source_.substr(pos_, 2) == op) {
        pos_ += 2;
        tokens_.push_back({TokenKind::op, begin, pos_, std::string(op), {}});
        return;
      }
    }
    if (string_view("+-/*%~[](){}><=.:|,;").find(c) == string_view::npos) {
      const std::size_t length = std::max<std::size_t>(dapo::utf8::decode(source_, pos_).length, 1);
      fail(source_, begin,
           "unexpected character '" + std::string(source_.substr(pos_, length)) +
               "' inside a tag (names are ASCII in the subset)");
    }
    if (c == '(' || c == '[' || c == '{') open_brackets += c == '(' ? ')' : c == '[' ? ']' : '}';
    if (c == ')' || c == ']' || c == '}') {
      if (open_brackets.empty() || open_brackets.back() != c) {
        fail(source_, begin,
             std::string("unexpected '") + c + "'" +
                 (open_brackets.empty() ? "" : std::string(", expected '") + open_brackets.back() + "'"));
      }
      open_brackets.pop_back();
    }
    ++pos_;
    tokens_.push_back({TokenKind::op, begin, pos_, std::string(1, c), {}});
  }

  // Decimal integers and floats (1, 1_000, 2.5, 1e-3); Jinja's 0x / 0o / 0b forms are outside the subset.
  void lex_number() {
    const std::size_t begin = pos_;
    const auto digits = [&] {
      while (pos_ < source_.size() &&
             (std::isdigit(static_cast<unsigned char>(source_[pos_])) || source_[pos_] == '_')) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < source_.size() && source_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(source_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (pos_ < source_.size() && (source_[pos_] == 'e' || source_[pos_] == 'E')) {
      std::size_t at = pos_ + 1;
      if (at < source_.size() && (source_[at] == '+' || source_[at] == '-')) ++at;
      if (at < source_.size() && std::isdigit(static_cast<unsigned char>(source_[at]))) {
        pos_ = at;
        digits();
        is_float = true;
      }
    }
    std::string text(source_.substr(begin, pos_ - begin));
    if (pos_ < source_.size() && (std::isalpha(static_cast<unsigned char>(source_[pos_])) || source_[pos_] == '_')) {
      fail(source_, begin, "the number literal `" + text + source_[pos_] + "...` is outside the subset (decimal only)");
    }
    if (text.back() == '_' || text.find("__") != std::string::npos || text.find("_.") != std::string::npos) {
      fail(source_, begin, "misplaced '_' in the number literal `" + text + "`");
    }
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token token{TokenKind::number, begin, pos_, {}, {}};
    if (is_float) {
      double value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size()) {
        fail(source_, begin, "the float literal `" + text + "` is out of range");
      }
      token.number = value;
    } else {
      if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) {
        fail(source_, begin, "the integer literal `" + text + "` has leading zeros, which Jinja does not read");
      }
      try {
        token.number = static_cast<int64_t>(std::stoll(text));
      } catch (const std::out_of_range&) {
        fail(source_, begin, "the integer literal `" + text + "` does not fit in 64 bits");
      }
    }
    tokens_.push_back(std::move(token));
  }

  // A quoted literal with Python's escapes (\n, \t, \\, \', \", \xhh, \uhhhh, \Uhhhhhhhh, octal); an unknown escape
  // stays as written, as Python keeps it.
  void lex_string() {
    const std::size_t begin = pos_;
    const char quote = source_[pos_++];
    std::string value;
    for (;;) {
      if (pos_ >= source_.size()) fail(source_, begin, "the string literal is not closed");
      const char c = source_[pos_];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++pos_;
        continue;
      }
      const std::size_t escape = pos_;
      if (pos_ + 1 >= source_.size()) fail(source_, begin, "the string literal is not closed");
      const char kind = source_[pos_ + 1];
      pos_ += 2;
      if (const std::size_t simple = kEscapeLetters.find(kind); simple != string_view::npos) {
        value += kEscapeValues[simple];
      } else if (kind == '\n') {
        // a line continuation: nothing
      } else if (kind == 'x' || kind == 'u' || kind == 'U') {
        append_code_point(value, hex_digits(escape, kind == 'x' ? 2 : kind == 'u' ? 4 : 8), escape);
      } else if (kind == 'N') {
        fail(source_, escape, "the escape \\N{...} is outside the subset");
      } else if (kind >= '0' && kind <= '7') {
        char32_t code_point = static_cast<char32_t>(kind - '0');
        for (int more = 0; more < 2 && pos_ < source_.size() && source_[pos_] >= '0' && source_[pos_] <= '7'; ++more) {
          code_point = code_point * 8 + static_cast<char32_t>(source_[pos_++] - '0');
        }
        append_code_point(value, code_point, escape);
      } else if (static_cast<unsigned char>(kind) >= 0x80) {
        fail(source_, escape, "a backslash before a non-ASCII character is outside the subset");
      } else {
        value += '\\';
        value += kind;
      }
    }
    ++pos_;
    tokens_.push_back({TokenKind::string, begin, pos_, std::move(value), {}});
  }

  char32_t hex_digits(std::size_t escape, int count) {
    char32_t code_point = 0;
    for (int i = 0; i < count; ++i, ++pos_) {
      const char c = pos_ < source_.size() ? source_[pos_] : '\0';
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0)
        fail(source_, escape,
             "truncated escape: \\" + std::string(1, source_[escape + 1]) + " needs " + std::to_string(count) +
                 " hex digits");
      code_point = code_point * 16 + static_cast<char32_t>(digit);
    }
    return code_point;
  }

  void append_code_point(std::string& value, char32_t code_point, std::size_t escape) {
    if (!dapo::utf8::is_scalar_value(code_point)) {
      fail(source_, escape, "the escape is a surrogate or beyond U+10FFFF, which UTF-8 cannot hold");
    }
    dapo::utf8::append(value, code_point);
  }

  string_view source_;
  std::size_t pos_ = 0;
  bool line_starting_ = true;  // the previous tag's end consumed a newline (lstrip_blocks counts that as a line start)
  std::vector<Token> tokens_;
};

}  // namespace

std::string normalize_newlines(std::string_view source) {
  std::string text;
  text.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace qwen::jinja::detail
