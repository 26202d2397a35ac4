// Byte-level BPE as Hugging Face `tokenizers` runs it for Qwen2.5: the loader for tokenizer.json and
// tokenizer_config.json, the encode pipeline (added tokens -> NFC -> split regex -> byte-level map -> merges) and
// decode. Not a JSON or regex engine: nlohmann::json reads the files, PCRE2 runs the split pattern, utf8proc
// normalises.
#include "qwen_gsm8k/text/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <dapo/core/error.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace qwen {
namespace {

namespace fs = std::filesystem;
using dapo::detail::concat;
using nlohmann::json;

// The pre-tokenizer of GPT-2, used when a ByteLevel pre-tokenizer has use_regex = true.
constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2's pre-tokenizer, used by byte_level() so that the demo tokenizer splits text as the real one does.
constexpr std::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Ids are dense indices into per-id tables, so a corrupt file must not make us allocate gigabytes.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;
// Hugging Face caps its BPE cache the same way: enough for a corpus's common words, bounded for adversarial text.
constexpr std::size_t kCacheCapacity = 200'000;
constexpr std::size_t kMaxCachedPieceBytes = 256;

unsigned char byte_at(std::string_view text, std::size_t i) {
  return static_cast<unsigned char>(text[i]);
}

// ---------------------------------------------------------------------------------------------------------------
// UTF-8

// Length of the well-formed UTF-8 sequence starting at text[pos], or 0 when there is none. Then `bad_length` is the
// length of the maximal subpart that one U+FFFD replaces (Unicode §3.9 "substitution of maximal subparts", which is
// what Python's errors="replace" and Rust's from_utf8_lossy do).
std::size_t utf8_sequence(std::string_view text, std::size_t pos, std::size_t& bad_length) {
  const unsigned char lead = byte_at(text, pos);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte depends on the lead byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead == 0xE0) {
    length = 3, low = 0xA0;  // no overlong forms
  } else if (lead == 0xED) {
    length = 3, high = 0x9F;  // no surrogates
  } else if (lead >= 0xE1 && lead <= 0xEF) {
    length = 3;
  } else if (lead == 0xF0) {
    length = 4, low = 0x90;
  } else if (lead >= 0xF1 && lead <= 0xF3) {
    length = 4;
  } else if (lead == 0xF4) {
    length = 4, high = 0x8F;  // nothing above U+10FFFF
  } else {
    bad_length = 1;
    return 0;
  }
  for (std::size_t i = 1; i < length; ++i) {
    if (pos + i >= text.size() || byte_at(text, pos + i) < low || byte_at(text, pos + i) > high) {
      bad_length = i;
      return 0;
    }
    low = 0x80, high = 0xBF;
  }
  return length;
}

// The code point of a well-formed sequence of `length` bytes at text[pos].
char32_t code_point_at(std::string_view text, std::size_t pos, std::size_t length) {
  static constexpr unsigned char kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t cp = byte_at(text, pos) & kLeadMask[length];
  for (std::size_t i = 1; i < length; ++i) cp = (cp << 6) | (byte_at(text, pos + i) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string replace_invalid_utf8(std::string bytes) {
  std::size_t pos = 0, bad_length = 0;
  while (pos < bytes.size() && utf8_sequence(bytes, pos, bad_length) > 0) pos += utf8_sequence(bytes, pos, bad_length);
  if (pos == bytes.size()) return bytes;  // the common case: already valid
  std::string out = bytes.substr(0, pos);
  while (pos < bytes.size()) {
    const std::size_t length = utf8_sequence(bytes, pos, bad_length);
    if (length > 0) {
      out.append(bytes, pos, length);
      pos += length;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      pos += bad_length;
    }
  }
  return out;
}

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

// The character that starts at `pos` / ends at `pos`, if it is well-formed.
std::optional<std::pair<char32_t, std::size_t>> char_after(std::string_view text, std::size_t pos) {
  if (pos >= text.size()) return std::nullopt;
  std::size_t bad_length = 0;
  const std::size_t length = utf8_sequence(text, pos, bad_length);
  if (length == 0) return std::nullopt;
  return std::pair{code_point_at(text, pos, length), length};
}

std::optional<std::pair<char32_t, std::size_t>> char_before(std::string_view text, std::size_t pos) {
  std::size_t start = pos;
  while (start > 0 && pos - start < 4) {
    --start;
    if ((byte_at(text, start) & 0xC0) != 0x80) break;  // not a continuation byte: the lead
  }
  if (start == pos) return std::nullopt;
  const auto found = char_after(text, start);
  if (!found || start + found->second != pos) return std::nullopt;
  return found;
}

// Code points below U+0300 are never changed by NFC and never compose with what precedes them; every byte of their
// UTF-8 is below 0xCC. Text without a byte >= 0xCC (all of GSM8K's ASCII lines) therefore skips utf8proc.
bool may_change_under_nfc(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; });
}

