// Python's text forms of Jinja values (text.hpp): str(), the repr of a float, json.dumps as Hugging Face's
// tojson calls it, and Python's idea of characters and whitespace in UTF-8 strings.
#include "qwen_gsm8k/text/jinja/text.hpp"

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace qwen::jinja::detail {
namespace {

using std::string_view;

void append_json_string(std::string& out, string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;  // ensure_ascii=False: other characters as they are
        }
    }
  }
  out += '"';
}

void append_json(std::string& out, const Json& data, int indent, int level) {
  const auto newline = [&](int depth) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * depth), ' ');
  };
  // json.dumps's separators: ", " and ": " without indent, "," and ": " with it.
  const string_view item_separator = indent >= 0 ? "," : ", ";
  switch (data.type()) {
    case Json::value_t::null:
      out += "null";
      return;
    case Json::value_t::boolean:
      out += data.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_float: {
      const double value = data.get<double>();
      if (std::isnan(value)) {
        out += "NaN";
      } else if (std::isinf(value)) {
        out += value > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(value);
      }
      return;
    }
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      out += data.dump();
      return;
    case Json::value_t::string:
      append_json_string(out, data.get_ref<const std::string&>());
      return;
    case Json::value_t::array: {
      if (data.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < data.size(); ++i) {
        if (i > 0) out += item_separator;
        if (indent >= 0) newline(level + 1);
        append_json(out, data[i], indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Json::value_t::object: {
      if (data.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, value] : data.items()) {
        if (!first) out += item_separator;
        first = false;
        if (indent >= 0) newline(level + 1);
        append_json_string(out, key);
        out += ": ";
        append_json(out, value, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    default:
      throw ValueError("a binary value is not JSON serializable");
  }
}

}  // namespace

std::vector<std::size_t> character_starts(std::string_view text) {
  std::vector<std::size_t> starts;
  starts.reserve(text.size() + 1);
  for (std::size_t at = 0; at < text.size();) {
    const auto sequence = dapo::utf8::decode(text, at);
    if (!sequence.valid) throw ValueError("the string holds invalid UTF-8 at byte " + std::to_string(at));
    starts.push_back(at);
    at += sequence.length;
  }
  starts.push_back(text.size());
  return starts;
}

std::string to_str(const Value& value) {
  if (value.undefined) return "";
  if (value.space) throw ValueError("printing a namespace is outside the subset");
  const Json& data = value.data;
  switch (data.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return data.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return data.dump();
    case Json::value_t::number_float:
      return float_repr(data.get<double>());
    case Json::value_t::string:
      return data.get<std::string>();
    default:
      throw ValueError("printing a value of type '" + type_name(value) +
                       "' (Python's repr) is outside the subset; use the tojson filter");
  }
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // The shortest digits that read back, as d.ddde±x; Python's repr writes them positionally when the decimal point
  // falls within (-4, 16] digits of the first digit, else as an exponent with at least two digits.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const string_view text(buffer, static_cast<std::size_t>(result.ptr - buffer));
  const std::size_t e = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (const char c : text.substr(negative ? 1 : 0, e - (negative ? 1 : 0))) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(text.data() + e + 1 + (text[e + 1] == '+' ? 1 : 0), text.data() + text.size(), exponent);
  const int point = exponent + 1;  // digits before the decimal point
  // Appended piece by piece: g++ 12 warns (-Wrestrict) about "." + std::string temporaries here.
  std::string out = negative ? "-" : "";
  if (point > -4 && point <= 16) {
    const auto size = static_cast<int>(digits.size());
    if (point <= 0) {
      out.append("0.").append(static_cast<std::size_t>(-point), '0').append(digits);
    } else if (point >= size) {
      out.append(digits).append(static_cast<std::size_t>(point - size), '0').append(".0");
    } else {
      out.append(digits, 0, static_cast<std::size_t>(point))
          .append(".")
          .append(digits, static_cast<std::size_t>(point));
    }
    return out;
  }
  out.append(digits, 0, 1);
  if (digits.size() > 1) out.append(".").append(digits, 1);
  const std::string magnitude = std::to_string(std::abs(exponent));
  out.append(exponent < 0 ? "e-" : "e+").append(magnitude.size() < 2 ? "0" : "").append(magnitude);
  return out;
}

std::string to_json(const Value& value, int indent) {
  if (value.undefined || value.space || value.is_lazy()) {
    throw ValueError("Object of type " + type_name(value) + " is not JSON serializable");
  }
  std::string out;
  append_json(out, value.data, indent, 0);
  return out;
}

std::size_t code_point_count(std::string_view text) {
  return character_starts(text).size() - 1;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string strip(std::string_view text, const std::string* chars, bool left, bool right) {
  std::vector<char32_t> strip_set;
  if (chars != nullptr) {
    for (std::size_t at = 0; at < chars->size();) {
      const auto sequence = dapo::utf8::decode(*chars, at);
      if (!sequence.valid) throw ValueError("the characters to strip hold invalid UTF-8");
      strip_set.push_back(sequence.code_point);
      at += sequence.length;
    }
  }
  const auto strippable = [&](char32_t c) {
    return chars == nullptr ? is_python_space(c) : std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end();
  };
  const auto starts = character_starts(text);
  std::size_t first = 0, last = starts.size() - 1;  // characters [first, last)
  while (left && first < last && strippable(dapo::utf8::decode(text, starts[first]).code_point)) ++first;
  while (right && last > first && strippable(dapo::utf8::decode(text, starts[last - 1]).code_point)) --last;
  return std::string(text.substr(starts[first], starts[last] - starts[first]));
}

}  // namespace qwen::jinja::detail
