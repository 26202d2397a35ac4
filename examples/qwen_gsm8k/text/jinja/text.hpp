// Python's text forms of template values: str(), the repr of a float, json.dumps (Hugging Face's tojson), and
// Python's characters (code points) and whitespace in UTF-8 strings. Internal to the interpreter (jinja.hpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "qwen_gsm8k/text/jinja/value.hpp"

namespace qwen::jinja::detail {

// Python's str(): Undefined is "", None "None", True "True", floats as repr (1e-05, 1.0). Lists, dicts and namespaces
// throw: their Python repr is outside the subset.
std::string to_str(const Value& value);

// Python's repr of a float: the shortest digits that read back, "1.0", "1e+16", "1e-05", "nan", "inf".
std::string float_repr(double value);

// json.dumps(value, ensure_ascii=False) with indent (negative: none), as Hugging Face's tojson filter calls it.
std::string to_json(const Value& value, int indent);

// The number of characters (code points) of a UTF-8 string; invalid UTF-8 throws.
std::size_t code_point_count(std::string_view text);

// Python's str.isspace() for one character (the whitespace of strip(), split() and Jinja's \s).
bool is_python_space(char32_t code_point);

// Python's str.strip / lstrip / rstrip: `chars` is the set to remove, or all whitespace when null.
std::string strip(std::string_view text, const std::string* chars, bool left, bool right);

// Where each character of a UTF-8 string starts, plus its end: Python indexes and slices strings by character.
// Invalid UTF-8 throws ValueError.
std::vector<std::size_t> character_starts(std::string_view text);

}  // namespace qwen::jinja::detail