// `text` must be well-formed UTF-8.
std::string to_nfc(std::string_view text) {
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &normalized, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) throw std::runtime_error(concat("qwen::Tokenizer: NFC failed: ", utf8proc_errmsg(length)));
  std::string out(reinterpret_cast<const char*>(normalized), static_cast<std::size_t>(length));
  std::free(normalized);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100..U+0143,
// so every byte string has a printable spelling ("Ġ" is the space).

std::array<char32_t, 256> byte_code_points() {
  std::array<char32_t, 256> table{};
  char32_t next_unprintable = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
    table[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return table;
}

struct ByteLevelAlphabet {
  std::array<std::string, 256> spelling;  // byte -> its UTF-8 spelling
  std::array<int16_t, 0x144> byte_of{};   // code point -> byte, -1 where none

  ByteLevelAlphabet() {
    byte_of.fill(-1);
    const auto code_points = byte_code_points();
    for (int byte = 0; byte < 256; ++byte) {
      append_utf8(spelling[byte], code_points[byte]);
      byte_of[code_points[byte]] = static_cast<int16_t>(byte);
    }
  }

  // The bytes a vocabulary token stands for. A character outside the alphabet passes through as its own UTF-8,
  // as Hugging Face's ByteLevel decoder does.
  std::string bytes_of(std::string_view token) const {
    std::string bytes;
    std::size_t pos = 0, bad_length = 0;
    while (pos < token.size()) {
      const std::size_t length = utf8_sequence(token, pos, bad_length);
      if (length == 0) {
        bytes.append(token.substr(pos, bad_length));
        pos += bad_length;
        continue;
      }
      const char32_t cp = code_point_at(token, pos, length);
      if (cp < byte_of.size() && byte_of[cp] >= 0) {
        bytes += static_cast<char>(byte_of[cp]);
      } else {
        bytes.append(token.substr(pos, length));
      }
      pos += length;
    }
    return bytes;
  }

  std::string spell(std::string_view bytes) const {
    std::string out;
    for (const char c : bytes) out += spelling[static_cast<unsigned char>(c)];
    return out;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Containers

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const noexcept { return std::hash<std::string_view>{}(text); }
};
template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

struct Merge {
  int32_t rank = 0;    // position in the merges list: lower merges first
  int32_t result = 0;  // id of the concatenated token
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// The BPE result of each piece seen so far. Text repeats its words, so most pieces skip the merge loop.
class PieceCache {
 public:
  bool append_cached(std::string_view piece, std::vector<int32_t>& ids) const {
    std::lock_guard lock(mutex_);
    const auto found = entries_.find(piece);
    if (found == entries_.end()) return false;
    ids.insert(ids.end(), found->second.begin(), found->second.end());
    return true;
  }

  void insert(std::string_view piece, std::span<const int32_t> ids) const {
    if (piece.size() > kMaxCachedPieceBytes) return;
    std::lock_guard lock(mutex_);
    if (entries_.size() >= kCacheCapacity) return;
    entries_.try_emplace(std::string(piece), ids.begin(), ids.end());
  }

 private:
  mutable std::mutex mutex_;
  mutable StringMap<std::vector<int32_t>> entries_;
};

// ---------------------------------------------------------------------------------------------------------------
// Added tokens: leftmost-longest literal matches, as the Aho-Corasick matcher of `tokenizers` finds them.

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized) {
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

  bool empty() const {
    return std::all_of(by_first_byte_.begin(), by_first_byte_.end(), [](const auto& c) { return c.empty(); });
  }

  // Calls on_segment(text, token) for the text between matches (token == nullptr) and for each match, in order.
  template <class OnSegment>
  void split(std::string_view text, OnSegment&& on_segment) const {
    std::size_t segment_start = 0, scan = 0;
    while (scan < text.size()) {
      const AddedToken* token = longest_match_at(text, scan);
      if (token == nullptr) {
        ++scan;
        continue;
      }
      std::size_t start = scan, stop = scan + token->content.size();
      scan = stop;  // a rejected match is consumed too, as in `tokenizers`
      if (token->single_word && (ends_with_word(text, start) || starts_with_word(text, stop))) continue;
      if (token->lstrip) {
        while (start > segment_start) {
          const auto before = char_before(text, start);
          if (!before || !is_white_space(before->first) || start - before->second < segment_start) break;
          start -= before->second;
        }
      }
      if (token->rstrip) {
        for (auto after = char_after(text, stop); after && is_white_space(after->first);
             after = char_after(text, stop)) {
          stop += after->second;
        }
      }
      if (start > segment_start) on_segment(text.substr(segment_start, start - segment_start), nullptr);
      on_segment(text.substr(start, stop - start), token);
      segment_start = scan = stop;
    }
    if (segment_start < text.size()) on_segment(text.substr(segment_start), nullptr);
  }

 private:
  const AddedToken* longest_match_at(std::string_view text, std::size_t pos) const {
    for (const auto& token : by_first_byte_[byte_at(text, pos)]) {  // longest first
      if (text.compare(pos, token.content.size(), token.content) == 0) return &token;
    }
    return nullptr;
  }

  static bool ends_with_word(std::string_view text, std::size_t pos) {
    const auto before = char_before(text, pos);
    return before && is_alphanumeric(before->first);
  }
  static bool starts_with_word(std::string_view text, std::size_t pos) {
    const auto after = char_after(text, pos);
    return after && is_alphanumeric(after->first);
  }

  std::array<std::vector<AddedToken>, 256> by_first_byte_;
};

// ---------------------------------------------------------------------------------------------------------------
// A Split pre-tokenizer with "Isolated" behaviour: every match is a piece, and so is every gap between matches.

class SplitRegex {
 public:
  // `literal`: a {"String": ...} pattern, matched as is.
  SplitRegex(std::string_view pattern, bool literal, const std::string& where) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error_code,
                                     &error_offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      throw std::runtime_error(concat(where, ": the split pattern does not compile at offset ", error_offset, ": ",
                                      reinterpret_cast<const char*>(message.data()),
                                      " (hint: the pattern is read as a PCRE2 regex with Unicode properties)"));
    }
    code_.reset(code);
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // the interpreter still works where the JIT is unavailable
  }

  // `text` must be well-formed UTF-8: it is not checked again here, which keeps each match O(piece).
  template <class OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const {
    const std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    if (!match_data) throw std::bad_alloc();
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t gap_start = 0, search = 0;
    while (search < text.size()) {
      const int rc =
          pcre2_match(code_.get(), subject, text.size(), search, PCRE2_NO_UTF_CHECK, match_data.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> message{};
        pcre2_get_error_message(rc, message.data(), message.size());
        throw std::runtime_error(concat("qwen::Tokenizer::encode: the split regex failed at byte ", search, ": ",
                                        reinterpret_cast<const char*>(message.data())));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
      const std::size_t start = ovector[0], end = ovector[1];
      if (end == start) {  // an empty match is no piece; step over one character and search on
        std::size_t bad_length = 0;
        search = start + std::max<std::size_t>(1, utf8_sequence(text, start, bad_length));
        continue;
      }
      if (start > gap_start) on_piece(text.substr(gap_start, start - gap_start));
      on_piece(text.substr(start, end - start));
      gap_start = search = end;
    }
    if (gap_start < text.size()) on_piece(text.substr(gap_start));
  }

 private:
  struct CodeDeleter {
    void operator()(pcre2_code* code) const { pcre2_code_free(code); }
  };
  struct MatchDataDeleter {
    void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
  };
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// ---------------------------------------------------------------------------------------------------------------
// Reading the files

std::string hint_for(const fs::path& path) {
  return path.filename() == "tokenizer_config.json"
             ? "hint: tokenizer_config.json is optional; fix or delete it"
             : "hint: pass the directory of a Hugging Face byte-level BPE tokenizer, such as a Qwen2.5 checkpoint, "
               "and download tokenizer.json again if it was cut short";
}

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw std::runtime_error(concat(path.string(), ": ", problem, " (", hint_for(path), ")"));
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return json::parse(text);
  } catch (const json::parse_error& error) {
    fail(path, concat("not valid JSON at byte ", error.byte, " of ", text.size(), ": ", error.what()));
  }
}

