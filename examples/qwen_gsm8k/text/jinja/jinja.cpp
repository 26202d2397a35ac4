// Running a parsed template (ast.hpp): statements write text, expressions evaluate to values (value.hpp)
// with Jinja's scoping. A for loop's body gets a fresh scope on every iteration, so `set` inside a loop neither leaks
// out nor carries to the next iteration (that is what namespace() is for); if blocks share their enclosing scope.
#include "qwen_gsm8k/text/jinja/jinja.hpp"

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <map>
#include <utility>

#include "qwen_gsm8k/text/jinja/ast.hpp"
#include "qwen_gsm8k/text/jinja/builtins.hpp"
#include "qwen_gsm8k/text/jinja/lexer.hpp"
#include "qwen_gsm8k/text/jinja/text.hpp"
#include "qwen_gsm8k/text/jinja/value.hpp"

namespace qwen::jinja {

TemplateError::TemplateError(const std::string& problem, std::size_t offset, std::size_t line, std::size_t column)
    : std::runtime_error("line " + std::to_string(line) + ", column " + std::to_string(column) + " (byte " +
                         std::to_string(offset) + "): " + problem),
      problem_(problem),
      offset_(offset),
      line_(line),
      column_(column) {}

namespace detail {

void fail(std::string_view source, std::size_t offset, const std::string& problem) {
  offset = std::min(offset, source.size());
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') ++line, line_start = i + 1;
  }
  std::size_t column = 1;
  for (std::size_t at = line_start; at < offset; ++column) {
    at += std::max<std::size_t>(dapo::utf8::decode(source, at).length, 1);
  }
  throw TemplateError(problem, offset, line, column);
}

std::string quote_source(std::string_view source, std::size_t begin, std::size_t end) {
  constexpr std::size_t kLongest = 60;
  const std::string_view text = source.substr(begin, end > begin ? end - begin : 0);
  std::size_t cut = std::min(text.size(), kLongest);
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  std::string quoted = "`";  // appended, not "`" + ...: g++ 12 warns (-Wrestrict) about that form
  quoted.append(text.substr(0, cut)).append(cut < text.size() ? "...`" : "`");
  return quoted;
}

namespace {

// A scope entry no template can name (it is not an identifier): whether the innermost loop iterates tuples.
constexpr const char* kLoopOverTuples = "loop over tuples";

// Whether Jinja's compiler folds `expr` into a constant: no names and no calls anywhere in it.
bool is_constant(const Expr& expr) {
  if (expr.kind == ExprKind::name || expr.kind == ExprKind::call) return false;
  return std::all_of(expr.operands.begin(), expr.operands.end(),
                     [](const ExprPtr& operand) { return !operand || is_constant(*operand); });
}

class Renderer {
 public:
  Renderer(std::string_view source, const Json& variables) : source_(source), variables_(variables) {
    scopes_.emplace_back();  // the template's own `set`s, above the caller's variables
  }

  std::string run(const std::vector<Node>& nodes) {
    std::string out;
    execute(nodes, out);
    return out;
  }

 private:
  enum class Flow { next, break_loop, continue_loop };

  Flow execute(const std::vector<Node>& nodes, std::string& out) {
    for (const Node& node : nodes) {
      const Flow flow = execute(node, out);
      if (flow != Flow::next) return flow;
    }
    return Flow::next;
  }

  Flow execute(const Node& node, std::string& out) {
    switch (node.kind) {
      case NodeKind::text:
        out += node.text;
        return Flow::next;
      case NodeKind::output: {
        const Value value = evaluate(*node.value);
        out += guarded(*node.value, [&] { return to_str(value); });
        return Flow::next;
      }
      case NodeKind::if_chain:
        for (const auto& [condition, body] : node.branches) {
          if (truthy(evaluate(*condition))) return execute(body, out);
        }
        return execute(node.otherwise, out);
      case NodeKind::for_loop:
        return execute_for(node, out);
      case NodeKind::set:
        assign(node, evaluate(*node.value));
        return Flow::next;
      case NodeKind::set_block: {
        std::string text;
        scopes_.emplace_back();
        execute(node.body, text);
        scopes_.pop_back();
        assign(node, Value::of(std::move(text)));
        return Flow::next;
      }
      case NodeKind::loop_break:
        return Flow::break_loop;
      case NodeKind::loop_continue:
        return Flow::continue_loop;
    }
    return Flow::next;
  }

