// Jinja's grammar over the tokens of lexer.hpp, with its operator precedence, to the statements and expressions
// of ast.hpp. Statements outside the subset are refused here, by name; filters, tests and methods are looked up
// when they run (builtins.cpp), as Jinja resolves them.
#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>
#include <utility>

#include "qwen_gsm8k/text/jinja/ast.hpp"
#include "qwen_gsm8k/text/jinja/lexer.hpp"

namespace qwen::jinja::detail {
namespace {

using std::string_view;

// The statements Jinja has and this subset does not; they are refused by name rather than as unknown words.
constexpr std::array<string_view, 18> kUnsupportedStatements = {
    "macro", "call",       "filter", "include",    "import", "from",      "extends",  "block",   "raw",
    "with",  "autoescape", "do",     "generation", "trans",  "pluralize", "endmacro", "endcall", "endblock"};

class Parser {
 public:
  Parser(string_view source, std::vector<Token> tokens) : source_(source), tokens_(std::move(tokens)) {}

  std::vector<Node> run() {
    std::vector<Node> nodes = parse_body({}, 0, "");
    return nodes;
  }

 private:
  const Token& current() const { return tokens_[at_]; }
  const Token& peek(std::size_t ahead = 1) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }
  const Token& advance() {
    const Token& token = tokens_[at_];
    if (at_ + 1 < tokens_.size()) ++at_;
    last_end_ = token.end;
    return token;
  }
  bool is_op(string_view op) const { return current().kind == TokenKind::op && current().value == op; }
  bool is_name(string_view name) const { return current().kind == TokenKind::name && current().value == name; }

  std::string describe(const Token& token) const {
    switch (token.kind) {
      case TokenKind::end:
        return "the end of the template";
      case TokenKind::variable_end:
        return "the end of the {{ }} tag";
      case TokenKind::block_end:
        return "the end of the {% %} tag";
      default:
        return "`" + std::string(source_.substr(token.begin, token.end - token.begin)) + "`";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail(source_, current().begin, "expected " + expected + ", found " + describe(current()));
  }
  void expect_op(string_view op) {
    if (!is_op(op)) unexpected("'" + std::string(op) + "'");
    advance();
  }
  std::string expect_name(const std::string& what) {
    if (current().kind != TokenKind::name) unexpected(what);
    return advance().value;
  }
  void expect_block_end(const std::string& statement) {
    if (current().kind == TokenKind::block_end) {
      advance();
      return;
    }
    if (is_op(","))
      fail(source_, current().begin, "a tuple without parentheses in {% " + statement + " %} is outside the subset");
    unexpected("the end of the {% " + statement + " %} tag");
  }

  // Statements until one of `end_names` (the {% name %} is left for the caller); at the end of the template when
  // `end_names` is empty. `opener` and `opened_at` name the block being closed, for the message when it is not.
  std::vector<Node> parse_body(std::initializer_list<string_view> end_names, std::size_t opened_at,
                               const std::string& opener) {
    std::vector<Node> nodes;
    for (;;) {
      const Token& token = current();
      if (token.kind == TokenKind::end) {
        if (end_names.size() == 0) return nodes;
        fail(source_, opened_at,
             "{% " + opener + " %} is not closed: no {% " + std::string(*(end_names.end() - 1)) + " %} follows");
      }
      if (token.kind == TokenKind::text) {
        Node node;
        node.kind = NodeKind::text;
        node.begin = token.begin;
        node.text = token.value;
        nodes.push_back(std::move(node));
        advance();
      } else if (token.kind == TokenKind::variable_begin) {
        Node node;
        node.kind = NodeKind::output;
        node.begin = advance().begin;
        node.value = parse_expression();
        if (is_op(",")) fail(source_, current().begin, "printing a tuple ({{ a, b }}) is outside the subset");
        if (current().kind != TokenKind::variable_end) unexpected("the end of the {{ }} tag");
        advance();
        nodes.push_back(std::move(node));
      } else if (token.kind == TokenKind::block_begin) {
        const std::size_t begin = token.begin;
        if (peek().kind != TokenKind::name) {
          advance();
          unexpected("a statement name after {%");
        }
        const std::string& name = peek().value;
        if (std::find(end_names.begin(), end_names.end(), name) != end_names.end()) return nodes;
        advance();
        nodes.push_back(parse_statement(begin));
      } else {
        unexpected("text or a tag");
      }
    }
  }

  Node parse_statement(std::size_t begin) {
    const Token name_token = advance();
    const std::string& name = name_token.value;
    Node node;
    node.begin = begin;
    if (name == "if") return parse_if(std::move(node));
    if (name == "for") return parse_for(std::move(node));
    if (name == "set") return parse_set(std::move(node));
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(source_, begin, "{% " + name + " %} outside a for loop");
      node.kind = name == "break" ? NodeKind::loop_break : NodeKind::loop_continue;
      expect_block_end(name);
      return node;
    }
    if (std::find(kUnsupportedStatements.begin(), kUnsupportedStatements.end(), name) != kUnsupportedStatements.end()) {
      fail(source_, begin, "{% " + name + " %} is outside the supported Jinja subset");
    }
    if (name == "elif" || name == "else" || name == "endif" || name == "endfor" || name == "endset") {
      fail(source_, begin, "unexpected {% " + name + " %}: no open block takes it here");
    }
    fail(source_, begin, "unknown statement {% " + name + " %} (not in the supported Jinja subset)");
  }

