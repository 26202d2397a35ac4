// Rule-based GSM8K rewards of the seed project (correctness 2.0, digit 0.5, strict <think>/<answer> format 0.5, tag
// marks 0.125 each), reproduced exactly, plus a lenient answer mode that fixes the seed's parsing flaws.
// No LibTorch; strings are UTF-8. Not a general math verifier.
//
// AnswerMode::kSeed reproduces the seed's Python `re` behaviour byte for byte:
//   extract: the last match of \d+\.\d+|\d+/\d+|\d+ inside the first <answer>...</answer> (`.` matches newlines);
//            \d is any Unicode decimal digit (category Nd), as in Python 3 str patterns.
//            So "1,080" extracts "080" and "-7" extracts "7": the seed marks both wrong.
//   format:  ^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>\n$ with re.match (`.` stops at \n; `$` also matches
//            before one final \n): exactly one line of thinking and one line of answer.
// AnswerMode::kLenient: numbers may carry a leading minus and thousands separators ("1,080" -> "1080"); Unicode digits
//   become ASCII; decimals drop trailing zeros ("72.50" -> "72.5", "72.0" -> "72"); the reference is normalised the
//   same way before comparing; the format reward accepts any number of lines inside <think>.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dapo/core/error.hpp"
#include "dapo/core/utf8.hpp"

