// Fuzz target: encoding arbitrary bytes and decoding arbitrary ids with the Qwen2.5 tokenizer (see fuzz_support.hpp
// for which tokenizer). Properties: encode never fails and gives ids inside the vocabulary; decode of those ids is
// valid UTF-8 and, for valid UTF-8 text that NFC leaves unchanged, the text itself (the round trip
// tokenizer.decode(tokenizer.encode(text)) == text of Hugging Face); decode of any id list either gives valid UTF-8
// or, for an id outside the vocabulary, throws std::invalid_argument.
#include <utf8proc.h>

#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"

namespace {

bool nfc_unchanged(std::string_view text) {
  utf8proc_uint8_t* normalized = nullptr;
  const auto length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &normalized, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const bool same = length >= 0 && std::string_view(reinterpret_cast<const char*>(normalized),
                                                    static_cast<std::size_t>(length)) == text;
  std::free(normalized);
  return same;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)dapo::fuzz::fuzz_tokenizer();  // loaded once, before the clock of the first input starts
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const qwen::Tokenizer& tokenizer = dapo::fuzz::fuzz_tokenizer();
  const std::string_view text = dapo::fuzz::as_text(data, size);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  if (std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return id < 0 || id >= tokenizer.vocab_size(); })) {
    dapo::fuzz::finding("encode gave an id outside the vocabulary");
  }
  const std::string decoded = tokenizer.decode(ids);
  if (!dapo::utf8::is_valid(decoded)) dapo::fuzz::finding("decode gave invalid UTF-8");
  if (dapo::utf8::is_valid(text) && text.find('\0') == std::string_view::npos && nfc_unchanged(text) &&
      decoded != text) {
    dapo::fuzz::finding("decode(encode(text)) != text for NFC-stable UTF-8 text");
  }
  (void)tokenizer.decode(ids, true);

  // The same bytes read as token ids.
  std::vector<int32_t> raw(size / sizeof(int32_t));
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * sizeof(int32_t));
  try {
    const std::string any = tokenizer.decode(raw, size % 2 == 1);
    if (!dapo::utf8::is_valid(any)) dapo::fuzz::finding("decode of arbitrary ids gave invalid UTF-8");
  } catch (const std::invalid_argument& error) {
    if (std::all_of(raw.begin(), raw.end(), [&](int32_t id) { return id >= 0 && id < tokenizer.vocab_size(); })) {
      dapo::fuzz::finding(std::string("decode refused ids inside the vocabulary: ") + error.what());
    }
  }
  return 0;
}