  Node parse_if(Node node) {
    node.kind = NodeKind::if_chain;
    const std::size_t begin = node.begin;
    ExprPtr condition = parse_expression(/*conditional=*/false);  // Jinja: no `x if c else y` as an if's test
    expect_block_end("if");
    for (;;) {
      std::vector<Node> body = parse_body({"elif", "else", "endif"}, begin, "if");
      node.branches.emplace_back(std::move(condition), std::move(body));
      advance();  // {%
      const std::string which = advance().value;
      if (which == "elif") {
        condition = parse_expression(/*conditional=*/false);
        expect_block_end("elif");
        continue;
      }
      if (which == "else") {
        expect_block_end("else");
        node.otherwise = parse_body({"endif"}, begin, "if");
        advance();
        advance();
      }
      expect_block_end("endif");
      return node;
    }
  }

  Node parse_for(Node node) {
    node.kind = NodeKind::for_loop;
    const bool parenthesised = is_op("(");
    if (parenthesised) advance();
    node.targets.push_back(expect_name("a loop variable name"));
    while (is_op(",")) {
      advance();
      node.targets.push_back(expect_name("a loop variable name"));
    }
    if (parenthesised) expect_op(")");
    if (!is_name("in")) unexpected("'in'");
    advance();
    node.value = parse_expression(/*conditional=*/false);
    if (is_name("if")) {
      advance();
      node.condition = parse_expression();
    }
    if (is_name("recursive")) fail(source_, current().begin, "recursive for loops are outside the subset");
    expect_block_end("for");
    ++loop_depth_;
    node.body = parse_body({"else", "endfor"}, node.begin, "for");
    --loop_depth_;
    advance();
    if (advance().value == "else") {
      expect_block_end("else");
      node.otherwise = parse_body({"endfor"}, node.begin, "for");
      advance();
      advance();
    }
    expect_block_end("endfor");
    return node;
  }

  Node parse_set(Node node) {
    node.text = expect_name("a variable name after set");
    if (is_op(".")) {
      advance();
      node.attribute = expect_name("an attribute name after '.'");
    }
    if (is_op(",")) fail(source_, current().begin, "{% set a, b = ... %} (tuple unpacking) is outside the subset");
    if (is_op("=")) {
      advance();
      node.kind = NodeKind::set;
      node.value = parse_expression();
      expect_block_end("set");
      return node;
    }
    if (!node.attribute.empty()) unexpected("'='");
    if (is_op("|")) fail(source_, current().begin, "a filtered {% set x | f %} block is outside the subset");
    node.kind = NodeKind::set_block;
    expect_block_end("set");
    node.body = parse_body({"endset"}, node.begin, "set");
    advance();
    advance();
    expect_block_end("endset");
    return node;
  }

  // Expressions, loosest binding first, as Jinja's parser: x if c else y; or; and; not; comparisons; + -; ~; * / // %;
  // **; unary - +; then a primary with its postfixes (.a, [k], (args)) and filters and tests.
  ExprPtr make(ExprKind kind, std::size_t begin, std::string name = {}) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->begin = begin;
    expr->name = std::move(name);
    return expr;
  }
  ExprPtr finish(ExprPtr expr) {
    expr->end = last_end_;
    return expr;
  }
  ExprPtr combine(ExprKind kind, std::string op, ExprPtr left, ExprPtr right) {
    auto expr = make(kind, left->begin, std::move(op));
    expr->operands.push_back(std::move(left));
    expr->operands.push_back(std::move(right));
    return finish(std::move(expr));
  }

