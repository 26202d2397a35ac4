// Python's semantics for the values of a Jinja template: see value.hpp. Each rule names the Python behaviour it
// reproduces; where Python would go on with something this subset cannot represent (the repr of a list, a bound
// method) it throws instead.
#include "qwen_gsm8k/text/jinja/value.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "qwen_gsm8k/text/jinja/text.hpp"

namespace qwen::jinja::detail {
namespace {

using std::string_view;

// The public methods of Python's str, list and dict (3.11). Jinja resolves `x.name` to such a method before an item,
// so these names never read as a dict key or an undefined attribute; calling them is builtins.cpp's business.
constexpr std::array<string_view, 47> kStrMethods = {
    "capitalize",   "casefold",   "center",    "count",       "encode",    "endswith",     "expandtabs",   "find",
    "format",       "format_map", "index",     "isalnum",     "isalpha",   "isascii",      "isdecimal",    "isdigit",
    "isidentifier", "islower",    "isnumeric", "isprintable", "isspace",   "istitle",      "isupper",      "join",
    "ljust",        "lower",      "lstrip",    "maketrans",   "partition", "removeprefix", "removesuffix", "replace",
    "rfind",        "rindex",     "rjust",     "rpartition",  "rsplit",    "rstrip",       "split",        "splitlines",
    "startswith",   "strip",      "swapcase",  "title",       "translate", "upper",        "zfill"};
constexpr std::array<string_view, 11> kListMethods = {"append", "clear", "copy",   "count",   "extend", "index",
                                                      "insert", "pop",   "remove", "reverse", "sort"};
constexpr std::array<string_view, 11> kDictMethods = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                                      "pop",   "popitem", "setdefault", "update", "values"};
constexpr std::array<string_view, 12> kNumberMethods = {
    "real",      "imag",     "conjugate",  "numerator",        "denominator", "bit_length",
    "bit_count", "to_bytes", "from_bytes", "as_integer_ratio", "is_integer",  "hex"};

template <std::size_t N>
bool listed(const std::array<string_view, N>& names, string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A number as Python sees it: bool is an int (True + 1 == 2).
struct Number {
  bool is_float = false;
  int64_t integer = 0;
  double real = 0;
  double as_double() const { return is_float ? real : static_cast<double>(integer); }
};

std::optional<Number> number_of(const Value& value) {
  if (value.undefined || value.space) return std::nullopt;
  const Json& data = value.data;
  if (data.is_boolean()) return Number{false, data.get<bool>() ? 1 : 0, 0};
  if (data.is_number_unsigned()) {
    const auto unsigned_value = data.get<uint64_t>();
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw ValueError("the integer " + std::to_string(unsigned_value) + " does not fit in 64 bits");
    }
    return Number{false, static_cast<int64_t>(unsigned_value), 0};
  }
  if (data.is_number_integer()) return Number{false, data.get<int64_t>(), 0};
  if (data.is_number_float()) return Number{true, 0, data.get<double>()};
  return std::nullopt;
}

// a op b for the overflow-reporting builtins (__builtin_add_overflow, ...), throwing instead of wrapping around.
template <class Builtin>
int64_t checked(Builtin builtin, int64_t a, int64_t b, string_view op) {
  int64_t result = 0;
  if (builtin(a, b, &result)) throw ValueError("the integer result of " + std::string(op) + " does not fit in 64 bits");
  return result;
}

// Python's floor division and modulo for floats (the sign of the result follows the divisor).
std::pair<double, double> float_divmod(double x, double y) {
  if (y == 0) throw ValueError("float division by zero");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floor_div = 0;
  if (div != 0) {
    floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
  } else {
    floor_div = std::copysign(0.0, x / y);
  }
  return {floor_div, mod};
}

Value repeat(const Value& sequence, int64_t times) {
  if (sequence.is_string()) {
    std::string text;
    for (int64_t i = 0; i < times; ++i) text += sequence.data.get_ref<const std::string&>();
    return Value::of(text);
  }
  Json items = Json::array();
  for (int64_t i = 0; i < times; ++i) {
    for (const Json& item : sequence.data) items.push_back(item);
  }
  return Value::of(std::move(items));
}

std::string unsupported_operands(string_view op, const Value& left, const Value& right) {
  return "unsupported operand types for " + std::string(op) + ": '" + type_name(left) + "' and '" + type_name(right) +
         "'";
}

// An integer as a double where that is exact (|i| <= 2^53). Python divides and compares larger integers exactly,
// which a double cannot, so they throw.
double exact_double(int64_t integer) {
  constexpr int64_t kExact = int64_t{1} << 53;
  if (integer > kExact || integer < -kExact) {
    throw ValueError("dividing or comparing the integer " + std::to_string(integer) +
                     " beyond 2^53 is outside the subset");
  }
  return static_cast<double>(integer);
}

Value integer_arithmetic(string_view op, int64_t a, int64_t b) {
  const auto add = [](int64_t x, int64_t y, int64_t* sum) { return __builtin_add_overflow(x, y, sum); };
  const auto subtract = [](int64_t x, int64_t y, int64_t* difference) {
    return __builtin_sub_overflow(x, y, difference);
  };
  const auto multiply = [](int64_t x, int64_t y, int64_t* product) { return __builtin_mul_overflow(x, y, product); };
  if (op == "+") return Value::of(checked(add, a, b, op));
  if (op == "-") return Value::of(checked(subtract, a, b, op));
  if (op == "*") return Value::of(checked(multiply, a, b, op));
  if (op == "/") {
    if (b == 0) throw ValueError("division by zero");
    return Value::of(exact_double(a) / exact_double(b));
  }
  if (op == "//" || op == "%") {
    if (b == 0) throw ValueError("integer division or modulo by zero");
    if (a == std::numeric_limits<int64_t>::min() && b == -1) checked(subtract, 0, a, op);  // -a does not fit
    int64_t quotient = a / b, remainder = a % b;
    if (remainder != 0 && ((remainder < 0) != (b < 0))) {  // Python floors; C++ truncates
      quotient -= 1;
      remainder += b;
    }
    return Value::of(op == "//" ? quotient : remainder);
  }
  // **: a negative exponent gives a float, as in Python.
  if (b < 0) {
    if (a == 0) throw ValueError("0 cannot be raised to a negative power");
    return Value::of(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
  if (a == 0 || a == 1) return Value::of(b == 0 ? int64_t{1} : a);
  if (a == -1) return Value::of(b % 2 == 0 ? int64_t{1} : int64_t{-1});
  int64_t power = 1;  // |a| >= 2: at most 63 multiplications before one overflows and throws
  for (int64_t i = 0; i < b; ++i) power = checked(multiply, power, a, op);
  return Value::of(power);
}

Value float_arithmetic(string_view op, double a, double b) {
  if (op == "+") return Value::of(a + b);
  if (op == "-") return Value::of(a - b);
  if (op == "*") return Value::of(a * b);
  if (op == "/") {
    if (b == 0) throw ValueError("float division by zero");
    return Value::of(a / b);
  }
  if (op == "//") return Value::of(float_divmod(a, b).first);
  if (op == "%") return Value::of(float_divmod(a, b).second);
  if (a == 0 && b < 0) throw ValueError("0.0 cannot be raised to a negative power");
  if (a < 0 && b != std::floor(b)) throw ValueError("a negative number to a fractional power is complex in Python");
  const double power = std::pow(a, b);
  if (std::isinf(power) && std::isfinite(a) && std::isfinite(b)) throw ValueError("Numerical result out of range");
  return Value::of(power);
}

// + and * with a tuple: tuple + tuple and tuple * int give tuples; a tuple and a list do not mix.
Value tuple_arithmetic(string_view op, const Value& left, const Value& right) {
  const bool both = left.sequence == Sequence::tuple && right.sequence == Sequence::tuple;
  if (op == "+" && both) {
    Json items = left.data;
    for (const Json& item : right.data) items.push_back(item);
    return Value::sequence_of(std::move(items), Sequence::tuple);
  }
  const Value& tuple = left.sequence == Sequence::tuple ? left : right;
  const auto times = number_of(left.sequence == Sequence::tuple ? right : left);
  if (op == "*" && times && !times->is_float) {
    return Value::sequence_of(repeat(Value::of(tuple.data), times->integer).data, Sequence::tuple);
  }
  throw ValueError(unsupported_operands(op, left, right));
}

bool json_equal(const Json& a, const Json& b) {
  const bool a_number = a.is_number() || a.is_boolean(), b_number = b.is_number() || b.is_boolean();
  if (a_number || b_number) {
    if (!a_number || !b_number) return false;
    const auto x = number_of(Value::of(a)), y = number_of(Value::of(b));
    if (!x->is_float && !y->is_float) return x->integer == y->integer;
    return (x->is_float ? x->real : exact_double(x->integer)) == (y->is_float ? y->real : exact_double(y->integer));
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!json_equal(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, value] : a.items()) {
      const auto found = b.find(key);
      if (found == b.end() || !json_equal(value, *found)) return false;
    }
    return true;
  }
  return a == b;  // strings and null
}

// Python's slice bounds (PySlice_AdjustIndices): the characters or items that s[start:stop:step] takes.
std::vector<std::size_t> slice_indices(int64_t length, const Value& start, const Value& stop, const Value& step) {
  const auto bound = [](const Value& value, const char* which) -> std::optional<int64_t> {
    if (!value.undefined && !value.space && value.data.is_null()) return std::nullopt;
    const auto number = number_of(value);
    if (!number || number->is_float) {
      throw ValueError(std::string("the slice ") + which + " must be an integer or none, not '" + type_name(value) +
                       "'");
    }
    return number->integer;
  };
  const int64_t stride = bound(step, "step").value_or(1);
  if (stride == 0) throw ValueError("the slice step cannot be zero");
  const auto adjust = [&](std::optional<int64_t> index, int64_t fallback) {
    if (!index) return fallback;
    int64_t at = *index;
    if (at < 0) {
      at += length;
      if (at < 0) at = stride < 0 ? -1 : 0;
    } else if (at >= length) {
      at = stride < 0 ? length - 1 : length;
    }
    return at;
  };
  const int64_t first = adjust(bound(start, "start"), stride < 0 ? length - 1 : 0);
  const int64_t last = adjust(bound(stop, "stop"), stride < 0 ? -1 : length);
  std::vector<std::size_t> indices;
  for (int64_t at = first; stride > 0 ? at < last : at > last; at += stride)
    indices.push_back(static_cast<std::size_t>(at));
  return indices;
}

// A Python index (negative counts from the end) into `length` things; nothing when out of range (Jinja then gives
// Undefined).
std::optional<std::size_t> python_index(const Value& key, std::size_t length) {
  const auto number = number_of(key);
  if (!number || number->is_float) return std::nullopt;
  const int64_t at = number->integer < 0 ? number->integer + static_cast<int64_t>(length) : number->integer;
  if (at < 0 || at >= static_cast<int64_t>(length)) return std::nullopt;
  return static_cast<std::size_t>(at);
}

}  // namespace

std::string type_name(const Value& value) {
  if (value.undefined) return "undefined";
  if (value.space) return "namespace";
  if (value.sequence == Sequence::tuple) return "tuple";
  if (value.sequence == Sequence::view) return "dict view or range";
  if (value.sequence == Sequence::iterator) return "iterator";
  switch (value.data.type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "int";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    default:
      return "binary";
  }
}

void require_plain(const Value& value, std::string_view operation) {
  if (value.is_lazy()) {
    throw ValueError(std::string(operation) + " a " + type_name(value) +
                     " is outside the subset (turn it into a list "
                     "with the list filter)");
  }
}

bool truthy(const Value& value) {
  if (value.undefined) return false;
  if (value.space || value.sequence == Sequence::iterator) return true;  // a Python iterator has no length
  const Json& data = value.data;
  if (data.is_null()) return false;
  if (data.is_boolean()) return data.get<bool>();
  if (data.is_number()) return number_of(value)->as_double() != 0;
  if (data.is_string()) return !data.get_ref<const std::string&>().empty();  // json::empty() is false for strings
  if (data.is_array() || data.is_object()) return !data.empty();
  return true;
}

bool equal(const Value& left, const Value& right) {
  require_plain(left, "comparing");
  require_plain(right, "comparing");
  if (left.undefined || right.undefined) return left.undefined && right.undefined;
  if (left.space || right.space) return left.space == right.space;
  const bool left_tuple = left.sequence == Sequence::tuple, right_tuple = right.sequence == Sequence::tuple;
  if (left_tuple || right_tuple) return left_tuple && right_tuple && json_equal(left.data, right.data);
  return json_equal(left.data, right.data);
}

int compare(const Value& left, const Value& right) {
  const auto a = number_of(left), b = number_of(right);
  if (a && b) {
    if (!a->is_float && !b->is_float) return a->integer < b->integer ? -1 : a->integer > b->integer ? 1 : 0;
    const double x = a->is_float ? a->real : exact_double(a->integer);
    const double y = b->is_float ? b->real : exact_double(b->integer);
    if (std::isnan(x) || std::isnan(y)) throw ValueError("ordering a NaN is outside the subset");
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (left.is_string() && right.is_string()) {  // UTF-8 byte order is code point order, as Python compares
    const int order = left.data.get_ref<const std::string&>().compare(right.data.get_ref<const std::string&>());
    return order < 0 ? -1 : order > 0 ? 1 : 0;
  }
  throw ValueError("ordering '" + type_name(left) + "' and '" + type_name(right) + "' is not supported");
}

bool contains(const Value& container, const Value& item) {
  if (container.undefined) return false;
  if (container.sequence == Sequence::iterator) require_plain(container, "searching");
  require_plain(item, "searching for");
  if (container.is_string()) {
    if (!item.is_string()) {
      throw ValueError("'in <string>' requires a string as left operand, not '" + type_name(item) + "'");
    }
    return container.data.get_ref<const std::string&>().find(item.data.get_ref<const std::string&>()) !=
           std::string::npos;
  }
  // A list or dict is unhashable: Python refuses to look one up among dict keys (a dict, keys() or items()).
  const bool unhashable = !item.undefined && !item.space && item.sequence != Sequence::tuple &&
                          (item.data.is_array() || item.data.is_object());
  if (!container.space && container.data.is_array()) {
    if (container.sequence == Sequence::view && unhashable) {
      throw ValueError("searching a dict view or range for a " + type_name(item) + " is outside the subset");
    }
    const auto items = iterate(container);
    return std::any_of(items.begin(), items.end(), [&](const Value& element) { return equal(element, item); });
  }
  if (!container.space && container.data.is_object()) {
    if (item.is_string()) return container.data.contains(item.data.get_ref<const std::string&>());
    if (item.undefined || item.space || unhashable) {
      throw ValueError("'" + type_name(item) + "' as a dict key is outside the subset");
    }
    return false;  // the subset's dict keys are strings, never equal to a number, None or a tuple
  }
  throw ValueError("argument of type '" + type_name(container) + "' is not iterable");
}

Value arithmetic(std::string_view op, const Value& left, const Value& right) {
  if (left.undefined) throw ValueError(left.what);
  if (right.undefined) throw ValueError(right.what);
  require_plain(left, "arithmetic on");
  require_plain(right, "arithmetic on");
  if (left.sequence == Sequence::tuple || right.sequence == Sequence::tuple) return tuple_arithmetic(op, left, right);
  const auto a = number_of(left), b = number_of(right);
  if (a && b) {
    if (a->is_float || b->is_float) return float_arithmetic(op, a->as_double(), b->as_double());
    return integer_arithmetic(op, a->integer, b->integer);
  }
  const bool sequences = !left.space && !right.space && left.data.type() == right.data.type() &&
                         (left.data.is_string() || left.data.is_array());
  if (op == "+" && sequences) {
    if (left.data.is_string()) {
      return Value::of(left.data.get_ref<const std::string&>() + right.data.get_ref<const std::string&>());
    }
    Json items = left.data;
    for (const Json& item : right.data) items.push_back(item);
    return Value::of(std::move(items));
  }
  if (op == "*") {  // "ab" * 2, 2 * [1], as Python repeats sequences
    const bool left_sequence = !left.space && (left.data.is_string() || left.data.is_array());
    const bool right_sequence = !right.space && (right.data.is_string() || right.data.is_array());
    if (left_sequence && b && !b->is_float) return repeat(left, b->integer);
    if (right_sequence && a && !a->is_float) return repeat(right, a->integer);
  }
  if (op == "%" && left.is_string()) throw ValueError("printf-style string formatting with % is outside the subset");
  throw ValueError(unsupported_operands(op, left, right));
}

std::vector<Value> iterate(const Value& value) {
  std::vector<Value> items;
  if (value.undefined) return items;
  if (!value.space) {
    const Json& data = value.data;
    if (data.is_array()) {
      for (const Json& item : data) {
        items.push_back(Value::of(item));
        if (value.tuple_items && item.is_array()) items.back().sequence = Sequence::tuple;
      }
      return items;
    }
    if (data.is_object()) {
      for (const auto& [key, item] : data.items()) items.push_back(Value::of(key));
      return items;
    }
    if (data.is_string()) {
      const std::string& text = data.get_ref<const std::string&>();
      const auto starts = character_starts(text);
      for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
        items.push_back(Value::of(text.substr(starts[i], starts[i + 1] - starts[i])));
      }
      return items;
    }
  }
  throw ValueError("'" + type_name(value) + "' object is not iterable");
}

Value get_attribute(const Value& object, const std::string& name) {
  if (object.undefined) throw ValueError(object.what);
  require_plain(object, "an attribute of");
  if (name.rfind("__", 0) == 0) throw ValueError("the attribute " + name + " is blocked by Jinja's sandbox");
  const auto missing = [&] {
    std::string what = "'";  // appended piece by piece: g++ 12 warns (-Wrestrict) about "'" + std::string here
    what.append(type_name(object)).append(" object' has no attribute '").append(name).append("'");
    return Value::missing(std::move(what));
  };
  if (object.space) {
    const auto found = object.space->find(name);
    return found == object.space->end() ? missing() : Value::of(*found);
  }
  const Json& data = object.data;
  const bool method = data.is_string()                        ? listed(kStrMethods, name)
                      : data.is_array()                       ? listed(kListMethods, name)
                      : data.is_object()                      ? listed(kDictMethods, name)
                      : data.is_number() || data.is_boolean() ? listed(kNumberMethods, name)
                                                              : false;
  if (method) {
    throw ValueError("`" + name + "` is a method of Python's " + type_name(object) +
                     "; using it without calling it is outside the subset");
  }
  if (data.is_object()) {
    const auto found = data.find(name);
    if (found != data.end()) return Value::of(*found);
  }
  return missing();
}

Value get_item(const Value& object, const Value& key) {
  if (object.undefined) throw ValueError(object.what);
  require_plain(object, "subscripting");
  require_plain(key, "subscripting with");
  // A string key on anything but a dict is an attribute, and a dict's missing key may name a method: Jinja tries
  // both, so get_attribute decides.
  if (key.is_string() && (object.space || !object.data.is_object())) {
    return get_attribute(object, key.data.get<std::string>());
  }
  if (object.space) return Value::missing("'namespace' object is not subscriptable");
  const Json& data = object.data;
  if (data.is_object()) {
    if (key.is_string()) {
      const auto found = data.find(key.data.get_ref<const std::string&>());
      if (found != data.end()) return Value::of(*found);
      return get_attribute(object, key.data.get<std::string>());
    }
    return Value::missing("'dict object' has no key " + to_str(key));
  }
  if (data.is_array()) {
    const auto at = python_index(key, data.size());
    return at ? Value::of(data[*at]) : Value::missing("list index out of range");
  }
  if (data.is_string()) {
    const std::string& text = data.get_ref<const std::string&>();
    const auto starts = character_starts(text);
    const auto at = python_index(key, starts.size() - 1);
    if (!at) return Value::missing("string index out of range");
    return Value::of(text.substr(starts[*at], starts[*at + 1] - starts[*at]));
  }
  return Value::missing("'" + type_name(object) + "' object is not subscriptable");
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.undefined) throw ValueError(object.what);
  require_plain(object, "slicing");
  if (object.is_string()) {
    const std::string& text = object.data.get_ref<const std::string&>();
    const auto starts = character_starts(text);
    std::string sliced;
    for (const std::size_t at : slice_indices(static_cast<int64_t>(starts.size() - 1), start, stop, step)) {
      sliced += text.substr(starts[at], starts[at + 1] - starts[at]);
    }
    return Value::of(std::move(sliced));
  }
  if (!object.space && object.data.is_array()) {
    Json items = Json::array();
    for (const std::size_t at : slice_indices(static_cast<int64_t>(object.data.size()), start, stop, step)) {
      items.push_back(object.data[at]);
    }
    return Value::sequence_of(std::move(items), object.sequence);  // a tuple's slice is a tuple
  }
  throw ValueError("slicing a '" + type_name(object) + "' is outside the subset");
}

}  // namespace qwen::jinja::detail
