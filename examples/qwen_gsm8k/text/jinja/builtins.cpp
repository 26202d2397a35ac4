// Filters, tests, methods and globals of the Jinja subset (builtins.hpp), with Jinja's and Python's argument
// names and defaults. Hugging Face's tojson (json.dumps with ensure_ascii=False) replaces Jinja's own, and
// raise_exception is Hugging Face's global; both are what apply_chat_template installs.
#include "qwen_gsm8k/text/jinja/builtins.hpp"

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "qwen_gsm8k/text/jinja/text.hpp"

namespace qwen::jinja::detail {
namespace {

using std::string_view;
using Bound = std::vector<std::optional<Value>>;

// The arguments by parameter, bound as Python binds them: positional ones in order, then keywords by name.
// `positional_only` refuses keywords, as Python's str methods do.
Bound bind(const Arguments& arguments, std::initializer_list<string_view> parameters, const std::string& callee,
           bool positional_only = false) {
  Bound bound(parameters.size());
  std::size_t position = 0;
  for (std::size_t i = 0; i < arguments.values.size(); ++i) {
    const std::string& keyword = arguments.keywords[i];
    std::size_t index = position;
    if (keyword.empty()) {
      if (position >= parameters.size()) {
        throw ValueError(callee + " takes at most " + std::to_string(parameters.size()) + " argument(s)");
      }
      ++position;
    } else {
      if (positional_only) throw ValueError(callee + " takes no keyword arguments");
      const auto found = std::find(parameters.begin(), parameters.end(), keyword);
      if (found == parameters.end()) throw ValueError(callee + " has no parameter '" + keyword + "' in the subset");
      index = static_cast<std::size_t>(found - parameters.begin());
      if (bound[index]) throw ValueError(callee + " got two values for '" + keyword + "'");
    }
    bound[index] = arguments.values[i];
  }
  return bound;
}

bool given(const std::optional<Value>& value) {
  return value && !(!value->undefined && !value->space && value->data.is_null());
}

// A string argument, or null when it was not given or is None.
const std::string* string_argument(const std::optional<Value>& value, const std::string& what) {
  if (!given(value)) return nullptr;
  if (!value->is_string()) throw ValueError(what + " must be a string, not '" + type_name(*value) + "'");
  return &value->data.get_ref<const std::string&>();
}

std::optional<int64_t> integer_argument(const std::optional<Value>& value, const std::string& what) {
  if (!given(value)) return std::nullopt;
  if (value->undefined || value->space || !value->data.is_number_integer()) {
    throw ValueError(what + " must be an integer, not '" + type_name(*value) + "'");
  }
  return value->data.get<int64_t>();
}

std::size_t length_of(const Value& value) {
  if (value.undefined) return 0;
  if (value.sequence == Sequence::iterator) throw ValueError("object of type 'iterator' has no len()");
  if (value.is_string()) return code_point_count(value.data.get_ref<const std::string&>());
  if (!value.space && (value.data.is_array() || value.data.is_object())) return value.data.size();
  throw ValueError("object of type '" + type_name(value) + "' has no len()");
}

// upper(), lower(), capitalize() of ASCII text. Python maps Unicode case (ß becomes SS), which the subset does not
// carry, so other text throws rather than come out different.
enum class Case { upper, lower, capitalize };
std::string change_case(std::string text, Case mode) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) throw ValueError("changing the case of non-ASCII text is outside the subset");
    const bool upper = mode == Case::upper || (mode == Case::capitalize && i == 0);
    if (upper && c >= 'a' && c <= 'z') text[i] = static_cast<char>(c - 'a' + 'A');
    if (!upper && c >= 'A' && c <= 'Z') text[i] = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

// str.replace: at most `count` occurrences (all when negative), from the left.
std::string replace(const std::string& text, const std::string& old, const std::string& replacement, int64_t count) {
  if (old.empty()) throw ValueError("replacing an empty string is outside the subset");
  std::string out;
  std::size_t from = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const std::size_t found = text.find(old, from);
    if (found == std::string::npos) break;
    out.append(text, from, found - from).append(replacement);
    from = found + old.size();
  }
  return out.append(text, from, std::string::npos);
}

