// The filters, tests, methods and global functions of jinja.hpp's subset, each as Jinja (or Python, for methods)
// defines it. Internal to the interpreter. A name outside the subset throws ValueError naming it.
#pragma once

#include <string>
#include <vector>

#include "qwen_gsm8k/text/jinja/value.hpp"

namespace qwen::jinja::detail {

// Evaluated arguments of a call, filter or test: keywords[i] is "" for a positional one.
struct Arguments {
  std::vector<Value> values;
  std::vector<std::string> keywords;
};

// `subject | name(arguments)`.
Value apply_filter(const std::string& name, const Value& subject, const Arguments& arguments);

// `subject is name(arguments)` (before `not`).
bool apply_test(const std::string& name, const Value& subject, const Arguments& arguments);

// `object.name(arguments)`: str and dict methods.
Value call_method(const Value& object, const std::string& name, const Arguments& arguments);

// `name(arguments)` for a name the template did not define: namespace, dict, range, raise_exception.
Value call_global(const std::string& name, const Arguments& arguments);

}  // namespace qwen::jinja::detail