  Flow execute_for(const Node& node, std::string& out) {
    const Value iterable = evaluate(*node.value);
    std::vector<Value> items = guarded(*node.value, [&] { return iterate(iterable); });
    if (node.condition) {  // `for x in xs if c`: filtered before the loop variables are counted
      std::vector<Value> kept;
      for (Value& item : items) {
        scopes_.emplace_back();
        bind_targets(node, item);
        const bool keep = truthy(evaluate(*node.condition));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      scopes_.emplace_back();
      execute(node.otherwise, out);
      scopes_.pop_back();
      return Flow::next;
    }
    const auto length = static_cast<int64_t>(items.size());
    // The loop object is plain JSON, which cannot hold a tuple: over tuples, loop.previtem and loop.nextitem throw.
    const bool tuples = items.front().sequence == Sequence::tuple;
    for (int64_t i = 0; i < length; ++i) {
      Json loop = {{"index", i + 1},
                   {"index0", i},
                   {"revindex", length - i},
                   {"revindex0", length - i - 1},
                   {"first", i == 0},
                   {"last", i == length - 1},
                   {"length", length},
                   {"depth", 1},
                   {"depth0", 0}};
      if (i > 0 && !tuples) loop["previtem"] = items[static_cast<std::size_t>(i - 1)].data;
      if (i + 1 < length && !tuples) loop["nextitem"] = items[static_cast<std::size_t>(i + 1)].data;
      scopes_.emplace_back();
      bind_targets(node, items[static_cast<std::size_t>(i)]);
      scopes_.back()["loop"] = Value::of(std::move(loop));
      scopes_.back()[kLoopOverTuples] = Value::of(tuples);
      const Flow flow = execute(node.body, out);
      scopes_.pop_back();
      if (flow == Flow::break_loop) break;
    }
    return Flow::next;
  }

  void bind_targets(const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = item;
      return;
    }
    if (item.undefined || item.space || !item.data.is_array() || item.data.size() != node.targets.size()) {
      fail(source_, node.value->begin,
           "cannot unpack a " + type_name(item) + " into the " + std::to_string(node.targets.size()) +
               " loop variables (the subset unpacks lists of that length)");
    }
    for (std::size_t i = 0; i < node.targets.size(); ++i) scopes_.back()[node.targets[i]] = Value::of(item.data[i]);
  }

  void assign(const Node& node, Value value) {
    if (value.sequence == Sequence::iterator) {  // used up by its first loop in Jinja: only inline use is the same
      fail(source_, node.value->begin,
           "storing an iterator (from the reverse or items filter) in a variable is outside the subset; apply the list "
           "filter first");
    }
    if (node.attribute.empty()) {
      scopes_.back()[node.text] = std::move(value);
      return;
    }
    const Value target = lookup(node.text);
    if (!target.is_namespace()) {
      fail(source_, node.begin,
           "`set " + node.text + "." + node.attribute + "`: " + node.text + " is a " + type_name(target) +
               "; only a namespace() takes attributes");
    }
    if (!value.storable()) {
      fail(source_, node.value->begin,
           "storing a value of type '" + type_name(value) + "' in a namespace is outside the subset");
    }
    (*target.space)[node.attribute] = std::move(value.data);
  }

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      const auto found = scope->find(name);
      if (found != scope->end()) return found->second;
    }
    const auto found = variables_.find(name);
    if (found != variables_.end()) return Value::of(*found);
    return Value::missing("'" + name + "' is undefined");
  }

  // Runs `operation` for `expr`; a ValueError from it becomes a TemplateError naming the expression and its place.
  template <class Operation>
  auto guarded(const Expr& expr, Operation operation) -> decltype(operation()) {
    try {
      return operation();
    } catch (const ValueError& error) {
      fail(source_, expr.begin, quote_source(source_, expr.begin, expr.end) + ": " + error.what());
    }
  }

  Value evaluate(const Expr& expr) {
    return guarded(expr, [&] { return evaluate_unguarded(expr); });
  }

