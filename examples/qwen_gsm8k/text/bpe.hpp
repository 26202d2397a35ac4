// Byte-level BPE (internal to text/): the ranked merge table, the merge loop as `tokenizers` runs it, and the cache of
// merged pieces shared by every copy of a tokenizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qwen::detail {

// A map keyed by std::string that is also looked up by std::string_view, without a temporary string.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const noexcept { return std::hash<std::string_view>{}(text); }
};
template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

class MergeTable {
 public:
  void reserve(std::size_t merges) { merges_.reserve(merges); }
  // Merging `left` and `right` gives `result`; lower ranks merge first. A pair added again takes the new rank.
  void add(int32_t left, int32_t right, int32_t rank, int32_t result);

  // Appends to `out` the ids of `piece` (non-empty) after merging: it starts as one token per byte (`byte_ids`), and
  // the lowest-ranked merge present, leftmost first, applies until none does.
  void apply(std::string_view piece, const std::array<int32_t, 256>& byte_ids, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank = 0;    // position in the merges list: lower merges first
    int32_t result = 0;  // id of the concatenated token
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* find(int32_t left, int32_t right) const;

  std::unordered_map<uint64_t, Merge> merges_;
};

// The BPE result of each piece seen so far. Text repeats its words, so most pieces skip the merge loop. Thread-safe;
// bounded as Hugging Face bounds its cache: enough for a corpus's common words, bounded for adversarial text.
class PieceCache {
 public:
  static constexpr std::size_t kCapacity = 200'000;
  static constexpr std::size_t kMaxPieceBytes = 256;

  // Appends the cached ids of `piece` to `ids` and returns true, or returns false when `piece` is not cached.
  bool append_cached(std::string_view piece, std::vector<int32_t>& ids) const;
  // Remembers the ids of `piece`, unless it is long or the cache is full.
  void insert(std::string_view piece, std::span<const int32_t> ids) const;

 private:
  mutable std::mutex mutex_;
  mutable StringMap<std::vector<int32_t>> entries_;
};

}  // namespace qwen::detail