// A JSON field that must exist and have the right kind; `name` is its dotted path for the message.
const json& require_field(const json& object, const char* key, const std::string& name, const fs::path& path) {
  if (!object.is_object() || !object.contains(key)) fail(path, concat("missing \"", name, "\""));
  return object.at(key);
}

std::string string_field(const json& object, const char* key, const std::string& name, const fs::path& path) {
  const json& value = require_field(object, key, name, path);
  if (!value.is_string()) fail(path, concat("\"", name, "\" must be a string, not ", value.type_name()));
  return value.get<std::string>();
}

bool bool_field(const json& object, const char* key, bool fallback, const std::string& name, const fs::path& path) {
  if (!object.contains(key) || object.at(key).is_null()) return fallback;
  if (!object.at(key).is_boolean()) fail(path, concat("\"", name, ".", key, "\" must be true or false"));
  return object.at(key).get<bool>();
}

// tokenizer_config.json names tokens either as "<|im_end|>" or as {"content": "<|im_end|>", ...}.
std::optional<std::string> config_token_name(const json& config, const char* key, const fs::path& path) {
  if (!config.contains(key) || config.at(key).is_null()) return std::nullopt;
  const json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  fail(path, concat("\"", key, "\" must be a token string or an object with a \"content\" string"));
}