// str.split: by `separator`, or by runs of whitespace (ignoring it at both ends) when null; at most `max_splits`
// splits when not negative.
Json split(const std::string& text, const std::string* separator, int64_t max_splits) {
  Json parts = Json::array();
  if (separator != nullptr) {
    if (separator->empty()) throw ValueError("empty separator");
    std::size_t from = 0;
    for (int64_t done = 0; max_splits < 0 || done < max_splits; ++done) {
      const std::size_t found = text.find(*separator, from);
      if (found == std::string::npos) break;
      parts.push_back(text.substr(from, found - from));
      from = found + separator->size();
    }
    parts.push_back(text.substr(from));
    return parts;
  }
  const auto space_length = [&](std::size_t at) -> std::size_t {
    const auto sequence = dapo::utf8::decode(text, at);
    return sequence.valid && is_python_space(sequence.code_point) ? sequence.length : 0;
  };
  std::size_t at = 0;
  for (int64_t done = 0;; ++done) {
    while (at < text.size() && space_length(at) > 0) at += space_length(at);
    if (at == text.size()) break;
    if (max_splits >= 0 && done == max_splits) {
      parts.push_back(text.substr(at));
      break;
    }
    const std::size_t begin = at;
    while (at < text.size() && space_length(at) == 0)
      at += std::max<std::size_t>(dapo::utf8::decode(text, at).length, 1);
    parts.push_back(text.substr(begin, at - begin));
  }
  return parts;
}

Json items_of(const Json& object) {
  Json items = Json::array();
  for (const auto& [key, value] : object.items()) items.push_back(Json::array({key, value}));
  return items;
}

Json data_of(const Value& value, const std::string& what) {
  if (!value.storable()) {
    throw ValueError("storing a value of type '" + type_name(value) + "' in " + what + " is outside the subset");
  }
  return value.data;
}

