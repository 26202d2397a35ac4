// Added tokens in text (internal to text/): leftmost-longest literal matches, as the Aho-Corasick matcher of
// `tokenizers` finds them, with its lstrip, rstrip and single_word rules.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "qwen_gsm8k/text/tokenizer.hpp"

namespace qwen::detail {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // The tokens of `tokens` whose `normalized` flag equals `normalized`: those matched in the raw text, or in the
  // NFC-normalised text.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized);

  bool empty() const;

  // Calls on_segment(text, token) for the text between matches (token == nullptr) and for each match, in order.
  template <class OnSegment>
  void split(std::string_view text, OnSegment&& on_segment) const {
    std::size_t segment_start = 0, scan = 0;
    while (const auto match = next_match(text, segment_start, scan)) {
      if (match->start > segment_start) on_segment(text.substr(segment_start, match->start - segment_start), nullptr);
      on_segment(text.substr(match->start, match->stop - match->start), match->token);
      segment_start = scan = match->stop;
    }
    if (segment_start < text.size()) on_segment(text.substr(segment_start), nullptr);
  }

 private:
  struct Match {
    std::size_t start = 0, stop = 0;  // the token's bytes plus any whitespace its lstrip / rstrip swallows
    const AddedToken* token = nullptr;
  };

  // The next accepted match at or after `scan`, whose lstrip reaches back no further than `segment_start`. Moves
  // `scan` past every match it rejects (a rejected match is consumed, as in `tokenizers`); nullopt at the end.
  std::optional<Match> next_match(std::string_view text, std::size_t segment_start, std::size_t& scan) const;
  const AddedToken* longest_match_at(std::string_view text, std::size_t pos) const;

  std::array<std::vector<AddedToken>, 256> by_first_byte_;  // each list longest first
};

}  // namespace qwen::detail
