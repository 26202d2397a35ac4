// The GPT-2 byte-level alphabet: built once per tokenizer, 256 spellings and their inverse.
#include "qwen_gsm8k/text/byte_level.hpp"

#include <dapo/core/utf8.hpp>

namespace qwen::detail {
namespace {

std::array<char32_t, 256> byte_code_points() {
  std::array<char32_t, 256> table{};
  char32_t next_unprintable = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
    table[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return table;
}

}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of.fill(-1);
  const auto code_points = byte_code_points();
  for (int byte = 0; byte < 256; ++byte) {
    dapo::utf8::append(spelling[byte], code_points[byte]);
    byte_of[code_points[byte]] = static_cast<int16_t>(byte);
  }
}

std::string ByteLevelAlphabet::bytes_of(std::string_view token) const {
  std::string bytes;
  std::size_t pos = 0;
  while (pos < token.size()) {
    const dapo::utf8::Sequence sequence = dapo::utf8::decode(token, pos);
    const char32_t cp = sequence.code_point;
    if (sequence.valid && cp < byte_of.size() && byte_of[cp] >= 0) {
      bytes += static_cast<char>(byte_of[cp]);
    } else {
      bytes.append(token.substr(pos, sequence.length));
    }
    pos += sequence.length;
  }
  return bytes;
}

std::string ByteLevelAlphabet::spell(std::string_view bytes) const {
  std::string out;
  for (const char c : bytes) out += spelling[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace qwen::detail
