// NFC through utf8proc and Split through PCRE2 (JIT-compiled where available), as `tokenizers` runs them.
#include "qwen_gsm8k/text/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <dapo/core/error.hpp>
#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <new>
#include <stdexcept>

namespace qwen::detail {
namespace {

using dapo::concat;

std::string pcre2_message(int error_code) {
  std::array<PCRE2_UCHAR, 256> message{};
  pcre2_get_error_message(error_code, message.data(), message.size());
  return reinterpret_cast<const char*>(message.data());
}

}  // namespace

bool may_change_under_nfc(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; });
}

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

void SplitRegex::CodeDeleter::operator()(pcre2_code* code) const noexcept {
  pcre2_code_free(code);
}

SplitRegex::SplitRegex(std::string_view pattern, bool literal, const std::string& where) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error_code,
                            &error_offset, nullptr));
  if (!code_) {
    throw std::runtime_error(concat(where, ": the split pattern does not compile at offset ", error_offset, ": ",
                                    pcre2_message(error_code),
                                    " (hint: the pattern is read as a PCRE2 regex with Unicode properties)"));
  }
  pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // the interpreter still works where the JIT is unavailable
}

SplitRegex::Matches::Matches(const SplitRegex& regex, std::string_view text)
    : code_(regex.code_.get()), text_(text), match_data_(pcre2_match_data_create_from_pattern(code_, nullptr)) {
  if (match_data_ == nullptr) throw std::bad_alloc();
}

SplitRegex::Matches::~Matches() {
  pcre2_match_data_free(match_data_);
}

std::optional<SplitRegex::Match> SplitRegex::Matches::next() {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text_.data());
  while (search_ < text_.size()) {
    const int rc = pcre2_match(code_, subject, text_.size(), search_, PCRE2_NO_UTF_CHECK, match_data_, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw std::runtime_error(
          concat("qwen::Tokenizer::encode: the split regex failed at byte ", search_, ": ", pcre2_message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data_);
    const std::size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // an empty match is no piece; step over one character and search on
      const dapo::utf8::Sequence sequence = dapo::utf8::decode(text_, start);
      search_ = start + (sequence.valid ? sequence.length : 1);
      continue;
    }
    search_ = end;
    return Match{start, end};
  }
  search_ = text_.size();
  return std::nullopt;
}

}  // namespace qwen::detail