std::vector<AddedToken> load_added_tokens(const json& root, const fs::path& path) {
  std::vector<AddedToken> added;
  if (!root.contains("added_tokens") || root.at("added_tokens").is_null()) return added;
  const json& entries = root.at("added_tokens");
  if (!entries.is_array()) fail(path, "\"added_tokens\" must be an array");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const json& entry = entries[i];
    const std::string name = concat("added_tokens[", i, "]");
    AddedToken token;
    token.content = string_field(entry, "content", name + ".content", path);
    const json& id = require_field(entry, "id", name + ".id", path);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
      fail(path, concat(name, ".id is ", id.dump(), "; ids must be integers in [0, ", kMaxTokenId, "]"));
    }
    if (token.content.empty()) fail(path, concat(name, ".content is empty"));
    token.id = static_cast<int32_t>(id.get<int64_t>());
    token.special = bool_field(entry, "special", false, name, path);
    token.lstrip = bool_field(entry, "lstrip", false, name, path);
    token.rstrip = bool_field(entry, "rstrip", false, name, path);
    token.single_word = bool_field(entry, "single_word", false, name, path);
    token.normalized = bool_field(entry, "normalized", !token.special, name, path);
    added.push_back(std::move(token));
  }
  return added;
}

bool load_normalizer(const json& root, const fs::path& path) {
  if (!root.contains("normalizer") || root.at("normalizer").is_null()) return false;
  const json& normalizer = root.at("normalizer");
  const std::string type = string_field(normalizer, "type", "normalizer.type", path);
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const json& steps = require_field(normalizer, "normalizers", "normalizer.normalizers", path);
    bool nfc = false;
    for (const json& step : steps) {
      if (string_field(step, "type", "normalizer.normalizers[].type", path) != "NFC") {
        fail(path, concat("normalizer ", step.dump(), " is not supported (supported: none, NFC)"));
      }
      nfc = true;
    }
    return nfc;
  }
  fail(path, concat("normalizer type \"", type, "\" is not supported (supported: none, NFC)"));
}