  ExprPtr parse_expression(bool conditional = true) {
    ExprPtr expr = parse_or();
    while (conditional && is_name("if")) {
      advance();
      auto node = make(ExprKind::conditional, expr->begin);
      node->operands.push_back(std::move(expr));
      node->operands.push_back(parse_or());
      if (is_name("else")) {
        advance();
        node->operands.push_back(parse_expression());
      } else {
        node->operands.push_back(nullptr);
      }
      expr = finish(std::move(node));
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr expr = parse_and();
    while (is_name("or")) {
      advance();
      expr = combine(ExprKind::binary, "or", std::move(expr), parse_and());
    }
    return expr;
  }

  ExprPtr parse_and() {
    ExprPtr expr = parse_not();
    while (is_name("and")) {
      advance();
      expr = combine(ExprKind::binary, "and", std::move(expr), parse_not());
    }
    return expr;
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    auto expr = make(ExprKind::unary, advance().begin, "not");
    expr->operands.push_back(parse_not());
    return finish(std::move(expr));
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_sum();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    for (;;) {
      std::string op;
      if (current().kind == TokenKind::op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = advance().value;
      } else if (is_name("in")) {
        advance();
        op = "in";
      } else if (is_name("not") && peek().kind == TokenKind::name && peek().value == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        break;
      }
      ops.push_back(std::move(op));
      operands.push_back(parse_sum());
    }
    if (ops.empty()) return first;
    auto expr = make(ExprKind::compare, first->begin);
    expr->operands.push_back(std::move(first));
    for (auto& operand : operands) expr->operands.push_back(std::move(operand));
    expr->keywords = std::move(ops);
    return finish(std::move(expr));
  }

  ExprPtr parse_sum() {
    ExprPtr expr = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = advance().value;
      expr = combine(ExprKind::binary, std::move(op), std::move(expr), parse_concat());
    }
    return expr;
  }

  ExprPtr parse_concat() {
    ExprPtr expr = parse_product();
    while (is_op("~")) {
      advance();
      expr = combine(ExprKind::binary, "~", std::move(expr), parse_product());
    }
    return expr;
  }

