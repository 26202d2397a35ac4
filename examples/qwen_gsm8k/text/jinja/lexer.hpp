// The tokens of a Jinja template: the text between tags, after the whitespace control that Hugging Face configures
// (trim_blocks, lstrip_blocks, and the - and + markers), and the names, literals and operators inside {{ }} and
// {% %}. Internal to the interpreter (jinja.hpp): parse.cpp reads them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "qwen_gsm8k/text/jinja/jinja.hpp"

namespace qwen::jinja::detail {

enum class TokenKind { text, variable_begin, variable_end, block_begin, block_end, name, string, number, op, end };

struct Token {
  TokenKind kind = TokenKind::end;
  std::size_t begin = 0, end = 0;  // the source bytes [begin, end)
  std::string value;               // text: the text; name: the name; string: the decoded literal; op: the operator
  Json number;                     // number: the integer or float
};

// Jinja's view of the source: \r\n and \r become \n, and one final newline is dropped (keep_trailing_newline=False).
std::string normalize_newlines(std::string_view source);

// The tokens of a normalised source (normalize_newlines), ending with one TokenKind::end. Throws TemplateError for
// an unclosed tag, comment or string, or a character or literal outside the subset.
std::vector<Token> tokenize(std::string_view source);

}  // namespace qwen::jinja::detail