namespace dapo::gsm8k {

enum class AnswerMode { kSeed, kLenient };

constexpr double kCorrectnessReward = 2.0;
constexpr double kDigitReward = 0.5;
constexpr double kHardFormatReward = 0.5;
constexpr double kMarkReward = 0.125;  // per tag; four tags

namespace detail {

// Unicode 14.0 category Nd (what Python 3.11's `\d` matches), as [first, last] code points. Every run starts at a
// digit zero, so a digit's value is (code_point - first) % 10. Generated with Python's unicodedata.
constexpr std::array<std::pair<char32_t, char32_t>, 62> kDecimalDigitRanges{{
    {0x30, 0x39},       {0x660, 0x669},     {0x6f0, 0x6f9},     {0x7c0, 0x7c9},     {0x966, 0x96f},
    {0x9e6, 0x9ef},     {0xa66, 0xa6f},     {0xae6, 0xaef},     {0xb66, 0xb6f},     {0xbe6, 0xbef},
    {0xc66, 0xc6f},     {0xce6, 0xcef},     {0xd66, 0xd6f},     {0xde6, 0xdef},     {0xe50, 0xe59},
    {0xed0, 0xed9},     {0xf20, 0xf29},     {0x1040, 0x1049},   {0x1090, 0x1099},   {0x17e0, 0x17e9},
    {0x1810, 0x1819},   {0x1946, 0x194f},   {0x19d0, 0x19d9},   {0x1a80, 0x1a89},   {0x1a90, 0x1a99},
    {0x1b50, 0x1b59},   {0x1bb0, 0x1bb9},   {0x1c40, 0x1c49},   {0x1c50, 0x1c59},   {0xa620, 0xa629},
    {0xa8d0, 0xa8d9},   {0xa900, 0xa909},   {0xa9d0, 0xa9d9},   {0xa9f0, 0xa9f9},   {0xaa50, 0xaa59},
    {0xabf0, 0xabf9},   {0xff10, 0xff19},   {0x104a0, 0x104a9}, {0x10d30, 0x10d39}, {0x11066, 0x1106f},
    {0x110f0, 0x110f9}, {0x11136, 0x1113f}, {0x111d0, 0x111d9}, {0x112f0, 0x112f9}, {0x11450, 0x11459},
    {0x114d0, 0x114d9}, {0x11650, 0x11659}, {0x116c0, 0x116c9}, {0x11730, 0x11739}, {0x118e0, 0x118e9},
    {0x11950, 0x11959}, {0x11c50, 0x11c59}, {0x11d50, 0x11d59}, {0x11da0, 0x11da9}, {0x16a60, 0x16a69},
    {0x16ac0, 0x16ac9}, {0x16b50, 0x16b59}, {0x1d7ce, 0x1d7ff}, {0x1e140, 0x1e149}, {0x1e2f0, 0x1e2f9},
    {0x1e950, 0x1e959}, {0x1fbf0, 0x1fbf9},
}};

// The decimal digit that starts at text[pos] (its value and its length in bytes), if one does.
struct Digit {
  int value;
  std::size_t bytes;
};

inline std::optional<Digit> digit_at(std::string_view text, std::size_t pos) {
  const auto byte = static_cast<unsigned char>(text[pos]);
  if (byte < 0x80) {
    if (byte >= '0' && byte <= '9') return Digit{byte - '0', 1};
    return std::nullopt;
  }
  // Malformed UTF-8 is not a digit: Python sees such bytes as U+FFFD.
  const utf8::Sequence sequence = utf8::decode(text, pos);
  if (!sequence.valid) return std::nullopt;
  for (const auto& [first, last] : kDecimalDigitRanges) {
    if (sequence.code_point >= first && sequence.code_point <= last) {
      return Digit{static_cast<int>((sequence.code_point - first) % 10), sequence.length};
    }
  }
  return std::nullopt;
}

// Length in bytes of the run of digits starting at pos (0 if none).
inline std::size_t digit_run(std::string_view text, std::size_t pos) {
  std::size_t end = pos;
  while (end < text.size()) {
    const auto digit = digit_at(text, end);
    if (!digit) break;
    end += digit->bytes;
  }
  return end - pos;
}

// The content of the first <answer>...</answer>, if any (re.search(r"<answer>(.*?)</answer>", s, re.DOTALL)).
inline std::optional<std::string_view> answer_block(std::string_view response) {
  constexpr std::string_view kOpen = "<answer>", kClose = "</answer>";
  const auto open = response.find(kOpen);
  if (open == std::string_view::npos) return std::nullopt;
  const auto start = open + kOpen.size();
  const auto close = response.find(kClose, start);
  if (close == std::string_view::npos) return std::nullopt;
  return response.substr(start, close - start);
}

// Python re.findall(r"\d+\.\d+|\d+/\d+|\d+", text)[-1], or "" when nothing matches.
inline std::string last_seed_number(std::string_view text) {
  std::string_view last;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t head = digit_run(text, pos);
    if (head == 0) {
      ++pos;
      continue;
    }
    std::size_t end = pos + head;
    if (end + 1 < text.size() && (text[end] == '.' || text[end] == '/')) {
      const std::size_t tail = digit_run(text, end + 1);
      if (tail > 0) end += 1 + tail;
    }
    last = text.substr(pos, end - pos);
    pos = end;
  }
  return std::string(last);
}

// Lenient number at pos (which starts a digit run): -?digits with ,ddd groups, then .digits or /digits. Returns its
// end and appends its canonical ASCII form to out.
inline std::size_t read_lenient_number(std::string_view text, std::size_t pos, std::string& out) {
  auto append_run = [&](std::size_t at) {
    while (at < text.size()) {
      const auto digit = digit_at(text, at);
      if (!digit) break;
      out += static_cast<char>('0' + digit->value);
      at += digit->bytes;
    }
    return at;
  };
  const std::size_t head_start = out.size();
  std::size_t end = append_run(pos);
  // Thousands groups only after a head of 1-3 digits, each group exactly three digits.
  if (out.size() - head_start <= 3) {
    while (end + 1 < text.size() && text[end] == ',') {
      std::string group;
      const std::size_t group_end = [&] {
        std::size_t at = end + 1;
        while (at < text.size() && group.size() <= 3) {
          const auto digit = digit_at(text, at);
          if (!digit) break;
          group += static_cast<char>('0' + digit->value);
          at += digit->bytes;
        }
        return at;
      }();
      if (group.size() != 3) break;
      out += group;
      end = group_end;
    }
  }
  if (end + 1 < text.size() && (text[end] == '.' || text[end] == '/') && digit_run(text, end + 1) > 0) {
    const char separator = text[end];
    out += separator;
    end = append_run(end + 1);
    if (separator == '.') {  // 72.50 -> 72.5, 72.0 -> 72
      while (out.back() == '0') out.pop_back();
      if (out.back() == '.') out.pop_back();
    }
  }
  return end;
}

inline bool is_ascii_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// The last lenient number of text in canonical form, or "".
inline std::string last_lenient_number(std::string_view text) {
  std::string last;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (digit_run(text, pos) == 0) {
      ++pos;
      continue;
    }
    // A minus sign counts when it is not a binary minus ("5-3"): nothing alphanumeric right before it.
    const bool negative = pos >= 1 && text[pos - 1] == '-' && (pos == 1 || !is_ascii_alnum(text[pos - 2]));
    std::string number = negative ? "-" : "";
    pos = read_lenient_number(text, pos, number);
    if (number == "-0") number = "0";
    last = std::move(number);
  }
  return last;
}

inline std::size_t count_occurrences(std::string_view text, std::string_view needle) {
  std::size_t count = 0;
  for (auto at = text.find(needle); at != std::string_view::npos; at = text.find(needle, at + needle.size())) ++count;
  return count;
}

}  // namespace detail

// The answer the policy gave: see the file comment for what each mode reads. "" when there is none.
inline std::string extract_answer(std::string_view response, AnswerMode mode = AnswerMode::kSeed) {
  const auto block = detail::answer_block(response);
  if (!block) return {};
  return mode == AnswerMode::kSeed ? detail::last_seed_number(*block) : detail::last_lenient_number(*block);
}

