// The parsed form of a Jinja template (jinja.hpp's subset): statements holding expressions, each node with the source
// bytes it came from so that an error can name them. Internal to the interpreter: parse.cpp builds it from
// lexer.hpp's tokens, jinja.cpp runs it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qwen_gsm8k/text/jinja/jinja.hpp"

namespace qwen::jinja::detail {

enum class ExprKind {
  literal,      // `literal`
  name,         // `name`
  list,         // operands: the elements; `name` is "tuple" for (a, b)
  dict,         // operands: key, value, key, value, ...
  attribute,    // operands: [object]; `name`: the attribute
  item,         // operands: [object, key]
  slice,        // operands: [object, start, stop, step], each of the last three may be null
  call,         // operands: [callee, arguments...]; `keywords`: one per argument, "" when positional
  filter,       // operands: [subject, arguments...]; `name`: the filter; `keywords` as for call
  test,         // operands: [subject, arguments...]; `name`: the test; `negated` for `is not`
  unary,        // operands: [operand]; `name`: "not", "-" or "+"
  binary,       // operands: [left, right]; `name`: + - * / // % ** ~ and or
  compare,      // operands: a, b, c, ...; `keywords`: the operators between them (== != < <= > >= in, not in)
  conditional,  // operands: [value, condition, otherwise (may be null)]
};

struct Expr {
  ExprKind kind = ExprKind::literal;
  std::size_t begin = 0, end = 0;  // the source bytes [begin, end)
  std::string name;
  Json literal;
  std::vector<std::unique_ptr<Expr>> operands;
  std::vector<std::string> keywords;
  bool negated = false;
};
using ExprPtr = std::unique_ptr<Expr>;

enum class NodeKind { text, output, if_chain, for_loop, set, set_block, loop_break, loop_continue };

struct Node {
  NodeKind kind = NodeKind::text;
  std::size_t begin = 0;
  std::string text;                  // text: the literal text; set, set_block: the name assigned
  std::string attribute;             // set: the attribute of `set ns.attribute = ...`, else empty
  ExprPtr value;                     // output: what is printed; set: the value; for_loop: what is iterated
  ExprPtr condition;                 // for_loop: the `if` filter (may be null)
  std::vector<std::string> targets;  // for_loop: the loop names (several unpack)
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if_chain: if and each elif
  std::vector<Node> body;                                       // for_loop, set_block
  std::vector<Node> otherwise;                                  // if_chain, for_loop: the else branch
};

// The statements of a normalised source, with trim_blocks, lstrip_blocks and the - / + markers applied to its text.
std::vector<Node> parse(std::string_view source);

// Throws TemplateError for `problem` at byte `offset` of the normalised source (which gives line and column).
[[noreturn]] void fail(std::string_view source, std::size_t offset, const std::string& problem);

// The source text of an expression for a message: `messages[0]['role']`, cut short when long.
std::string quote_source(std::string_view source, std::size_t begin, std::size_t end);

}  // namespace qwen::jinja::detail
