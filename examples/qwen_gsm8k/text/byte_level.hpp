// GPT-2's byte-to-unicode map (internal to text/): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100..U+0143, so every byte string has a printable spelling ("Ġ" is the space). Vocabulary tokens are written
// in these spellings.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace qwen::detail {

struct ByteLevelAlphabet {
  std::array<std::string, 256> spelling;  // byte -> its UTF-8 spelling
  std::array<int16_t, 0x144> byte_of{};   // code point -> byte, -1 where none

  ByteLevelAlphabet();

  // The bytes a vocabulary token stands for. A character outside the alphabet passes through as its own UTF-8, and
  // malformed UTF-8 as its bytes, as Hugging Face's ByteLevel decoder does.
  std::string bytes_of(std::string_view token) const;

  // The spelling of a byte string (the inverse of bytes_of).
  std::string spell(std::string_view bytes) const;
};

}  // namespace qwen::detail
