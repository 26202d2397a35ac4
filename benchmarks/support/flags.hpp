// The benchmarks' command-line flags: each benchmark declares its flags (name, the value expected, what it means and
// the variable it sets, whose value beforehand is the default), then Flags::parse reads `--flag value` or
// `--flag=value` pairs in order. A bad flag or value throws std::invalid_argument naming the flag and the value;
// --help (or -h) prints the flags instead. Only the standard library: tokenizer_bench links no LibTorch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dapo::bench {

// A command-line integer, the whole text, from `minimum` to `maximum`; throws std::invalid_argument naming the flag
// (and `maximum` only when the value is above it).
inline int64_t parse_int(const std::string& flag, const std::string& value, int64_t minimum,
                         int64_t maximum = std::numeric_limits<int64_t>::max()) {
  std::size_t used = 0;
  long long number = 0;
  try {
    number = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || number < minimum || number > maximum) {
    const bool too_large = used != 0 && used == value.size() && number > maximum;
    throw std::invalid_argument(flag + " is '" + value + "', expected an integer >= " + std::to_string(minimum) +
                                (too_large ? " and <= " + std::to_string(maximum) : ""));
  }
  return number;
}

// A command-line number, the whole text, finite and > 0; throws std::invalid_argument naming the flag.
inline double parse_positive(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !(number > 0) || !std::isfinite(number)) {
    throw std::invalid_argument(flag + " is '" + value + "', expected a positive number");
  }
  return number;
}

class Flags {
 public:
  explicit Flags(std::string program) : program_(std::move(program)) {}

  // Any text, e.g. text("--json", json_path, "PATH", "where the JSON record goes").
  Flags& text(const std::string& name, std::string& target, const std::string& value, const std::string& help) {
    return add(name, value, help, target, [&target](const std::string&, const std::string& text) { target = text; });
  }

  // An integer >= minimum (and within Int's range).
  template <class Int>
  Flags& integer(const std::string& name, Int& target, int64_t minimum, const std::string& value,
                 const std::string& help) {
    static_assert(std::is_integral_v<Int> && (std::is_signed_v<Int> || sizeof(Int) < sizeof(int64_t)));
    return add(name, value, help, std::to_string(target),
               [&target, minimum](const std::string& flag, const std::string& text) {
                 target = static_cast<Int>(
                     parse_int(flag, text, minimum, static_cast<int64_t>(std::numeric_limits<Int>::max())));
               });
  }

  // A finite number > 0.
  Flags& positive(const std::string& name, double& target, const std::string& value, const std::string& help) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", target);
    return add(name, value, help, shown,
               [&target](const std::string& flag, const std::string& text) { target = parse_positive(flag, text); });
  }

  // Reads argv[1..argc): returns false, having printed usage() to stdout, when --help or -h stands where a flag may.
  // Throws std::invalid_argument for an unknown flag, a flag without its value, or a value its flag does not take.
  bool parse(int argc, const char* const* argv) const {
    for (int i = 1; i < argc; ++i) {
      std::string name = argv[i], value;
      if (name == "--help" || name == "-h") {
        std::fputs(usage().c_str(), stdout);
        return false;
      }
      const std::size_t equals = name.find('=');
      const bool inline_value = name.rfind("--", 0) == 0 && equals != std::string::npos;
      if (inline_value) {
        value = name.substr(equals + 1);
        name.resize(equals);
      }
      const Flag* flag = find(name);
      if (flag == nullptr) throw std::invalid_argument("unknown option " + name + " (expected " + names() + ")");
      if (!inline_value) {
        if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
        value = argv[++i];
      }
      flag->set(name, value);
    }
    return true;
  }

  // "--a, --b or --c": the declared flags.
  std::string names() const {
    std::string list;
    for (std::size_t i = 0; i < flags_.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == flags_.size() ? " or " : ", ") + flags_[i].name;
    }
    return list;
  }

  // "usage: program [--a A] [--b B]" (wrapped before 100 columns) and a line a flag with its help and default.
  std::string usage() const {
    const std::string indent(program_.size() + 7, ' ');
    std::string text = "usage: " + program_, line = text;
    std::size_t width = 0;
    for (const Flag& flag : flags_) {
      const std::string word = " [" + flag.name + " " + flag.value + "]";
      if (line.size() + word.size() > 100) {
        text += "\n" + indent;
        line = indent;
      }
      text += word;
      line += word;
      width = std::max(width, flag.name.size() + 1 + flag.value.size());
    }
    text += "\n";
    for (const Flag& flag : flags_) {
      const std::string left = flag.name + " " + flag.value;
      text += "  " + left + std::string(width + 2 - left.size(), ' ') + flag.help;
      if (!flag.shown_default.empty()) text += " (default " + flag.shown_default + ")";
      text += "\n";
    }
    return text;
  }

 private:
  struct Flag {
    std::string name, value, help, shown_default;
    std::function<void(const std::string& flag, const std::string& value)> set;
  };

  Flags& add(const std::string& name, const std::string& value, const std::string& help, std::string shown_default,
             std::function<void(const std::string&, const std::string&)> set) {
    if (name.rfind("--", 0) != 0 || find(name) != nullptr) throw std::logic_error("bad or repeated flag " + name);
    flags_.push_back({name, value, help, std::move(shown_default), std::move(set)});
    return *this;
  }

  const Flag* find(const std::string& name) const {
    for (const Flag& flag : flags_) {
      if (flag.name == name) return &flag;
    }
    return nullptr;
  }

  std::string program_;
  std::vector<Flag> flags_;
};

}  // namespace dapo::bench