Value string_method(const std::string& text, const std::string& name, const Arguments& arguments) {
  const std::string callee = "str." + name + "()";
  if (name == "startswith" || name == "endswith") {
    const Bound a = bind(arguments, {"prefix", "start", "end"}, callee, true);
    if (!a[0]) throw ValueError(callee + " needs an argument");
    if (given(a[1]) || given(a[2])) throw ValueError(callee + " with start or end is outside the subset");
    std::vector<std::string> affixes;
    if (a[0]->is_string()) {
      affixes.push_back(a[0]->data.get<std::string>());
    } else if (a[0]->sequence == Sequence::tuple) {  // Python takes a tuple here, not a list
      for (const Json& item : a[0]->data) {
        if (!item.is_string()) throw ValueError(callee + " takes strings");
        affixes.push_back(item.get<std::string>());
      }
    } else {
      throw ValueError(callee + " takes a string or a tuple of strings, not '" + type_name(*a[0]) + "'");
    }
    const bool start = name == "startswith";
    return Value::of(std::any_of(affixes.begin(), affixes.end(), [&](const std::string& affix) {
      return affix.size() <= text.size() &&
             text.compare(start ? 0 : text.size() - affix.size(), affix.size(), affix) == 0;
    }));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Bound a = bind(arguments, {"chars"}, callee, true);
    return Value::of(strip(text, string_argument(a[0], callee + "'s chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    const Bound a = bind(arguments, {"sep", "maxsplit"}, callee);
    return Value::of(
        split(text, string_argument(a[0], callee + "'s sep"), integer_argument(a[1], "maxsplit").value_or(-1)));
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    bind(arguments, {}, callee);
    return Value::of(change_case(text, name == "upper"   ? Case::upper
                                       : name == "lower" ? Case::lower
                                                         : Case::capitalize));
  }
  if (name == "replace") {
    const Bound a = bind(arguments, {"old", "new", "count"}, callee, true);
    const std::string* old = string_argument(a[0], callee + "'s old");
    const std::string* replacement = string_argument(a[1], callee + "'s new");
    if (old == nullptr || replacement == nullptr) throw ValueError(callee + " needs two strings");
    return Value::of(replace(text, *old, *replacement, integer_argument(a[2], "count").value_or(-1)));
  }
  throw ValueError("calling " + callee + " is outside the subset");
}

Value dict_method(const Json& object, const std::string& name, const Arguments& arguments) {
  const std::string callee = "dict." + name + "()";
  if (name == "items" || name == "keys" || name == "values") {
    bind(arguments, {}, callee);
    if (name == "items") return Value::sequence_of(items_of(object), Sequence::view, /*tuple_items=*/true);
    Json result = Json::array();
    for (const auto& [key, value] : object.items()) result.push_back(name == "keys" ? Json(key) : value);
    return Value::sequence_of(std::move(result), Sequence::view);
  }
  if (name == "get") {
    const Bound a = bind(arguments, {"key", "default"}, callee, true);
    if (!a[0]) throw ValueError(callee + " needs a key");
    if (a[0]->is_string()) {
      const auto found = object.find(a[0]->data.get_ref<const std::string&>());
      if (found != object.end()) return Value::of(*found);
    }
    return a[1] ? *a[1] : Value::of(nullptr);
  }
  throw ValueError("calling " + callee + " is outside the subset");
}

}  // namespace

Value apply_filter(const std::string& name, const Value& subject, const Arguments& arguments) {
  const std::string callee = "the filter " + name;
  if (name == "length" || name == "count") {
    bind(arguments, {}, callee);
    return Value::of(static_cast<int64_t>(length_of(subject)));
  }
  if (name == "tojson") {  // Hugging Face's: json.dumps(x, ensure_ascii=False, indent=indent)
    const Bound a = bind(arguments, {"ensure_ascii", "indent", "separators", "sort_keys"}, callee);
    if ((a[0] && truthy(*a[0])) || given(a[2]) || (a[3] && truthy(*a[3]))) {
      throw ValueError("tojson with ensure_ascii, separators or sort_keys is outside the subset");
    }
    const auto indent = integer_argument(a[1], "tojson's indent");
    if (indent && (*indent < 0 || *indent > 64)) throw ValueError("tojson's indent must be in [0, 64]");
    return Value::of(to_json(subject, indent ? static_cast<int>(*indent) : -1));
  }
  if (name == "trim") {
    const Bound a = bind(arguments, {"chars"}, callee);
    return Value::of(strip(to_str(subject), string_argument(a[0], "trim's chars"), true, true));
  }
  if (name == "default" || name == "d") {
    const Bound a = bind(arguments, {"default_value", "boolean"}, callee);
    const bool replace_falsy = a[1] && truthy(*a[1]);
    if (subject.undefined || (replace_falsy && !truthy(subject))) return a[0] ? *a[0] : Value::of("");
    return subject;
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    bind(arguments, {}, callee);
    return Value::of(change_case(to_str(subject), name == "upper"   ? Case::upper
                                                  : name == "lower" ? Case::lower
                                                                    : Case::capitalize));
  }
  if (name == "string" || name == "safe") {  // autoescaping is off, so safe only makes a string
    bind(arguments, {}, callee);
    return Value::of(to_str(subject));
  }
  if (name == "join") {
    const Bound a = bind(arguments, {"d", "attribute"}, callee);
    if (given(a[1])) throw ValueError("join(attribute=...) is outside the subset");
    const std::string separator = a[0] ? to_str(*a[0]) : "";
    std::string out;
    const auto items = iterate(subject);
    for (std::size_t i = 0; i < items.size(); ++i) out += (i > 0 ? separator : "") + to_str(items[i]);
    return Value::of(std::move(out));
  }
  if (name == "first" || name == "last") {
    bind(arguments, {}, callee);
    if (name == "last" && subject.sequence == Sequence::iterator) require_plain(subject, "the last item of");
    const auto items = iterate(subject);
    if (items.empty()) return Value::missing("no " + name + " item, the sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list" || name == "reverse") {
    bind(arguments, {}, callee);
    // Jinja's reverse gives a string for a string and Python's reversed() iterator for the rest.
    if (name == "reverse" && subject.sequence == Sequence::iterator) require_plain(subject, "reversing");
    auto items = iterate(subject);
    if (name == "reverse") std::reverse(items.begin(), items.end());
    if (name == "reverse" && subject.is_string()) {
      std::string reversed;
      for (const Value& character : items) reversed += character.data.get<std::string>();
      return Value::of(std::move(reversed));
    }
    Json list = Json::array();
    if (name == "reverse") {  // the items as they are, tuples included: the iterator keeps them so
      for (const Value& item : items) list.push_back(item.data);
      return Value::sequence_of(std::move(list), Sequence::iterator, subject.tuple_items);
    }
    for (const Value& item : items) list.push_back(data_of(item, "a list"));
    return Value::of(std::move(list));
  }
  if (name == "items") {  // a generator in Jinja, over nothing for Undefined
    bind(arguments, {}, callee);
    if (subject.undefined) return Value::sequence_of(Json::array(), Sequence::iterator);
    if (subject.space || subject.is_lazy() || !subject.data.is_object()) {
      throw ValueError("the items filter needs a mapping, not '" + type_name(subject) + "'");
    }
    return Value::sequence_of(items_of(subject.data), Sequence::iterator, /*tuple_items=*/true);
  }
  if (name == "replace") {
    const Bound a = bind(arguments, {"old", "new", "count"}, callee);
    const std::string* old = string_argument(a[0], "replace's old");
    const std::string* replacement = string_argument(a[1], "replace's new");
    if (old == nullptr || replacement == nullptr) throw ValueError("the filter replace needs two strings");
    return Value::of(replace(to_str(subject), *old, *replacement, integer_argument(a[2], "count").value_or(-1)));
  }
  throw ValueError("the filter '" + name + "' is outside the supported Jinja subset");
}

bool apply_test(const std::string& name, const Value& subject, const Arguments& arguments) {
  const std::string callee = "the test " + name;
  const bool data = !subject.undefined && !subject.space;
  const Json& value = subject.data;
  static constexpr std::array<string_view, 14> kWithoutArguments = {
      "defined", "undefined", "none",  "string",  "number",   "integer",  "float",
      "boolean", "true",      "false", "mapping", "sequence", "iterable", "odd"};
  if (name == "even" ||
      std::find(kWithoutArguments.begin(), kWithoutArguments.end(), name) != kWithoutArguments.end()) {
    bind(arguments, {}, callee);
  }
  if (name == "defined" || name == "undefined") return subject.undefined == (name == "undefined");
  if (name == "none") return data && value.is_null();
  if (name == "string") return data && value.is_string();
  if (name == "number") return data && (value.is_number() || value.is_boolean());  // bool is a Number in Python
  if (name == "integer") return data && value.is_number_integer();
  if (name == "float") return data && value.is_number_float();
  if (name == "boolean") return data && value.is_boolean();
  if (name == "true" || name == "false") return data && value.is_boolean() && value.get<bool>() == (name == "true");
  if (name == "mapping") return data && value.is_object();
  // Jinja counts Undefined as iterable and as a sequence (it has a length, 0).
  if (name == "iterable")
    return subject.undefined || (data && (value.is_string() || value.is_array() || value.is_object()));
  if (name == "sequence") {  // a range is one, a dict view is not: the subset does not tell them apart
    if (subject.sequence == Sequence::view) require_plain(subject, "testing whether it is a sequence:");
    if (subject.sequence == Sequence::iterator) return false;
    return subject.undefined || (data && (value.is_string() || value.is_array() || value.is_object()));
  }
  if (name == "odd" || name == "even") {
    return equal(arithmetic("%", subject, Value::of(2)), Value::of(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    const Bound a = bind(arguments, {"num"}, callee);
    if (!a[0]) throw ValueError("divisibleby needs a number");
    return equal(arithmetic("%", subject, *a[0]), Value::of(0));
  }
  if (name == "eq" || name == "equalto" || name == "ne") {
    const Bound a = bind(arguments, {"other"}, callee);
    if (!a[0]) throw ValueError(callee + " needs a value to compare with");
    return equal(subject, *a[0]) == (name != "ne");
  }
  throw ValueError("the test '" + name + "' is outside the supported Jinja subset");
}

Value call_method(const Value& object, const std::string& name, const Arguments& arguments) {
  if (object.undefined) throw ValueError(object.what);
  if (object.is_string()) return string_method(object.data.get_ref<const std::string&>(), name, arguments);
  if (!object.space && object.data.is_object()) return dict_method(object.data, name, arguments);
  throw ValueError("calling " + type_name(object) + "." + name + "() is outside the subset");
}

Value call_global(const std::string& name, const Arguments& arguments) {
  if (name == "namespace" || name == "dict") {
    Json members = Json::object();
    for (std::size_t i = 0; i < arguments.values.size(); ++i) {
      if (arguments.keywords[i].empty()) throw ValueError(name + "() with positional arguments is outside the subset");
      members[arguments.keywords[i]] = data_of(arguments.values[i], "a " + name);
    }
    if (name == "dict") return Value::of(std::move(members));
    return {Json(), std::make_shared<Json>(std::move(members)), false, {}};
  }
  if (name == "range") {
    const Bound a = bind(arguments, {"start", "stop", "step"}, "range()", true);
    if (!a[0]) throw ValueError("range() needs an argument");
    const auto integer = [](const std::optional<Value>& value) {
      const auto number = integer_argument(value, "each argument of range()");
      if (!number) throw ValueError("range() takes integers, not None");
      return *number;
    };
    int64_t start = 0, stop = integer(a[0]), step = 1;
    if (a[1]) {
      start = stop;
      stop = integer(a[1]);
    }
    if (a[2]) step = integer(a[2]);
    if (step == 0) throw ValueError("range() arg 3 must not be zero");
    Json numbers = Json::array();
    for (int64_t at = start; step > 0 ? at < stop : at > stop; at += step) {
      if (numbers.size() >= 100000) throw ValueError("range() of more than 100000 items (Jinja's sandbox limit)");
      numbers.push_back(at);
    }
    return Value::sequence_of(std::move(numbers), Sequence::view);
  }
  if (name == "raise_exception") {
    const Bound a = bind(arguments, {"message"}, "raise_exception()", true);
    throw ValueError("the template called raise_exception(\"" + (a[0] ? to_str(*a[0]) : std::string()) + "\")");
  }
  if (name == "strftime_now") throw ValueError("strftime_now() renders today's date, which is outside the subset");
  if (name == "cycler" || name == "joiner" || name == "lipsum") throw ValueError(name + "() is outside the subset");
  throw ValueError("'" + name + "' is undefined");
}

}  // namespace qwen::jinja::detail
