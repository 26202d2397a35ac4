// A small Jinja2 interpreter for Hugging Face chat templates: the subset of the language that the Qwen2/Qwen2.5
// family's templates use, rendered as transformers' apply_chat_template renders them (Jinja2 with trim_blocks and
// lstrip_blocks, the loopcontrols extension, Hugging Face's tojson and raise_exception). Not a general Jinja engine:
// a construct outside the subset throws TemplateError naming it and where it is, instead of rendering text that might
// differ from what Jinja renders.
//
// The subset. Statements: if/elif/else, for (one name or several to unpack, an `if` filter, an else branch, the loop
// variables index, index0, revindex, revindex0, first, last, length, previtem, nextitem), break, continue, set (a name,
// `ns.attribute`, or a {% set x %}...{% endset %} block), comments, whitespace control with - and +. Expressions:
// string, integer and float literals, true/false/none, lists, tuples, dicts, names, `a.b`, `a[b]`, slices,
// + - * / // % ** ~, comparisons (chained), in / not in, and / or / not, `x if c else y`. Filters: length, count,
// tojson, trim, default (d), upper, lower, capitalize, string, join, first, last, list, items, reverse, replace, safe.
// Tests: defined, undefined, none, string, number, integer, float, boolean, true, false, mapping, sequence, iterable,
// odd, even, divisibleby, eq (equalto), ne. Methods: str.startswith/endswith/strip/lstrip/rstrip/split/upper/lower/
// replace/capitalize, dict.items/keys/values/get. Globals: namespace, dict, range, raise_exception.
// Values follow Python: strings are sequences of code points, `1 == 1.0`, `7 // -2` is -4, str(1e16) is "1e+16",
// a tuple never equals a list, dict views and the iterators of reverse and items are not lists. Where the subset
// would have to guess (the repr of a list, upper() of non-ASCII text, a bound method used as a value) it throws.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace qwen::jinja {

// Template values: Python's str, int, float, bool, None, list and dict are JSON's kinds. ordered_json keeps a dict's
// insertion order, as Python's dict does (iteration and tojson show it).
using Json = nlohmann::ordered_json;

// A template that cannot be parsed or rendered: the problem, and where in the template it is. Line and column are
// 1-based, the column and `offset` count from the template's text after Jinja's newline normalisation (\r\n and \r
// read as \n); the column counts characters, `offset` bytes.
class TemplateError : public std::runtime_error {
 public:
  TemplateError(const std::string& problem, std::size_t offset, std::size_t line, std::size_t column);
  const std::string& problem() const { return problem_; }
  std::size_t offset() const { return offset_; }
  std::size_t line() const { return line_; }
  std::size_t column() const { return column_; }

 private:
  std::string problem_;
  std::size_t offset_, line_, column_;
};

class Template {
 public:
  // Parses `source` (UTF-8). Throws TemplateError for a syntax error or a statement outside the subset, such as
  // {% macro %}, {% include %} or {% raw %}.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the members of `variables` (a JSON object) as the template's global names. Throws TemplateError
  // when the template calls raise_exception, evaluates a filter, test, method or expression outside the subset, or
  // does what Jinja refuses (adding a number to a string, reading an attribute of an undefined name). Constructs in
  // branches that these variables do not reach are parsed but never evaluated.
  std::string render(const Json& variables) const;

 private:
  struct Program;
  std::unique_ptr<const Program> program_;
};

}  // namespace qwen::jinja
