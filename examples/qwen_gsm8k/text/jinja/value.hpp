// The values a Jinja template computes with, and Python's rules for them (Jinja evaluates with Python): truth,
// equality and order, arithmetic, str(), json.dumps, indexing and slicing by code point, and Python's whitespace.
// Internal to the interpreter (jinja.hpp). An operation Python would refuse, or one outside the subset, throws
// ValueError; the evaluator adds where in the template it happened.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "qwen_gsm8k/text/jinja/jinja.hpp"

namespace qwen::jinja::detail {

// What went wrong, without the place: jinja.cpp turns it into a TemplateError at the expression being evaluated.
class ValueError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a JSON array in a Value stands for: a Python list, or an object that Jinja hands out where a template might
// expect one. A `tuple` ((a, b), an item of items()) is never equal to a list and cannot be added to one. Dict views
// (items(), keys(), values()) and range() are `view`s: a length and membership, but no indexing, no JSON, no
// arithmetic, no ==. The reverse and items filters give `iterator`s: always true, no length, used up once iterated.
// An operation on them that a list would answer differently throws.
enum class Sequence : std::uint8_t { list, tuple, view, iterator };

// A Python value (in `data`), a namespace(...) object (in `space`, shared: assigning `ns.x` changes every copy, as a
// Python reference would), or Jinja's Undefined (a name or attribute that does not exist; `what` says which).
struct Value {
  Json data;
  std::shared_ptr<Json> space;
  bool undefined = false;
  std::string what;
  Sequence sequence = Sequence::list;
  bool tuple_items = false;  // the items of this view or iterator are tuples (items() and the items filter)

  static Value of(Json data) { return {std::move(data), nullptr, false, {}, Sequence::list, false}; }
  static Value missing(std::string what) { return {Json(), nullptr, true, std::move(what), Sequence::list, false}; }
  static Value sequence_of(Json items, Sequence kind, bool tuple_items = false) {
    return {std::move(items), nullptr, false, {}, kind, tuple_items};
  }
  bool is_namespace() const { return space != nullptr; }
  bool is_string() const { return !undefined && !space && data.is_string(); }
  bool is_lazy() const { return sequence == Sequence::view || sequence == Sequence::iterator; }  // not a real list
  // Plain data, which may go inside a list, a dict or a namespace without losing what it is.
  bool storable() const { return !undefined && !space && sequence == Sequence::list; }
};

// Throws ValueError when `value` is a view or an iterator: `operation` on it is outside the subset.
void require_plain(const Value& value, std::string_view operation);

// Python's type name ("str", "int", "list", "dict", "NoneType", ...; "undefined", "namespace"), for messages.
std::string type_name(const Value& value);

// Python's bool(): empty strings and containers, zero, None and Undefined are false.
bool truthy(const Value& value);

// Python's ==: numbers by value (True == 1, 1 == 1.0), containers element by element; Undefined equals only Undefined.
bool equal(const Value& left, const Value& right);

// Python's <, as -1 / 0 / 1, for numbers and for strings (by code point); anything else throws.
int compare(const Value& left, const Value& right);

// `item in container`: substring, list element or dict key. Undefined contains nothing.
bool contains(const Value& container, const Value& item);

// + - * / // % ** as Python computes them; integers that leave 64 bits throw rather than wrap.
Value arithmetic(std::string_view op, const Value& left, const Value& right);

// Iterating in a for loop: a list's items, a dict's keys, a string's characters; Undefined is empty.
std::vector<Value> iterate(const Value& value);

// `object.name` and `object[key]` as Jinja resolves them (an attribute first, then an item, or the reverse); missing
// ones are Undefined. A Python method named without being called (`s.upper`) throws.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);

// object[start:stop:step] for strings, lists and tuples, with Python's bounds; a None bound is an omitted one.
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);

}  // namespace qwen::jinja::detail
