// The pre-tokenizer (internal to text/): NFC normalisation (utf8proc) and the Split regexes (PCRE2) that cut text
// into the pieces BPE merges within.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

// PCRE2's compiled pattern and match state (with PCRE2_CODE_UNIT_WIDTH 8), declared here so that <pcre2.h> stays in
// pre_tokenizer.cpp.
struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace qwen::detail {

// The pre-tokenizer of GPT-2, used when a ByteLevel pre-tokenizer has use_regex = true.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2's pre-tokenizer, used by Tokenizer::byte_level() so that the demo tokenizer splits text as the real one does.
inline constexpr std::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Code points below U+0300 are never changed by NFC and never compose with what precedes them; every byte of their
// UTF-8 is below 0xCC. Text without a byte >= 0xCC (all of GSM8K's ASCII lines) therefore skips utf8proc.
bool may_change_under_nfc(std::string_view text);

// The NFC form of `text`, which must be well-formed UTF-8. utf8proc's Unicode tables (15.0 on Debian 12) are newer
// than those of `tokenizers` 0.23 (9.0): marks assigned since are reordered by their combining class here and
// compositions added since (U+11935 U+11930 -> U+11938) are made, where `tokenizers` leaves the text as it is.
std::string to_nfc(std::string_view text);

// A Split pre-tokenizer with "Isolated" behaviour: every match is a piece, and so is every gap between matches.
// \s means Unicode's White_Space, as in Oniguruma, which `tokenizers` runs, and \p{L} and \p{N} mean Unicode 16.0's
// letters and numbers, those of `tokenizers` 0.23, whatever Unicode version the build's PCRE2 has: its own tables
// (14.0 in Debian 12's 10.42, 17.0 in Debian sid's 10.49) would split text with the letters and digits of the other
// versions (CJK extensions H and J, Kawi, Garay, ...) differently. Both are spelled out as explicit class ranges.
class SplitRegex {
 public:
  // `literal`: a {"String": ...} pattern, matched as is. Throws std::runtime_error naming `where` and the offset when
  // the pattern does not compile.
  SplitRegex(std::string_view pattern, bool literal, const std::string& where);

  // Calls on_piece(piece) for each piece of `text` in order. `text` must be well-formed UTF-8: it is not checked
  // again here, which keeps each match O(piece).
  template <class OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const {
    Matches matches(*this, text);
    std::size_t gap_start = 0;
    while (const auto match = matches.next()) {
      if (match->start > gap_start) on_piece(text.substr(gap_start, match->start - gap_start));
      on_piece(text.substr(match->start, match->end - match->start));
      gap_start = match->end;
    }
    if (gap_start < text.size()) on_piece(text.substr(gap_start));
  }

 private:
  struct Match {
    std::size_t start = 0, end = 0;
  };

  // The non-empty matches in one text, left to right, with the PCRE2 match state they need.
  class Matches {
   public:
    Matches(const SplitRegex& regex, std::string_view text);
    Matches(const Matches&) = delete;
    Matches& operator=(const Matches&) = delete;
    ~Matches();
    // The next match; nullopt when there is none. Throws std::runtime_error when PCRE2 fails.
    std::optional<Match> next();

   private:
    const pcre2_real_code_8* code_;
    std::string_view text_;
    std::size_t search_ = 0;  // where the next match may start
    pcre2_real_match_data_8* match_data_;
  };

  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const noexcept;
  };
  std::unique_ptr<pcre2_real_code_8, CodeDeleter> code_;
};

}  // namespace qwen::detail