  Value evaluate_unguarded(const Expr& expr) {
    const auto& operands = expr.operands;
    switch (expr.kind) {
      case ExprKind::literal:
        return Value::of(expr.literal);
      case ExprKind::name:
        return lookup(expr.name);
      case ExprKind::list: {
        Json items = Json::array();
        for (const auto& operand : operands)
          items.push_back(plain(*operand, "a " + std::string(expr.name.empty() ? "list" : "tuple")));
        return Value::sequence_of(std::move(items), expr.name == "tuple" ? Sequence::tuple : Sequence::list);
      }
      case ExprKind::dict: {
        Json members = Json::object();
        for (std::size_t i = 0; i + 1 < operands.size(); i += 2) {
          const Value key = evaluate(*operands[i]);
          if (!key.is_string()) throw ValueError("a dict key of type '" + type_name(key) + "' is outside the subset");
          members[key.data.get<std::string>()] = plain(*operands[i + 1], "a dict");
        }
        return Value::of(std::move(members));
      }
      case ExprKind::attribute:
        if ((expr.name == "previtem" || expr.name == "nextitem") && operands[0]->kind == ExprKind::name &&
            operands[0]->name == "loop" && truthy(lookup(kLoopOverTuples))) {
          throw ValueError("loop." + expr.name + " in a loop over tuples (items()) is outside the subset");
        }
        return get_attribute(evaluate(*operands[0]), expr.name);
      case ExprKind::item:
        return get_item(evaluate(*operands[0]), evaluate(*operands[1]));
      case ExprKind::slice: {
        const auto bound = [&](const ExprPtr& operand) { return operand ? evaluate(*operand) : Value::of(nullptr); };
        return slice(evaluate(*operands[0]), bound(operands[1]), bound(operands[2]), bound(operands[3]));
      }
      case ExprKind::call:
        return call(expr);
      case ExprKind::filter:
        return apply_filter(expr.name, evaluate(*operands[0]), arguments(expr));
      case ExprKind::test:
        return Value::of(apply_test(expr.name, evaluate(*operands[0]), arguments(expr)) != expr.negated);
      case ExprKind::unary: {
        const Value operand = evaluate(*operands[0]);
        if (expr.name == "not") return Value::of(!truthy(operand));
        const bool number =
            !operand.undefined && !operand.space && (operand.data.is_number() || operand.data.is_boolean());
        if (!number) throw ValueError("bad operand type for unary " + expr.name + ": '" + type_name(operand) + "'");
        return arithmetic(expr.name, Value::of(0), operand);
      }
      case ExprKind::binary: {
        const Value left = evaluate(*operands[0]);
        // and / or give back an operand, not a bool, and skip the right one when the left decides.
        if (expr.name == "and") return truthy(left) ? evaluate(*operands[1]) : left;
        if (expr.name == "or") return truthy(left) ? left : evaluate(*operands[1]);
        const Value right = evaluate(*operands[1]);
        if (expr.name == "~") return Value::of(to_str(left) + to_str(right));
        // Jinja folds a constant base such as -2 into the literal -2 and writes `-2 ** x` into Python, which reads it
        // as -(2 ** x); with a constant exponent the whole power folds correctly.
        if (expr.name == "**" && is_constant(*operands[0]) && !is_constant(*operands[1]) &&
            compare_numbers_below_zero(left)) {
          throw ValueError(
              "a negative constant raised to a computed power renders as -(a ** b) in Jinja; this is "
              "outside the subset");
        }
        return arithmetic(expr.name, left, right);
      }
      case ExprKind::compare: {
        Value left = evaluate(*operands[0]);
        for (std::size_t i = 1; i < operands.size(); ++i) {  // a < b < c is a < b and b < c
          Value right = evaluate(*operands[i]);
          if (!compare_once(expr.keywords[i - 1], left, right)) return Value::of(false);
          left = std::move(right);
        }
        return Value::of(true);
      }
      case ExprKind::conditional:
        if (truthy(evaluate(*operands[1]))) return evaluate(*operands[0]);
        if (operands[2]) return evaluate(*operands[2]);
        return Value::missing("the conditional expression had no else branch");
    }
    throw ValueError("unknown expression");
  }

  static bool compare_numbers_below_zero(const Value& value) {
    return !value.undefined && !value.space && (value.data.is_number() || value.data.is_boolean()) &&
           compare(value, Value::of(0)) < 0;
  }

  // A value that must be plain data (an element of a list, tuple or dict literal).
  Json plain(const Expr& expr, const std::string& where) {
    Value value = evaluate(expr);
    if (!value.storable()) {
      throw ValueError("a value of type '" + type_name(value) + "' inside " + where + " literal is outside the subset");
    }
    return std::move(value.data);
  }

  static bool compare_once(const std::string& op, const Value& left, const Value& right) {
    if (op == "==") return equal(left, right);
    if (op == "!=") return !equal(left, right);
    if (op == "in") return contains(right, left);
    if (op == "not in") return !contains(right, left);
    const int order = compare(left, right);
    if (op == "<") return order < 0;
    if (op == "<=") return order <= 0;
    if (op == ">") return order > 0;
    return order >= 0;  // >=
  }

  Arguments arguments(const Expr& expr) {
    Arguments result;
    for (std::size_t i = 1; i < expr.operands.size(); ++i) {
      result.values.push_back(evaluate(*expr.operands[i]));
      result.keywords.push_back(expr.keywords[i - 1]);
    }
    return result;
  }

  // obj.method(...) calls a str or dict method; name(...) a global, unless the template bound the name to a value.
  Value call(const Expr& expr) {
    const Expr& callee = *expr.operands[0];
    if (callee.kind == ExprKind::attribute) {
      const Value object = evaluate(*callee.operands[0]);
      return call_method(object, callee.name, arguments(expr));
    }
    if (callee.kind == ExprKind::name) {
      const Value bound = lookup(callee.name);
      if (!bound.undefined) throw ValueError("'" + type_name(bound) + "' object is not callable");
      return call_global(callee.name, arguments(expr));
    }
    throw ValueError("calling the result of an expression is outside the subset");
  }

  std::string_view source_;
  const Json& variables_;
  std::vector<std::map<std::string, Value>> scopes_;  // innermost last
};

}  // namespace
}  // namespace detail

struct Template::Program {
  std::string source;  // normalised: the offsets of nodes and messages count in it
  std::vector<detail::Node> nodes;
};

Template::Template(std::string_view source) {
  auto program = std::make_unique<Program>();
  program->source = detail::normalize_newlines(source);
  program->nodes = detail::parse(program->source);
  program_ = std::move(program);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Json& variables) const {
  if (!variables.is_object()) {
    throw std::invalid_argument("qwen::jinja::Template::render: variables must be a JSON object, not " +
                                std::string(variables.type_name()));
  }
  return detail::Renderer(program_->source, variables).run(program_->nodes);
}

}  // namespace qwen::jinja