enum class TokenKind : uint8_t { kNone, kModel, kAdded, kSpecial };

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  ByteLevelAlphabet alphabet;
  std::vector<std::string> tokens;       // by id: byte-level spelling, or an added token's content
  std::vector<std::string> token_bytes;  // by id: what decode emits
  std::vector<TokenKind> kinds;          // by id; kNone marks an id no token has
  StringMap<int32_t> ids;                // spelling or added content -> id
  std::array<int32_t, 256> byte_ids{};   // byte -> id of its single-byte token
  std::unordered_map<uint64_t, Merge> merges;
  bool ignore_merges = false;  // a piece that is a whole vocabulary token skips the merges (Llama 3 style)
  bool nfc = false;
  std::vector<SplitRegex> splits;  // applied in order
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_added, normalized_added;
  std::optional<int32_t> eos, pad;
  std::string chat_template;
  PieceCache cache;

  void set_token(int32_t id, std::string token, std::string bytes, TokenKind kind) {
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

  void add_added_tokens(std::vector<AddedToken> tokens_to_add) {
    for (auto& token : tokens_to_add) {
      set_token(token.id, token.content, token.content, token.special ? TokenKind::kSpecial : TokenKind::kAdded);
    }
    added = std::move(tokens_to_add);
    raw_added = AddedTokenMatcher(added, /*normalized=*/false);
    normalized_added = AddedTokenMatcher(added, /*normalized=*/true);
  }

  // Every byte must have its token: the merges start from single bytes, and invalid UTF-8 is encoded byte by byte.
  void find_byte_ids(const std::string& where) {
    for (int byte = 0; byte < 256; ++byte) {
      const auto found = ids.find(alphabet.spelling[byte]);
      if (found == ids.end() || kinds[found->second] != TokenKind::kModel) {
        throw std::runtime_error(concat(where, ": the vocabulary lacks the byte-level token \"",
                                        alphabet.spelling[byte], "\" for byte ", byte,
                                        " (hint: only byte-level BPE vocabularies that cover all 256 bytes, as GPT-2's "
                                        "and Qwen's do, are supported)"));
      }
      byte_ids[byte] = found->second;
    }
  }

  std::optional<int32_t> id_of(std::string_view token) const {
    const auto found = ids.find(token);
    if (found == ids.end()) return std::nullopt;
    return found->second;
  }

  // Without a config: the chat end marker ends generation, and <|endoftext|> pads, as Qwen2.5-Instruct has it.
  void default_eos_and_pad() {
    if (!eos) eos = id_of("<|im_end|>") ? id_of("<|im_end|>") : id_of("<|endoftext|>");
    if (!pad) pad = id_of("<|endoftext|>") ? id_of("<|endoftext|>") : eos;
  }

  // ---- loading (defined below)
  void load_model(const json& root, const fs::path& path);
  void load_pre_tokenizer(const json& root, const fs::path& path);
  bool load_pre_tokenizer_step(const json& step, const fs::path& path);
  void load_config(const fs::path& path);

  // ---- encode

  void encode(std::string_view text, std::vector<int32_t>& out) const {
    raw_added.split(text, [&](std::string_view segment, const AddedToken* token) {
      if (token != nullptr) {
        out.push_back(token->id);
      } else {
        encode_segment(segment, out);
      }
    });
  }

  // Well-formed UTF-8 runs are normalised and split; each byte of a malformed sequence becomes its byte token.
  void encode_segment(std::string_view segment, std::vector<int32_t>& out) const {
    std::size_t run_start = 0, pos = 0, bad_length = 0;
    while (pos < segment.size()) {
      if (byte_at(segment, pos) < 0x80) {
        ++pos;
        continue;
      }
      const std::size_t length = utf8_sequence(segment, pos, bad_length);
      if (length > 0) {
        pos += length;
        continue;
      }
      encode_valid(segment.substr(run_start, pos - run_start), out);
      for (std::size_t i = 0; i < bad_length; ++i) out.push_back(byte_ids[byte_at(segment, pos + i)]);
      pos += bad_length;
      run_start = pos;
    }
    encode_valid(segment.substr(run_start), out);
  }

  void encode_valid(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    if (nfc && may_change_under_nfc(text)) {
      normalized = to_nfc(text);
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

  void pre_tokenize(std::string_view text, std::size_t level, std::vector<int32_t>& out) const {
    if (level == splits.size()) {
      bpe(text, out);
      return;
    }
    splits[level].split(text, [&](std::string_view piece) { pre_tokenize(piece, level + 1, out); });
  }

  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
      out.push_back(byte_ids[byte_at(piece, 0)]);
      return;
    }
    if (cache.append_cached(piece, out)) return;
    const std::size_t first = out.size();
    const auto whole = ignore_merges ? id_of(alphabet.spell(piece)) : std::nullopt;
    if (whole && kinds[*whole] == TokenKind::kModel) {
      out.push_back(*whole);
    } else {
      merge(piece, out);
    }
    cache.insert(piece, std::span<const int32_t>(out).subspan(first));
  }

  // Applies the lowest-ranked merge present, leftmost first, until none applies: the order of `tokenizers`'
  // priority queue. Stale queue entries are recognised because their result no longer matches the pair.
  void merge(std::string_view piece, std::vector<int32_t>& out) const {
    struct Symbol {
      int32_t id;
      int32_t prev, next;  // neighbours in the linked list, -1 at the ends
      bool alive;
    };
    struct Candidate {
      int32_t rank, pos, result;
      bool operator>(const Candidate& other) const { return rank != other.rank ? rank > other.rank : pos > other.pos; }
    };
    const auto n = static_cast<int32_t>(piece.size());
    std::vector<Symbol> symbols(n);
    for (int32_t i = 0; i < n; ++i) symbols[i] = {byte_ids[byte_at(piece, i)], i - 1, i + 1 < n ? i + 1 : -1, true};
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    const auto push_pair = [&](int32_t left) {
      const auto found = merges.find(pair_key(symbols[left].id, symbols[symbols[left].next].id));
      if (found != merges.end()) queue.push({found->second.rank, left, found->second.result});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[top.pos];
      if (!left.alive || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      const auto found = merges.find(pair_key(left.id, right.id));
      if (found == merges.end() || found->second.result != top.result) continue;
      left.id = top.result;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = top.pos;
      if (left.prev >= 0) push_pair(left.prev);
      if (left.next >= 0) push_pair(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
  }
};

void Tokenizer::Impl::load_model(const json& root, const fs::path& path) {
  const json& model = require_field(root, "model", "model", path);
  // Old files omit "type"; their merges say they are BPE.
  const std::string type = model.contains("type") ? string_field(model, "type", "model.type", path) : "BPE";
  if (type != "BPE") {
    fail(path, concat("model.type is \"", type, "\", but only byte-level \"BPE\" models are supported"));
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout") != 0.0) {
    fail(path, "model.dropout is set; BPE dropout is for training and is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "") {
      fail(path, concat("model.", key, " is set; byte-level BPE uses none and it is not supported"));
    }
  }
  ignore_merges = bool_field(model, "ignore_merges", false, "model", path);

  const json& vocab = require_field(model, "vocab", "model.vocab", path);
  if (!vocab.is_object())
    fail(path, concat("\"model.vocab\" must be an object of token -> id, not ", vocab.type_name()));
  ids.reserve(vocab.size() + 64);
  for (const auto& [token, id_value] : vocab.items()) {
    if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 || id_value.get<int64_t>() > kMaxTokenId) {
      fail(path, concat("model.vocab[\"", token, "\"] is ", id_value.dump(), "; ids must be integers in [0, ",
                        kMaxTokenId, "]"));
    }
    const auto id = static_cast<int32_t>(id_value.get<int64_t>());
    if (static_cast<std::size_t>(id) < kinds.size() && kinds[id] != TokenKind::kNone) {
      fail(path, concat("model.vocab gives id ", id, " to both \"", tokens[id], "\" and \"", token, "\""));
    }
    set_token(id, token, alphabet.bytes_of(token), TokenKind::kModel);
  }

  const json& merge_list = require_field(model, "merges", "model.merges", path);
  if (!merge_list.is_array()) fail(path, concat("\"model.merges\" must be an array, not ", merge_list.type_name()));
  merges.reserve(merge_list.size());
  for (std::size_t rank = 0; rank < merge_list.size(); ++rank) {
    const json& merge = merge_list[rank];
    std::string left, right;
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else if (merge.is_string() && merge.get<std::string>().find(' ') != std::string::npos) {
      const std::string text = merge.get<std::string>();  // the legacy "left right" form
      const auto space = text.find(' ');
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      fail(path, concat("model.merges[", rank, "] is ", merge.dump(),
                        "; a merge is a pair [\"left\", \"right\"] or a string \"left right\""));
    }
    const auto id_of_model_token = [&](const std::string& token) -> int32_t {
      const auto found = ids.find(token);
      if (found == ids.end()) {
        fail(path, concat("model.merges[", rank, "] ", merge.dump(), " needs \"", token,
                          "\", which is not in model.vocab (the merges do not belong to this vocabulary)"));
      }
      return found->second;
    };
    const int32_t left_id = id_of_model_token(left), right_id = id_of_model_token(right);
    const int32_t result = id_of_model_token(left + right);
    merges.insert_or_assign(pair_key(left_id, right_id), Merge{static_cast<int32_t>(rank), result});
  }
}

// Returns whether a ByteLevel step was present: without one the vocabulary is not byte-level.
bool Tokenizer::Impl::load_pre_tokenizer_step(const json& step, const fs::path& path) {
  const std::string type = string_field(step, "type", "pre_tokenizer.type", path);
  if (type == "Split") {
    const json& pattern = require_field(step, "pattern", "pre_tokenizer.pattern", path);
    const std::string behavior = step.value("behavior", "Isolated");
    if (behavior != "Isolated" || bool_field(step, "invert", false, "pre_tokenizer", path)) {
      fail(path, concat("Split pre-tokenizer with behavior \"", behavior,
                        "\" or invert is not supported (supported: Isolated, invert false)"));
    }
    if (pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      splits.emplace_back(pattern.at("Regex").get<std::string>(), false, path.string());
    } else if (pattern.contains("String") && pattern.at("String").is_string()) {
      splits.emplace_back(pattern.at("String").get<std::string>(), true, path.string());
    } else {
      fail(path, concat("Split pattern ", pattern.dump(), " must be {\"Regex\": ...} or {\"String\": ...}"));
    }
    return false;
  }
  if (type == "ByteLevel") {
    if (bool_field(step, "add_prefix_space", false, "pre_tokenizer", path)) {
      fail(path, "ByteLevel add_prefix_space = true is not supported");
    }
    if (bool_field(step, "use_regex", true, "pre_tokenizer", path)) {
      splits.emplace_back(kGpt2SplitPattern, false, path.string());
    }
    return true;
  }
  fail(path, concat("pre_tokenizer type \"", type, "\" is not supported (supported: Split, ByteLevel, Sequence)"));
}

void Tokenizer::Impl::load_pre_tokenizer(const json& root, const fs::path& path) {
  const json& pre_tokenizer = require_field(root, "pre_tokenizer", "pre_tokenizer", path);
  bool byte_level = false;
  if (pre_tokenizer.is_object() && pre_tokenizer.value("type", "") == "Sequence") {
    for (const json& step : require_field(pre_tokenizer, "pretokenizers", "pre_tokenizer.pretokenizers", path)) {
      byte_level = load_pre_tokenizer_step(step, path) || byte_level;
    }
  } else {
    byte_level = load_pre_tokenizer_step(pre_tokenizer, path);
  }
  if (!byte_level) fail(path, "pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are supported");
  if (root.contains("decoder") && !root.at("decoder").is_null()) {
    const std::string decoder = string_field(root.at("decoder"), "type", "decoder.type", path);
    if (decoder != "ByteLevel") {
      fail(path, concat("decoder type \"", decoder, "\" is not supported (supported: ByteLevel)"));
    }
  }
}

void Tokenizer::Impl::load_config(const fs::path& path) {
  const json config = read_json_file(path);
  if (!config.is_object()) fail(path, "the top level must be a JSON object");
  if (config.contains("chat_template") && !config.at("chat_template").is_null()) {
    const json& templates = config.at("chat_template");
    if (templates.is_string()) {
      chat_template = templates.get<std::string>();
    } else if (templates.is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
      for (const json& named : templates) {
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template")) {
          chat_template = named.at("template").get<std::string>();
        }
      }
    } else {
      fail(path, "\"chat_template\" must be a string or a list of {\"name\", \"template\"}");
    }
  }
  const auto resolve = [&](const char* key) -> std::optional<int32_t> {
    const auto name = config_token_name(config, key, path);
    if (!name) return std::nullopt;
    const auto id = id_of(*name);
    if (!id) fail(path, concat("\"", key, "\" is \"", *name, "\", which is not a token of tokenizer.json"));
    return id;
  };
  eos = resolve("eos_token");
  pad = resolve("pad_token");
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_directory(const std::filesystem::path& dir) {
  if (!fs::is_directory(dir)) {
    throw std::runtime_error(concat(dir.string(),
                                    ": not a directory (hint: pass the directory that holds tokenizer.json, such as a "
                                    "downloaded Qwen2.5 checkpoint)"));
  }
  const fs::path path = dir / "tokenizer.json", config = dir / "tokenizer_config.json";
  auto impl = std::make_shared<Impl>();
  // The loaders check the fields they know; a wrongly typed field they read in passing surfaces as a json::exception.
  fs::path reading = path;
  try {
    const json root = read_json_file(path);
    if (!root.is_object()) fail(path, "the top level must be a JSON object");
    impl->load_model(root, path);
    impl->nfc = load_normalizer(root, path);
    impl->load_pre_tokenizer(root, path);
    impl->find_byte_ids(path.string());  // before the added tokens, which may reuse a byte's spelling
    impl->add_added_tokens(load_added_tokens(root, path));
    reading = config;
    if (fs::exists(config)) impl->load_config(config);
  } catch (const json::exception& error) {
    fail(reading, concat("unexpected content: ", error.what()));
  }
  impl->default_eos_and_pad();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::byte_level(std::vector<std::string> special_tokens) {
  auto impl = std::make_shared<Impl>();
  for (int byte = 0; byte < 256; ++byte) {
    impl->set_token(byte, impl->alphabet.spelling[byte], std::string(1, static_cast<char>(byte)), TokenKind::kModel);
  }
  impl->splits.emplace_back(kQwen2SplitPattern, false, "qwen::Tokenizer::byte_level");
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
  return replace_invalid_utf8(std::move(bytes));
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
