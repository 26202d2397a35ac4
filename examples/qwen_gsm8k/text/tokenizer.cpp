// The Tokenizer: its tables, the in-memory byte-level tokenizer, and encode and decode, the pipeline of Hugging Face
// `tokenizers` for Qwen2.5 (added tokens -> NFC -> split regex -> byte-level map -> merges). The files are read in
// tokenizer_json.cpp; each stage lives in its own file of text/.
#include "qwen_gsm8k/text/tokenizer.hpp"

#include <dapo/core/error.hpp>
#include <dapo/core/utf8.hpp>

#include <stdexcept>
#include <utility>

#include "qwen_gsm8k/text/tokenizer_impl.hpp"

namespace qwen {

using dapo::concat;
using detail::TokenKind;

// ---- the tables

void Tokenizer::Impl::set_token(int32_t id, std::string token, std::string bytes, TokenKind kind) {
  if (static_cast<std::size_t>(id) >= tokens.size()) {
    tokens.resize(id + 1);
    token_bytes.resize(id + 1);
    kinds.resize(id + 1, TokenKind::kNone);
  }
  ids.insert_or_assign(token, id);  // an added token wins over a vocabulary token of the same spelling
  tokens[id] = std::move(token);
  token_bytes[id] = std::move(bytes);
  kinds[id] = kind;
}

void Tokenizer::Impl::add_split(std::string_view pattern, bool literal, const std::string& where) {
  splits.emplace_back(pattern, literal, where);
  split_sources.push_back({std::string(pattern), literal});
}

void Tokenizer::Impl::add_added_tokens(std::vector<AddedToken> tokens_to_add) {
  for (auto& token : tokens_to_add) {
    if (static_cast<std::size_t>(token.id) < kinds.size() && kinds[token.id] == TokenKind::kModel) {
      shadowed_vocab.emplace_back(tokens[token.id], token.id);
    }
    set_token(token.id, token.content, token.content, token.special ? TokenKind::kSpecial : TokenKind::kAdded);
  }
  added = std::move(tokens_to_add);
  raw_added = detail::AddedTokenMatcher(added, /*normalized=*/false);
  normalized_added = detail::AddedTokenMatcher(added, /*normalized=*/true);
}

void Tokenizer::Impl::find_byte_ids(const std::string& where) {
  for (int byte = 0; byte < 256; ++byte) {
    const auto found = ids.find(alphabet.spelling[byte]);
    if (found == ids.end() || kinds[found->second] != TokenKind::kModel) {
      throw std::runtime_error(concat(where, ": the vocabulary lacks the byte-level token \"", alphabet.spelling[byte],
                                      "\" for byte ", byte,
                                      " (hint: only byte-level BPE vocabularies that cover all 256 bytes, as GPT-2's "
                                      "and Qwen's do, are supported)"));
    }
    byte_ids[byte] = found->second;
  }
}

std::optional<int32_t> Tokenizer::Impl::id_of(std::string_view token) const {
  const auto found = ids.find(token);
  if (found == ids.end()) return std::nullopt;
  return found->second;
}

void Tokenizer::Impl::default_eos_and_pad() {
  if (!eos) eos = id_of("<|im_end|>") ? id_of("<|im_end|>") : id_of("<|endoftext|>");
  if (!pad) pad = id_of("<|endoftext|>") ? id_of("<|endoftext|>") : eos;
}

// ---- encode

void Tokenizer::Impl::encode(std::string_view text, std::vector<int32_t>& out) const {
  raw_added.split(text, [&](std::string_view segment, const AddedToken* token) {
    if (token != nullptr) {
      out.push_back(token->id);
    } else {
      encode_segment(segment, out);
    }
  });
}

void Tokenizer::Impl::encode_segment(std::string_view segment, std::vector<int32_t>& out) const {
  std::size_t run_start = 0, pos = 0;
  while (pos < segment.size()) {
    if (static_cast<unsigned char>(segment[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const dapo::utf8::Sequence sequence = dapo::utf8::decode(segment, pos);
    if (sequence.valid) {
      pos += sequence.length;
      continue;
    }
    encode_valid(segment.substr(run_start, pos - run_start), out);
    for (std::size_t i = 0; i < sequence.length; ++i) {
      out.push_back(byte_ids[static_cast<unsigned char>(segment[pos + i])]);
    }
    pos += sequence.length;
    run_start = pos;
  }
  encode_valid(segment.substr(run_start), out);
}

void Tokenizer::Impl::encode_valid(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc && detail::may_change_under_nfc(text)) {
    normalized = detail::to_nfc(text);
    text = normalized;
  }
  if (normalized_added.empty()) {
    pre_tokenize(text, 0, out);
    return;
  }
  normalized_added.split(text, [&](std::string_view segment, const AddedToken* token) {
    if (token != nullptr) {
      out.push_back(token->id);
    } else {
      pre_tokenize(segment, 0, out);
    }
  });
}

void Tokenizer::Impl::pre_tokenize(std::string_view text, std::size_t level, std::vector<int32_t>& out) const {
  if (level == splits.size()) {
    bpe(text, out);
    return;
  }
  splits[level].split(text, [&](std::string_view piece) { pre_tokenize(piece, level + 1, out); });
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (cache.append_cached(piece, out)) return;
  const std::size_t first = out.size();
  const auto whole = ignore_merges ? id_of(alphabet.spell(piece)) : std::nullopt;
  if (whole && kinds[*whole] == TokenKind::kModel) {
    out.push_back(*whole);
  } else {
    merges.apply(piece, byte_ids, out);
  }
  cache.insert(piece, std::span<const int32_t>(out).subspan(first));
}

// ---- the public class

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::byte_level(std::vector<std::string> special_tokens, ByteLevelOptions options) {
  auto impl = std::make_shared<Impl>();
  for (int byte = 0; byte < 256; ++byte) {
    impl->set_token(byte, impl->alphabet.spelling[byte], std::string(1, static_cast<char>(byte)), TokenKind::kModel);
  }
  impl->add_split(detail::kQwen2SplitPattern, false, "qwen::Tokenizer::byte_level");
  for (std::size_t i = 0; i < special_tokens.size(); ++i) {
    const std::string& content = special_tokens[i];
    DAPO_REQUIRE(!content.empty(), "qwen::Tokenizer::byte_level", "special_tokens[", i, "] is empty");
    for (std::size_t j = 0; j < i; ++j) {
      DAPO_REQUIRE(special_tokens[j] != content, "qwen::Tokenizer::byte_level", "special_tokens[", i, "] \"", content,
                   "\" repeats special_tokens[", j, "]");
    }
  }
  std::vector<AddedToken> added;
  for (std::size_t i = 0; i < special_tokens.size(); ++i) {
    added.push_back(
        AddedToken{.content = std::move(special_tokens[i]), .id = static_cast<int32_t>(256 + i), .special = true});
  }
  impl->find_byte_ids("qwen::Tokenizer::byte_level");
  impl->add_added_tokens(std::move(added));
  impl->default_eos_and_pad();
  impl->chat_template = std::move(options.chat_template);
  impl->nfc = options.nfc;
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (std::size_t position = 0; position < ids.size(); ++position) {
    const int32_t id = ids[position];
    DAPO_REQUIRE(id >= 0 && id < vocab_size() && impl_->kinds[id] != TokenKind::kNone, "qwen::Tokenizer::decode", "id ",
                 id, " at position ", position, " is not a token (valid ids are 0..", vocab_size() - 1,
                 "; was the sequence produced with another tokenizer or model?)");
    if (skip_special_tokens && impl_->kinds[id] == TokenKind::kSpecial) continue;
    bytes += impl_->token_bytes[id];
  }
  return dapo::utf8::replace_invalid(std::move(bytes));
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->tokens.size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->id_of(token);
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  DAPO_REQUIRE(id >= 0 && id < vocab_size() && impl_->kinds[id] != TokenKind::kNone, "qwen::Tokenizer::id_to_token",
               "id ", id, " is not a token (valid ids are 0..", vocab_size() - 1, ")");
  return impl_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->kinds[id] == TokenKind::kSpecial;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}
std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos;
}
std::optional<int32_t> Tokenizer::pad_token_id() const {
  return impl_->pad;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}

}  // namespace qwen
