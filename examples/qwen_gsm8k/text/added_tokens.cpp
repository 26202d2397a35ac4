// Matching added tokens, with the whitespace and word tests of Rust's char, which `tokenizers` uses.
#include "qwen_gsm8k/text/added_tokens.hpp"

#include <utf8proc.h>

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <utility>

namespace qwen::detail {
namespace {

// Rust's char::is_whitespace (the Unicode White_Space property), which decides lstrip/rstrip of added tokens.
bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Rust's char::is_alphanumeric (letters and numbers), which decides single_word added tokens.
bool is_alphanumeric(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// The character that starts at `pos` / ends at `pos`, if it is well-formed: its code point and its length.
std::optional<std::pair<char32_t, std::size_t>> char_after(std::string_view text, std::size_t pos) {
  const dapo::utf8::Sequence sequence = dapo::utf8::decode(text, pos);
  if (!sequence.valid) return std::nullopt;
  return std::pair{sequence.code_point, sequence.length};
}

std::optional<std::pair<char32_t, std::size_t>> char_before(std::string_view text, std::size_t pos) {
  std::size_t start = pos;
  while (start > 0 && pos - start < 4) {
    --start;
    if ((static_cast<unsigned char>(text[start]) & 0xC0) != 0x80) break;  // not a continuation byte: the lead
  }
  if (start == pos) return std::nullopt;
  const auto found = char_after(text, start);
  if (!found || start + found->second != pos) return std::nullopt;
  return found;
}

bool ends_with_word(std::string_view text, std::size_t pos) {
  const auto before = char_before(text, pos);
  return before && is_alphanumeric(before->first);
}

bool starts_with_word(std::string_view text, std::size_t pos) {
  const auto after = char_after(text, pos);
  return after && is_alphanumeric(after->first);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized) {
  for (const auto& token : tokens) {
    if (token.normalized != normalized || token.content.empty()) continue;
    const auto first = static_cast<unsigned char>(token.content[0]);
    by_first_byte_[first].push_back(token);
  }
  for (auto& candidates : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  }
}

bool AddedTokenMatcher::empty() const {
  return std::all_of(by_first_byte_.begin(), by_first_byte_.end(), [](const auto& c) { return c.empty(); });
}

const AddedToken* AddedTokenMatcher::longest_match_at(std::string_view text, std::size_t pos) const {
  for (const auto& token : by_first_byte_[static_cast<unsigned char>(text[pos])]) {  // longest first
    if (text.compare(pos, token.content.size(), token.content) == 0) return &token;
  }
  return nullptr;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::next_match(std::string_view text, std::size_t segment_start,
                                                                      std::size_t& scan) const {
  while (scan < text.size()) {
    // Most bytes start no added token: skip them without a call.
    const AddedToken* token =
        by_first_byte_[static_cast<unsigned char>(text[scan])].empty() ? nullptr : longest_match_at(text, scan);
    if (token == nullptr) {
      ++scan;
      continue;
    }
    std::size_t start = scan, stop = scan + token->content.size();
    scan = stop;
    if (token->single_word && (ends_with_word(text, start) || starts_with_word(text, stop))) continue;
    if (token->lstrip) {
      while (start > segment_start) {
        const auto before = char_before(text, start);
        if (!before || !is_white_space(before->first) || start - before->second < segment_start) break;
        start -= before->second;
      }
    }
    if (token->rstrip) {
      for (auto after = char_after(text, stop); after && is_white_space(after->first); after = char_after(text, stop)) {
        stop += after->second;
      }
    }
    return Match{start, stop, token};
  }
  return std::nullopt;
}

}  // namespace qwen::detail