  ExprPtr parse_product() {
    ExprPtr expr = parse_power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = advance().value;
      expr = combine(ExprKind::binary, std::move(op), std::move(expr), parse_power());
    }
    return expr;
  }

  // Jinja's ** is left-associative and binds looser than unary minus: -2 ** 2 is 4, 2 ** 3 ** 2 is 64.
  ExprPtr parse_power() {
    ExprPtr expr = parse_unary(true);
    while (is_op("**")) {
      advance();
      expr = combine(ExprKind::binary, "**", std::move(expr), parse_unary(true));
    }
    return expr;
  }

  ExprPtr parse_unary(bool with_filters) {
    ExprPtr expr;
    if (is_op("-") || is_op("+")) {
      const Token& sign = advance();
      expr = make(ExprKind::unary, sign.begin, sign.value);
      expr->operands.push_back(parse_unary(false));
      expr = finish(std::move(expr));
    } else {
      expr = parse_primary();
    }
    expr = parse_postfix(std::move(expr));
    return with_filters ? parse_filters(std::move(expr)) : std::move(expr);
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    if (token.kind == TokenKind::name) {
      const std::string& name = token.value;
      auto expr = make(ExprKind::literal, advance().begin);
      if (name == "true" || name == "True") {
        expr->literal = true;
      } else if (name == "false" || name == "False") {
        expr->literal = false;
      } else if (name == "none" || name == "None") {
        expr->literal = nullptr;
      } else {
        expr->kind = ExprKind::name;
        expr->name = name;
      }
      return finish(std::move(expr));
    }
    if (token.kind == TokenKind::string) {  // adjacent literals join, as in Python
      auto expr = make(ExprKind::literal, token.begin);
      std::string text;
      while (current().kind == TokenKind::string) text += advance().value;
      expr->literal = std::move(text);
      return finish(std::move(expr));
    }
    if (token.kind == TokenKind::number) {
      auto expr = make(ExprKind::literal, token.begin);
      expr->literal = advance().number;
      return finish(std::move(expr));
    }
    if (is_op("(")) return parse_parenthesised();
    if (is_op("[")) {
      auto expr = make(ExprKind::list, advance().begin);
      parse_sequence("]", [&] { expr->operands.push_back(parse_expression()); });
      return finish(std::move(expr));
    }
    if (is_op("{")) {
      auto expr = make(ExprKind::dict, advance().begin);
      parse_sequence("}", [&] {
        expr->operands.push_back(parse_expression());
        expect_op(":");
        expr->operands.push_back(parse_expression());
      });
      return finish(std::move(expr));
    }
    unexpected("an expression");
  }

  // Items separated by commas (a trailing one allowed) up to `close`, which is consumed.
  template <class ParseItem>
  void parse_sequence(string_view close, ParseItem parse_item) {
    while (!is_op(close)) {
      parse_item();
      if (!is_op(",")) break;
      advance();
    }
    expect_op(close);
  }

  // (x) is x; (), (x,) and (x, y) are tuples: list expressions named "tuple".
  ExprPtr parse_parenthesised() {
    const std::size_t begin = advance().begin;
    if (is_op(")")) {
      advance();
      return finish(make(ExprKind::list, begin, "tuple"));
    }
    ExprPtr first = parse_expression();
    if (is_op(")")) {
      advance();
      first->begin = begin;  // messages quote `(a or b).strip()` with both parentheses
      return finish(std::move(first));
    }
    auto expr = make(ExprKind::list, begin, "tuple");
    expr->operands.push_back(std::move(first));
    expect_op(",");
    parse_sequence(")", [&] { expr->operands.push_back(parse_expression()); });
    return finish(std::move(expr));
  }

  ExprPtr parse_postfix(ExprPtr expr) {
    for (;;) {
      if (is_op(".")) {
        advance();
        if (current().kind == TokenKind::number && current().number.is_number_integer()) {
          auto item = make(ExprKind::item, expr->begin);
          auto key = make(ExprKind::literal, current().begin);
          key->literal = advance().number;
          item->operands.push_back(std::move(expr));
          item->operands.push_back(finish(std::move(key)));
          expr = finish(std::move(item));
          continue;
        }
        auto attribute = make(ExprKind::attribute, expr->begin, expect_name("an attribute name after '.'"));
        attribute->operands.push_back(std::move(expr));
        expr = finish(std::move(attribute));
      } else if (is_op("[")) {
        expr = parse_subscript(std::move(expr));
      } else if (is_op("(")) {
        expr = parse_call(std::move(expr));
      } else {
        return expr;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    advance();  // [
    const std::size_t begin = object->begin;
    ExprPtr first;
    if (!is_op(":")) first = parse_expression();
    if (is_op("]")) {
      advance();
      auto item = make(ExprKind::item, begin);
      item->operands.push_back(std::move(object));
      item->operands.push_back(std::move(first));
      return finish(std::move(item));
    }
    if (is_op(",")) fail(source_, current().begin, "a tuple subscript x[a, b] is outside the subset");
    auto slice = make(ExprKind::slice, begin);
    slice->operands.push_back(std::move(object));
    slice->operands.push_back(std::move(first));
    expect_op(":");
    slice->operands.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression());
    if (is_op(":")) {
      advance();
      slice->operands.push_back(is_op("]") ? nullptr : parse_expression());
    } else {
      slice->operands.push_back(nullptr);
    }
    expect_op("]");
    return finish(std::move(slice));
  }

  // (a, b, key=c) after a callee, filter or test: positional arguments first, then keywords.
  void parse_arguments(Expr& expr) {
    expect_op("(");
    parse_sequence(")", [&] {
      if (is_op("*") || is_op("**")) fail(source_, current().begin, "*args and **kwargs are outside the subset");
      if (current().kind == TokenKind::name && peek().kind == TokenKind::op && peek().value == "=") {
        expr.keywords.push_back(advance().value);
        advance();
      } else {
        if (!expr.keywords.empty() && !expr.keywords.back().empty()) {
          fail(source_, current().begin, "a positional argument after a keyword argument");
        }
        expr.keywords.emplace_back();
      }
      expr.operands.push_back(parse_expression());
    });
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make(ExprKind::call, callee->begin);
    call->operands.push_back(std::move(callee));
    parse_arguments(*call);
    return finish(std::move(call));
  }

  ExprPtr parse_filters(ExprPtr expr) {
    for (;;) {
      if (is_op("|")) {
        advance();
        auto filter = make(ExprKind::filter, expr->begin, expect_name("a filter name after '|'"));
        filter->operands.push_back(std::move(expr));
        if (is_op("(")) parse_arguments(*filter);
        expr = finish(std::move(filter));
      } else if (is_name("is")) {
        advance();
        const bool negated = is_name("not");
        if (negated) advance();
        auto test = make(ExprKind::test, expr->begin, expect_name("a test name after 'is'"));
        test->negated = negated;
        test->operands.push_back(std::move(expr));
        if (is_op("(")) {
          parse_arguments(*test);
        } else if (starts_bare_test_argument()) {  // `x is divisibleby 3`
          test->keywords.emplace_back();
          test->operands.push_back(parse_postfix(parse_primary()));
        }
        expr = finish(std::move(test));
      } else if (is_op("(")) {
        expr = parse_call(std::move(expr));
      } else {
        return expr;
      }
    }
  }

  bool starts_bare_test_argument() const {
    const Token& token = current();
    if (token.kind == TokenKind::name) return token.value != "else" && token.value != "or" && token.value != "and";
    return token.kind == TokenKind::string || token.kind == TokenKind::number || is_op("[") || is_op("{");
  }

  string_view source_;
  std::vector<Token> tokens_;
  std::size_t at_ = 0;
  std::size_t last_end_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::vector<Node> parse(std::string_view source) {
  return Parser(source, tokenize(source)).run();
}

}  // namespace qwen::jinja::detail
