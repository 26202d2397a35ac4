// The tables of a loaded Tokenizer and its encode pipeline (internal to text/): tokenizer_json.cpp fills them from
// tokenizer.json and tokenizer_config.json, tokenizer.cpp builds the in-memory one and runs encode and decode.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qwen_gsm8k/text/added_tokens.hpp"
#include "qwen_gsm8k/text/bpe.hpp"
#include "qwen_gsm8k/text/byte_level.hpp"
#include "qwen_gsm8k/text/pre_tokenizer.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"

namespace qwen {
namespace detail {

enum class TokenKind : uint8_t { kNone, kModel, kAdded, kSpecial };

// Ids are dense indices into per-id tables, so a corrupt file must not make us allocate gigabytes.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

}  // namespace detail

struct Tokenizer::Impl {
  using TokenKind = detail::TokenKind;

  detail::ByteLevelAlphabet alphabet;
  std::vector<std::string> tokens;       // by id: byte-level spelling, or an added token's content
  std::vector<std::string> token_bytes;  // by id: what decode emits
  std::vector<TokenKind> kinds;          // by id; kNone marks an id no token has
  detail::StringMap<int32_t> ids;        // spelling or added content -> id
  std::array<int32_t, 256> byte_ids{};   // byte -> id of its single-byte token
  detail::MergeTable merges;
  bool ignore_merges = false;  // a piece that is a whole vocabulary token skips the merges (Llama 3 style)
  bool nfc = false;
  std::vector<detail::SplitRegex> splits;  // applied in order
  // What the tables were built from, kept for save(): each split's pattern (literal or regex), the merges as id pairs
  // in rank order, and the vocabulary entries an added token took the id of.
  struct SplitSource {
    std::string pattern;
    bool literal = false;
  };
  std::vector<SplitSource> split_sources;
  std::vector<std::array<int32_t, 2>> merge_pairs;
  std::vector<std::pair<std::string, int32_t>> shadowed_vocab;
  std::vector<AddedToken> added;
  detail::AddedTokenMatcher raw_added, normalized_added;
  std::optional<int32_t> eos, pad;
  std::string chat_template;
  detail::PieceCache cache;

  // ---- building the tables (tokenizer.cpp)
  void add_split(std::string_view pattern, bool literal, const std::string& where);
  void set_token(int32_t id, std::string token, std::string bytes, TokenKind kind);
  void add_added_tokens(std::vector<AddedToken> tokens_to_add);
  // Every byte must have its token: the merges start from single bytes, and invalid UTF-8 is encoded byte by byte.
  void find_byte_ids(const std::string& where);
  std::optional<int32_t> id_of(std::string_view token) const;
  // Without a config: the chat end marker ends generation, and <|endoftext|> pads, as Qwen2.5-Instruct has it.
  void default_eos_and_pad();

  // ---- loading the files (tokenizer_json.cpp); each throws std::runtime_error naming `path` and a hint
  void load_model(const nlohmann::json& root, const std::filesystem::path& path);
  void load_vocab(const nlohmann::json& vocab, const std::filesystem::path& path);
  void load_merges(const nlohmann::json& merge_list, const std::filesystem::path& path);
  void load_pre_tokenizer(const nlohmann::json& root, const std::filesystem::path& path);
  bool load_pre_tokenizer_step(const nlohmann::json& step, const std::filesystem::path& path);
  void load_config(const std::filesystem::path& path);

  // ---- writing the files (tokenizer_save.cpp)
  nlohmann::ordered_json tokenizer_json() const;
  nlohmann::ordered_json config_json() const;
  // The byte-level spelling model.vocab gives `id`: an added token's id may have taken a vocabulary entry's.
  const std::string& vocab_spelling(int32_t id) const;

  // ---- encode (tokenizer.cpp): added tokens -> NFC -> split regexes -> byte-level BPE
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // Well-formed UTF-8 runs are normalised and split; each byte of a malformed sequence becomes its byte token.
  void encode_segment(std::string_view segment, std::vector<int32_t>& out) const;
  void encode_valid(std::string_view text, std::vector<int32_t>& out) const;
  void pre_tokenize(std::string_view text, std::size_t level, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
};

}  // namespace qwen