// The reference of a GSM8K `answer` field: the text after "####", trimmed, commas removed ("...#### 1,080" -> "1080";
// "#### -7" -> "-7"). Throws std::invalid_argument when there is no "####" or nothing after it.
inline std::string reference_answer(std::string_view gsm8k_answer_field) {
  constexpr const char* kWhere = "dapo::gsm8k::reference_answer";
  const auto marker = gsm8k_answer_field.find("####");
  DAPO_REQUIRE(marker != std::string_view::npos, kWhere, "the answer field has no '####' before the final answer: '",
               gsm8k_answer_field.substr(0, 80), gsm8k_answer_field.size() > 80 ? "...'" : "'");
  std::string reference;
  for (const char c : gsm8k_answer_field.substr(marker + 4)) {
    if (c != ',') reference += c;
  }
  const auto first = reference.find_first_not_of(" \t\r\n");
  DAPO_REQUIRE(first != std::string::npos, kWhere, "nothing follows '####' in the answer field '",
               gsm8k_answer_field.substr(0, 80), gsm8k_answer_field.size() > 80 ? "...'" : "'");
  const auto last = reference.find_last_not_of(" \t\r\n");
  return reference.substr(first, last - first + 1);
}

namespace detail {

inline double correctness_of(const std::string& extracted, std::string_view reference, AnswerMode mode) {
  if (mode == AnswerMode::kSeed) return extracted == reference ? kCorrectnessReward : 0.0;
  return !extracted.empty() && extracted == last_lenient_number(reference) ? kCorrectnessReward : 0.0;
}

inline double digit_of(const std::string& extracted, AnswerMode mode) {
  std::string_view digits = extracted;
  if (mode == AnswerMode::kLenient && digits.starts_with('-')) digits.remove_prefix(1);
  if (digits.empty()) return 0.0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return 0.0;
  }
  return kDigitReward;
}

}  // namespace detail

// 2.0 when the extracted answer equals the reference (kLenient: both normalised, see the file comment), else 0.
inline double correctness_reward(std::string_view response, std::string_view reference,
                                 AnswerMode mode = AnswerMode::kSeed) {
  return detail::correctness_of(extract_answer(response, mode), reference, mode);
}

// 0.5 when the extracted answer is a whole number: ASCII digits only (kLenient: an optional leading minus).
inline double digit_reward(std::string_view response, AnswerMode mode = AnswerMode::kSeed) {
  return detail::digit_of(extract_answer(response, mode), mode);
}

// 0.5 when the whole response is "<think>\n", thinking, "\n</think>\n<answer>\n", one line, "\n</answer>\n", and at
// most one more "\n". kSeed: the thinking is one line; kLenient: any number of lines.
inline double hard_format_reward(std::string_view response, AnswerMode mode = AnswerMode::kSeed) {
  constexpr std::string_view kOpen = "<think>\n", kMiddle = "\n</think>\n<answer>\n", kClose = "\n</answer>\n";
  if (!response.starts_with(kOpen)) return 0.0;
  auto answer_matches = [&](std::size_t answer_start) {
    const auto line_end = response.find('\n', answer_start);
    if (line_end == std::string_view::npos || response.compare(line_end, kClose.size(), kClose) != 0) return false;
    const std::string_view rest = response.substr(line_end + kClose.size());
    return rest.empty() || rest == "\n";
  };
  if (mode == AnswerMode::kSeed) {
    const auto line_end = response.find('\n', kOpen.size());
    return line_end != std::string_view::npos && response.compare(line_end, kMiddle.size(), kMiddle) == 0 &&
                   answer_matches(line_end + kMiddle.size())
               ? kHardFormatReward
               : 0.0;
  }
  for (auto middle = response.find(kMiddle, kOpen.size()); middle != std::string_view::npos;
       middle = response.find(kMiddle, middle + 1)) {
    if (answer_matches(middle + kMiddle.size())) return kHardFormatReward;
  }
  return 0.0;
}

// 0.125 for each of "<think>\n", "</think>\n", "<answer>\n", "</answer>\n" that occurs exactly once.
inline double mark_reward(std::string_view response) {
  double reward = 0.0;
  for (const std::string_view tag : {"<think>\n", "</think>\n", "<answer>\n", "</answer>\n"}) {
    if (detail::count_occurrences(response, tag) == 1) reward += kMarkReward;
  }
  return reward;
}

// All four seed rewards of one response. Weights are the caller's (the seed sums them with weight 1).
struct Rewards {
  double correctness = 0.0, digit = 0.0, hard_format = 0.0, mark = 0.0;
  double total() const { return correctness + digit + hard_format + mark; }
};

inline Rewards score(std::string_view response, std::string_view reference, AnswerMode mode = AnswerMode::kSeed) {
  const std::string extracted = extract_answer(response, mode);
  return {detail::correctness_of(extracted, reference, mode), detail::digit_of(extracted, mode),
          hard_format_reward(response, mode), mark_reward(response)};
}

}  // namespace dapo::gsm8k
