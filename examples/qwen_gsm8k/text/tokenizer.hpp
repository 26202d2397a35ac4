// The Qwen2.5 tokenizer: Hugging Face byte-level BPE read from tokenizer.json (added tokens, NFC, the split regex,
// the GPT-2 byte-to-unicode map, ranked merges), encode and decode. Not a general port of `tokenizers`: only
// byte-level BPE models whose vocabulary covers all 256 bytes, and no truncation, padding or post-processing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qwen {

// A token matched literally in the raw text before any normalisation or splitting (tokenizer.json "added_tokens").
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;      // dropped by decode(..., skip_special_tokens = true)
  bool lstrip = false;       // the match also swallows the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // matches only when not inside a word
  bool normalized = false;   // matched in the NFC-normalised text instead of the raw text
};

// Tokenizer::byte_level's settings beyond its special tokens.
struct ByteLevelOptions {
  std::string chat_template;  // what chat_template() returns and save() writes
  bool nfc = false;           // NFC-normalise the text first, as Qwen2.5's tokenizer does
};

class Tokenizer {
 public:
  // Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json (chat template, eos and pad token names).
  // Throws std::runtime_error naming the file, the offset or entry, and a hint when a file is missing or malformed.
  static Tokenizer from_directory(const std::filesystem::path& dir);

  // An in-memory tokenizer: ids 0..255 are the bytes 0..255 (as GPT-2 byte-level tokens), no merges, no
  // normalisation, and `special_tokens` become added special tokens 256, 257, ... Encoding a string therefore yields
  // its bytes, except where a special token occurs. Same code path as from_directory; used by the tiny demo model.
  static Tokenizer byte_level(std::vector<std::string> special_tokens, ByteLevelOptions options = {});

  // Writes dir/tokenizer.json and dir/tokenizer_config.json (each atomically; dir must exist), as Hugging Face's
  // save_pretrained lays them out, so that from_directory and transformers' AutoTokenizer read back this tokenizer:
  // the same ids for every text, the same added tokens, eos, pad and chat template. The vocabulary, merges (in rank
  // order), normaliser and split patterns are those this tokenizer was built from. tokenizer_class is
  // Qwen2Tokenizer when the tokenizer normalises to NFC and splits with Qwen2's pattern alone, else
  // PreTrainedTokenizerFast. transformers 5 builds the tokenizer of a qwen2 model directory as Qwen2Tokenizer
  // whatever tokenizer_class says (NFC, Qwen2's pattern, the file's vocabulary and merges), so only a Qwen-like
  // tokenizer reads back the same there. Throws std::runtime_error naming the file when it cannot be written.
  void save(const std::filesystem::path& dir) const;

  // Token ids of `text`; adds no BOS/EOS (Qwen adds none). Never throws on text: bytes that are not valid UTF-8 are
  // cut out of the text and each becomes its byte-level token, while the valid runs around them are NFC-normalised
  // and split as usual (Hugging Face cannot see such input: Python strings are always valid Unicode).
  // Thread-safe; the per-piece BPE cache is shared by copies of this tokenizer.
  std::vector<int32_t> encode(std::string_view text) const;

  // The text of `ids`: byte-level tokens become their bytes, added tokens their content (special ones dropped when
  // skip_special_tokens). Bytes that do not form valid UTF-8 become U+FFFD exactly as Python's
  // bytes.decode("utf-8", errors="replace") does. Throws std::invalid_argument naming the id and its position when an
  // id has no token.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id, added tokens included (151665 for Qwen2.5; the model's embedding may be larger).
  int32_t vocab_size() const;
  // The id of a vocabulary token (byte-level form, e.g. "Ġthe") or of an added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token of an id: byte-level form for BPE tokens, the content for added tokens. Throws for an unknown id.
  const std::string& id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // From tokenizer_config.json ("eos_token", "pad_token"). Without a config, or when it names none: eos is
  // "<|im_end|>" (else "<|endoftext|>"), pad is "<|endoftext|>" (else the eos), whichever exists; nullopt if neither.
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  // The Jinja chat template of tokenizer_config.json; empty when there is none. See chat.hpp for how it is rendered.
  const std::string& chat_template() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;  // immutable after construction except for its internally locked cache
};

}  // namespace qwen
