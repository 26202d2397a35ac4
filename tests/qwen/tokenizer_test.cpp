// qwen::Tokenizer: all golden encodings of the Qwen2.5 tokenizer (ids and both decodings), the cases where we once
// disagreed with Hugging Face tokenizers, hand cases, the in-memory byte-level tokenizer, the split regex's Unicode
// classes, and the error messages for malformed tokenizer files. Needs no LibTorch.
#include "qwen_gsm8k/text/tokenizer.hpp"

#include <dapo/core/utf8.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "qwen_gsm8k/text/pre_tokenizer.hpp"
#include "support/shared.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using qwen::Tokenizer;

std::optional<fs::path> fixtures_dir() {
  const auto dir = dapo::test::require_shared("fixtures/tokenizer");
  if (!dir) return std::nullopt;
  return *dir / "fixtures" / "tokenizer";
}

// Loaded once: every test case here reads the same 7 MB file.
const Tokenizer& qwen_tokenizer(const fs::path& fixtures) {
  static const Tokenizer tokenizer = Tokenizer::from_directory(fixtures / "qwen2.5");
  return tokenizer;
}

std::vector<int32_t> ids_of(const json& value) {
  return value.get<std::vector<int32_t>>();
}

// The ids a byte-level tokenizer gives for raw bytes: the bytes themselves.
std::vector<int32_t> byte_ids(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (const char c : bytes) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// A directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("qwen_tokenizer_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }

 private:
  fs::path path_;
};

// A small valid tokenizer.json: the 256 byte tokens, then "ĠĠ" (256) and "ab" (257) with their merges.
json minimal_tokenizer_json() {
  const Tokenizer bytes = Tokenizer::byte_level({});
  json vocab = json::object();
  for (int32_t byte = 0; byte < 256; ++byte) vocab[bytes.id_to_token(byte)] = byte;
  vocab["ĠĠ"] = 256;
  vocab["ab"] = 257;
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 258}, {"content", "<|end|>"}, {"special", true}}})},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", R"(\s+|\S+)"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"Ġ", "Ġ"}), "a b"})}}}};
}

// The pieces that a Split regex cuts `text` into.
std::vector<std::string> split_pieces(std::string_view pattern, std::string_view text) {
  const qwen::detail::SplitRegex regex(pattern, /*literal=*/false, "test");
  std::vector<std::string> pieces;
  regex.split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

}  // namespace

TEST_CASE("Qwen2.5: every golden encoding gives Hugging Face's ids and decodings") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  std::ifstream in(*fixtures / "golden_encodings.json");
  REQUIRE(in.good());
  const json golden = json::parse(in);
  REQUIRE(golden.size() == 473);
  int mismatches = 0;
  for (std::size_t i = 0; i < golden.size(); ++i) {
    const json& item = golden[i];
    const std::string text = item.at("text");
    const auto expected = ids_of(item.at("ids"));
    CAPTURE(i);
    CAPTURE(text);
    const auto ids = tokenizer.encode(text);
    CHECK(ids == expected);
    CHECK(tokenizer.decode(expected) == item.at("decoded").get<std::string>());
    CHECK(tokenizer.decode(expected, /*skip_special_tokens=*/true) ==
          item.at("decoded_skip_special").get<std::string>());
    mismatches += ids != expected;
  }
  CHECK(mismatches == 0);
}

// tests/fixtures/tokenizer_regressions.json: found by differential fuzzing against tokenizers 0.23.1
// (tests/transformers/tokenizer_cases.py), each with tokenizers' ids and decodings and what it exposed.
TEST_CASE("Qwen2.5: every regression case found against Hugging Face tokenizers gives its ids and decodings") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  const fs::path path = fs::path(DAPO_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer_regressions.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  const json regressions = json::parse(in);
  REQUIRE(!regressions.at("cases").empty());
  for (const json& item : regressions.at("cases")) {
    const auto expected = ids_of(item.at("ids"));
    CAPTURE(item.dump(-1, ' ', /*ensure_ascii=*/true));
    if (item.contains("text")) CHECK(tokenizer.encode(item.at("text").get<std::string>()) == expected);
    CHECK(tokenizer.decode(expected) == item.at("decoded").get<std::string>());
    CHECK(tokenizer.decode(expected, /*skip_special_tokens=*/true) ==
          item.at("decoded_skip_special").get<std::string>());
  }
  // Unicode-version differences, not faked: tokenizers' NFC has Unicode 9.0 tables, ours (utf8proc) newer ones, so we
  // encode Unicode's NFC of the text, and tokenizers' ids (kept in the file) differ.
  REQUIRE(!regressions.at("known_differences").empty());
  for (const json& item : regressions.at("known_differences")) {
    CAPTURE(item.dump(-1, ' ', /*ensure_ascii=*/true));
    const auto ids = tokenizer.encode(item.at("text").get<std::string>());
    CHECK(ids == tokenizer.encode(item.at("nfc").get<std::string>()));
    CHECK(ids != ids_of(item.at("ids")));
  }
}

TEST_CASE("Qwen2.5: vocabulary, special tokens and config") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  CHECK(tokenizer.vocab_size() == 151665);
  CHECK(tokenizer.eos_token_id() == 151645);  // <|im_end|>, from tokenizer_config.json
  CHECK(tokenizer.pad_token_id() == 151643);  // <|endoftext|>
  CHECK(tokenizer.token_to_id("Hello") == 9707);
  CHECK(tokenizer.token_to_id("Ġworld") == 1879);
  CHECK(tokenizer.token_to_id("<|im_start|>") == 151644);
  CHECK_FALSE(tokenizer.token_to_id("no such token").has_value());
  CHECK(tokenizer.id_to_token(220) == "Ġ");
  CHECK(tokenizer.id_to_token(151645) == "<|im_end|>");
  CHECK(tokenizer.added_tokens().size() == 22);
  CHECK(tokenizer.is_special(151643));
  CHECK_FALSE(tokenizer.is_special(151657));  // <tool_call> is added but not special
  CHECK_FALSE(tokenizer.is_special(9707));
  CHECK(tokenizer.chat_template().find("<|im_start|>") != std::string::npos);
  CHECK_THROWS_WITH_AS(tokenizer.id_to_token(151665), doctest::Contains("id 151665 is not a token"),
                       std::invalid_argument);
  CHECK_THROWS_AS(tokenizer.id_to_token(-1), std::invalid_argument);
}

TEST_CASE("Qwen2.5: hand cases") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  CHECK(tokenizer.encode("").empty());
  CHECK(tokenizer.decode(std::vector<int32_t>{}).empty());
  CHECK(tokenizer.encode("Hello world") == std::vector<int32_t>{9707, 1879});
  // Added tokens split words; a special token inside a word is still one token.
  CHECK(tokenizer.encode("x<|im_end|>y") == std::vector<int32_t>{87, 151645, 88});
  // NFC: a decomposed e + combining acute encodes as the precomposed é.
  CHECK(tokenizer.encode("cafe\xCC\x81") == tokenizer.encode("caf\xC3\xA9"));
  // The piece cache must not change results: the second encoding of the same text comes from it.
  const std::string sentence = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.";
  CHECK(tokenizer.encode(sentence) == tokenizer.encode(sentence));
  CHECK(tokenizer.decode(tokenizer.encode(sentence)) == sentence);
}

TEST_CASE("Qwen2.5: invalid UTF-8 is encoded byte by byte and decoded as U+FFFD") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  // "ÿ" (id 187) is the byte-level token of byte 0xFF; "a" = 64, "b" = 65.
  CHECK(tokenizer.encode("a\xFF"
                         "b") == std::vector<int32_t>{64, 187, 65});
  CHECK(tokenizer.decode(tokenizer.encode("a\xFF"
                                          "b")) ==
        "a\xEF\xBF\xBD"
        "b");
  // A truncated CJK character: its two bytes stay byte tokens, the text around it is encoded normally.
  const auto ids = tokenizer.encode("Hello \xE4\xBD world");
  CHECK(ids.front() == 9707);
  CHECK(ids.back() == 1879);
  CHECK(tokenizer.decode(ids) == "Hello \xEF\xBF\xBD world");
}

TEST_CASE("Qwen2.5: random bytes never crash and decode to their U+FFFD-replaced text") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  const Tokenizer bytes = Tokenizer::byte_level({});  // its decode of raw bytes is the replacement reference
  // Pieces that exercise the regex branches, special tokens, and bytes that are not UTF-8. Nothing here is changed
  // by NFC (no code point at or above U+0300 precedes a combining mark), so the round trip must be exact.
  const std::vector<std::string> parts = {
      "a",          "Z",     " ",    "  ",       "\n",   "\r\n",         "\t",           "7",
      "'s",         "'LL",   "!",    "?!",       ".",    "\xC3\xA9",     "\xE4\xBD\xA0", "\xF0\x9F\x9A\x80",
      "<|im_end|>", "<|im_", "\xFF", "\xE4\xBD", "\x80", "\xED\xA0\x80", "\xC2\xA0"};
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int i = 0, n = static_cast<int>(rng() % 16); i < n; ++i) text += parts[rng() % parts.size()];
    CAPTURE(trial);
    const auto ids = tokenizer.encode(text);
    CHECK(tokenizer.decode(ids) == bytes.decode(byte_ids(text)));
  }
}

TEST_CASE("Qwen2.5: decode names an id that is out of range and its position") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  CHECK_THROWS_WITH_AS(tokenizer.decode(std::vector<int32_t>{9707, 151665}),
                       doctest::Contains("id 151665 at position 1 is not a token"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(tokenizer.decode(std::vector<int32_t>{-3}), doctest::Contains("id -3 at position 0"),
                       std::invalid_argument);
}

TEST_CASE("Qwen2.5: long runs round-trip without blowing up") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  for (const std::string& text : {std::string(200000, ' '), std::string(200000, '='), std::string(100000, '7'),
                                  std::string(50000, 'a') + "\n\n" + std::string(50000, '\n')}) {
    const auto ids = tokenizer.encode(text);
    CHECK(ids.size() <= text.size());
    CHECK(tokenizer.decode(ids) == text);
  }
}

TEST_CASE("Qwen2.5: concurrent encoding gives the serial result") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) texts.push_back("Question " + std::to_string(i * 7919) + ": how many apples are left?");
  std::vector<std::vector<int32_t>> serial, first(texts.size()), second(texts.size());
  for (const auto& text : texts) serial.push_back(Tokenizer(tokenizer).encode(text));
  const Tokenizer copy = tokenizer;  // copies share the cache, so the threads contend on it
  std::thread a([&] {
    for (std::size_t i = 0; i < texts.size(); ++i) first[i] = tokenizer.encode(texts[i]);
  });
  std::thread b([&] {
    for (std::size_t i = texts.size(); i-- > 0;) second[i] = copy.encode(texts[i]);
  });
  a.join();
  b.join();
  CHECK(first == serial);
  CHECK(second == serial);
}

TEST_CASE("byte_level: bytes are ids 0..255 and special tokens follow") {
  const Tokenizer tokenizer = Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  CHECK(tokenizer.vocab_size() == 259);
  CHECK(tokenizer.token_to_id("<|endoftext|>") == 256);
  CHECK(tokenizer.token_to_id("<|im_end|>") == 258);
  CHECK(tokenizer.eos_token_id() == 258);
  CHECK(tokenizer.pad_token_id() == 256);
  CHECK(tokenizer.id_to_token(32) == "Ġ");  // the GPT-2 spelling of the space
  CHECK(tokenizer.id_to_token(0) == "Ā");
  CHECK(tokenizer.id_to_token('a') == "a");
  CHECK(tokenizer.encode("hi") == std::vector<int32_t>{'h', 'i'});
  CHECK(tokenizer.encode("<|im_start|>user\nhi<|im_end|>") ==
        std::vector<int32_t>{257, 'u', 's', 'e', 'r', '\n', 'h', 'i', 258});
  CHECK(tokenizer.encode("<|im_sta") == byte_ids("<|im_sta"));  // a partial special token is plain text
  CHECK(tokenizer.decode(std::vector<int32_t>{257, 'h', 'i', 258}) == "<|im_start|>hi<|im_end|>");
  CHECK(tokenizer.decode(std::vector<int32_t>{257, 'h', 'i', 258}, /*skip_special_tokens=*/true) == "hi");
  // No normalisation: a decomposed é stays decomposed.
  CHECK(tokenizer.encode("e\xCC\x81") == byte_ids("e\xCC\x81"));
  // A special token may even reuse a byte's spelling: it wins when encoding, the byte keeps its own id.
  const Tokenizer letter_a = Tokenizer::byte_level({"a"});
  CHECK(letter_a.encode("ab") == std::vector<int32_t>{256, 'b'});
  CHECK(letter_a.decode(std::vector<int32_t>{'a', 256}) == "aa");
  CHECK_THROWS_WITH_AS(tokenizer.decode(std::vector<int32_t>{259}), doctest::Contains("id 259 at position 0"),
                       std::invalid_argument);
}

TEST_CASE("byte_level: arbitrary bytes and UTF-8 round-trip") {
  const Tokenizer tokenizer = Tokenizer::byte_level({"<|endoftext|>"});
  std::mt19937 rng(7);
  // Arbitrary bytes: encoding gives the bytes back, and decoding valid UTF-8 gives the text back.
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes(rng() % 64, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() % 256);
    CAPTURE(trial);
    CHECK(tokenizer.encode(bytes) == byte_ids(bytes));
    const std::string decoded = tokenizer.decode(tokenizer.encode(bytes));
    CHECK(tokenizer.decode(tokenizer.encode(decoded)) == decoded);  // the decoded text is valid UTF-8
  }
  // Random code points from every plane, written as UTF-8, come back unchanged.
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0xA0, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFD}, {0x10000, 0x10FFFF}};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    for (int i = 0, n = static_cast<int>(rng() % 24); i < n; ++i) {
      const auto& [low, high] = ranges[rng() % ranges.size()];
      dapo::utf8::append(text, low + rng() % (high - low + 1));
    }
    CAPTURE(trial);
    CHECK(tokenizer.encode(text) == byte_ids(text));
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
  }
}

TEST_CASE("decode replaces invalid UTF-8 as Python's errors='replace' does") {
  const Tokenizer tokenizer = Tokenizer::byte_level({});
  const std::string fffd = "\xEF\xBF\xBD";
  // Expected values from Python 3: bytes.decode("utf-8", errors="replace").
  CHECK(tokenizer.decode(byte_ids("\xE4\xBD")) == fffd);                               // truncated 3-byte sequence: one
  CHECK(tokenizer.decode(byte_ids("\xF0\x80")) == fffd + fffd);                        // F0 needs 90..BF next: two
  CHECK(tokenizer.decode(byte_ids("\xED\xA0\x80")) == fffd + fffd + fffd);             // a surrogate: three
  CHECK(tokenizer.decode(byte_ids("\xC0\xAF")) == fffd + fffd);                        // overlong: two
  CHECK(tokenizer.decode(byte_ids("\xF4\x90\x80\x80")) == fffd + fffd + fffd + fffd);  // above U+10FFFF
  CHECK(tokenizer.decode(byte_ids("\xE4\xBD\xA0\xE5")) == "\xE4\xBD\xA0" + fffd);      // 你 then a cut character
  CHECK(tokenizer.decode(byte_ids("a\xFF"
                                  "b")) == "a" + fffd + "b");
}

TEST_CASE("byte_level rejects empty and repeated special tokens") {
  CHECK_THROWS_WITH_AS(Tokenizer::byte_level({"<a>", ""}), doctest::Contains("special_tokens[1] is empty"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Tokenizer::byte_level({"<a>", "<b>", "<a>"}), doctest::Contains("repeats special_tokens[0]"),
                       std::invalid_argument);
}

TEST_CASE("split regex: \\p{L} and \\p{N} are Unicode 16.0's in every spelling, whatever PCRE2's tables") {
  // U+31350 (CJK Extension H, Unicode 15.0) is a letter, U+325AC (Extension J, Unicode 17.0) is not; U+11F50 KAWI
  // DIGIT ZERO (15.0) and U+1CCF1 OUTLINED DIGIT ONE (16.0) are numbers. PCRE2 10.42's tables (Unicode 14.0) know
  // none of them, 10.49's (17.0) all.
  const std::string text = "a\U00031350b\U000325ACc";
  const std::vector<std::string> letters{"a\U00031350b", "\U000325AC", "c"};
  for (const std::string_view pattern :
       {R"(\p{L}+|\P{L}+)", R"(\pL+|\PL+)", R"([\p{L}]+|\p{^L}+)", R"((?:\p{L})+|[^\p{L}]+)", R"(\P{^L}+|\P{L}+)",
        R"(\p{ l }+|\p{^_L}+)", R"(\pl+|\P{-L-}+)"}) {
    CAPTURE(pattern);
    CHECK(split_pieces(pattern, text) == letters);
  }
  const std::vector<std::string> numbers{"1\U00011F50x\U0001CCF1", "y"};
  CHECK(split_pieces(R"([\p{N}x]+|[^\p{N}x]+)", "1\U00011F50x\U0001CCF1y") == numbers);
  CHECK(split_pieces(R"(\pN+|\PN+)", "\U00011F50\U000325AC") == std::vector<std::string>{"\U00011F50", "\U000325AC"});
  // \p{Lu} and other properties are left to PCRE2; escaped and quoted \p are not properties.
  CHECK(split_pieces(R"(\p{Lu}+|\\pL|\Q\p{N}\E)", "AB\\pL\\p{N}") == std::vector<std::string>{"AB", "\\pL", "\\p{N}"});
  CHECK_THROWS_WITH_AS(split_pieces(R"(x|[^\P{N}a]+)", "x"),
                       doctest::Contains("\\P{N} inside a character class at offset 4, which is not supported (hint: "
                                         "write [^\\p{N}...] instead)"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(split_pieces(R"([\p{^ l}])", "x"),
                       doctest::Contains("\\p{^ l} inside a character class at offset 1, which is not supported (hint: "
                                         "write [^\\p{L}...] instead)"),
                       std::runtime_error);
}

TEST_CASE("tokenizer.json: a minimal file loads; both merge forms apply") {
  TempDir dir;
  dir.write("tokenizer.json", minimal_tokenizer_json().dump());
  const Tokenizer tokenizer = Tokenizer::from_directory(dir.path());
  CHECK(tokenizer.vocab_size() == 259);
  const auto space = *tokenizer.token_to_id("Ġ");
  CHECK(tokenizer.encode("ab  ab") == std::vector<int32_t>{257, 256, 257});
  CHECK(tokenizer.encode("   ") == std::vector<int32_t>{256, space});  // leftmost pair first
  CHECK(tokenizer.encode("ab<|end|>") == std::vector<int32_t>{257, 258});
  CHECK(tokenizer.eos_token_id() == std::nullopt);  // no config and neither default token exists
  CHECK(tokenizer.chat_template().empty());

  dir.write("tokenizer_config.json", R"({"eos_token": {"content": "<|end|>"}, "pad_token": "<|end|>",
                                         "chat_template": "{{ messages }}"})");
  const Tokenizer configured = Tokenizer::from_directory(dir.path());
  CHECK(configured.eos_token_id() == 258);
  CHECK(configured.pad_token_id() == 258);
  CHECK(configured.chat_template() == "{{ messages }}");
}

namespace {

// Tokenizer::save, then from_directory: the same ids, decodings, added tokens, eos, pad and chat template.
void check_same_tokenizer(const Tokenizer& original, const Tokenizer& reloaded, const std::vector<std::string>& texts) {
  CHECK(reloaded.vocab_size() == original.vocab_size());
  for (int32_t id = 0; id < original.vocab_size(); ++id) {
    CAPTURE(id);
    CHECK(reloaded.is_special(id) == original.is_special(id));
  }
  REQUIRE(reloaded.added_tokens().size() == original.added_tokens().size());
  for (std::size_t i = 0; i < original.added_tokens().size(); ++i) {
    const auto &a = original.added_tokens()[i], &b = reloaded.added_tokens()[i];
    CHECK(std::tie(a.content, a.id, a.special, a.lstrip, a.rstrip, a.single_word, a.normalized) ==
          std::tie(b.content, b.id, b.special, b.lstrip, b.rstrip, b.single_word, b.normalized));
  }
  CHECK(reloaded.eos_token_id() == original.eos_token_id());
  CHECK(reloaded.pad_token_id() == original.pad_token_id());
  CHECK(reloaded.chat_template() == original.chat_template());
  int64_t differing = 0;
  for (const std::string& text : texts) {
    const auto ids = original.encode(text);
    differing += reloaded.encode(text) != ids || reloaded.decode(ids) != original.decode(ids);
  }
  CHECK(differing == 0);
}

}  // namespace

TEST_CASE("save: the Qwen2.5 tokenizer written back has Hugging Face's vocabulary and merges and every golden's ids") {
  const auto fixtures = fixtures_dir();
  if (!fixtures) return;
  const Tokenizer& tokenizer = qwen_tokenizer(*fixtures);
  TempDir dir;
  tokenizer.save(dir.path());
  const auto read = [](const fs::path& path) { return json::parse(std::ifstream(path)); };
  const json ours = read(dir.path() / "tokenizer.json"), theirs = read(*fixtures / "qwen2.5" / "tokenizer.json");
  CHECK(ours.at("model").at("vocab") == theirs.at("model").at("vocab"));
  const json &our_merges = ours.at("model").at("merges"), &their_merges = theirs.at("model").at("merges");
  REQUIRE(our_merges.size() == their_merges.size());
  int64_t differing_merges = 0;
  for (std::size_t rank = 0; rank < their_merges.size(); ++rank) {
    const json& merge = their_merges[rank];  // ["left", "right"] or "left right"
    const std::string joined =
        merge.is_string() ? merge.get<std::string>() : merge[0].get<std::string>() + " " + merge[1].get<std::string>();
    differing_merges += our_merges[rank][0].get<std::string>() + " " + our_merges[rank][1].get<std::string>() != joined;
  }
  CHECK(differing_merges == 0);
  CHECK(ours.at("added_tokens").size() == theirs.at("added_tokens").size());
  CHECK(ours.at("normalizer").at("type") == "NFC");

  std::ifstream in(*fixtures / "golden_encodings.json");
  REQUIRE(in.good());
  std::vector<std::string> texts;
  for (const json& item : json::parse(in)) texts.push_back(item.at("text"));
  const Tokenizer reloaded = Tokenizer::from_directory(dir.path());
  check_same_tokenizer(tokenizer, reloaded, texts);
  // Each golden's ids, from the reloaded tokenizer alone (the check above compares it with ours).
  std::ifstream again(*fixtures / "golden_encodings.json");
  int64_t mismatches = 0;
  for (const json& item : json::parse(again))
    mismatches += reloaded.encode(item.at("text").get<std::string>()) != ids_of(item.at("ids"));
  CHECK(mismatches == 0);
}

TEST_CASE("save: the demo's byte-level tokenizer and a small file with a shadowed vocabulary entry round-trip") {
  const std::vector<std::string> texts = {"",
                                          "Answer with <think> then <answer>.",
                                          "<|im_start|>user\n12 + 30 = ?<|im_end|>\n",
                                          "  two  spaces\t\ttabs\n\n",
                                          "caf\xc3\xa9 \xe2\x82\xac 3\xc2\xbd",
                                          "cafe\xcc\x81",
                                          "bad \xff\xfe bytes",
                                          "<|endoftext|><|im_end|>",
                                          "ab  ab   abab"};
  TempDir dir;
  for (const bool nfc : {false, true}) {
    CAPTURE(nfc);
    const Tokenizer bytes = Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
                                                  {.chat_template = "{{ messages }}", .nfc = nfc});
    bytes.save(dir.path());
    check_same_tokenizer(bytes, Tokenizer::from_directory(dir.path()), texts);
    const json config = json::parse(std::ifstream(dir.path() / "tokenizer_config.json"));
    CHECK(config.at("tokenizer_class") == (nfc ? "Qwen2Tokenizer" : "PreTrainedTokenizerFast"));
    // NFC composes e + U+0301 into one code point (two bytes), as Qwen2.5's tokenizer does.
    CHECK(bytes.encode("e\xCC\x81").size() == (nfc ? 2 : 3));
  }

  // "ĠĠ" (id 256) is both a vocabulary token, the result of a merge, and an added token's content at the same id.
  TempDir shadowed;
  json file = minimal_tokenizer_json();
  file["added_tokens"].push_back({{"id", 256}, {"content", "ĠĠ"}, {"special", false}});
  shadowed.write("tokenizer.json", file.dump());
  const Tokenizer original = Tokenizer::from_directory(shadowed.path());
  TempDir copy;
  original.save(copy.path());
  const json written = json::parse(std::ifstream(copy.path() / "tokenizer.json"));
  CHECK(written.at("model").at("vocab").at("ĠĠ") == 256);
  check_same_tokenizer(original, Tokenizer::from_directory(copy.path()), texts);
}

TEST_CASE("tokenizer files: each defect gets a message naming the file, the place and a hint") {
  TempDir dir;
  const std::string file = (dir.path() / "tokenizer.json").string();
  const auto load = [&] { return Tokenizer::from_directory(dir.path()); };
  const auto write = [&](const json& root) { dir.write("tokenizer.json", root.dump()); };

  CHECK_THROWS_WITH_AS(Tokenizer::from_directory(dir.path() / "absent"), doctest::Contains("not a directory"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains((file + ": cannot open the file (hint:").c_str()), std::runtime_error);

  const std::string full = minimal_tokenizer_json().dump();
  dir.write("tokenizer.json", full.substr(0, full.size() / 2));
  CHECK_THROWS_WITH_AS(load(), doctest::Contains((file + ": not valid JSON at byte").c_str()), std::runtime_error);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("cut short"), std::runtime_error);

  json root = minimal_tokenizer_json();
  root["model"].erase("merges");
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains((file + ": missing \"model.merges\"").c_str()), std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"].erase("vocab");
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("missing \"model.vocab\""), std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"]["type"] = "WordPiece";
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("model.type is \"WordPiece\", but only byte-level \"BPE\""),
                       std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"]["merges"].push_back(json::array({"zz", "a"}));
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("model.merges[2] [\"zz\",\"a\"] needs \"zz\", which is not in"),
                       std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"]["merges"].push_back("b c");  // both pieces exist, but "bc" does not
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("model.merges[2] \"b c\" needs \"bc\""), std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"]["merges"].push_back(42);
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("model.merges[2] is 42"), std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"]["vocab"].erase("Ā");
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("lacks the byte-level token \"Ā\" for byte 0"), std::runtime_error);

  root = minimal_tokenizer_json();
  root["model"]["vocab"]["zz"] = 3;
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("gives id 3 to both"), std::runtime_error);

  root = minimal_tokenizer_json();
  root["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("the split pattern does not compile at offset"), std::runtime_error);
  root["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\s+|[^\S\p{L}]+)";
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("\\S inside a character class at offset 6"), std::runtime_error);

  root = minimal_tokenizer_json();
  root["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 5;
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains((file + ": \"pre_tokenizer.behavior\" must be a string").c_str()),
                       std::runtime_error);

  root = minimal_tokenizer_json();
  root["normalizer"] = {{"type", "Lowercase"}};
  write(root);
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("normalizer type \"Lowercase\" is not supported"), std::runtime_error);

  write(minimal_tokenizer_json());
  dir.write("tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  CHECK_THROWS_WITH_AS(load(),
                       doctest::Contains("tokenizer_config.json: \"eos_token\" is \"<|im_end|>\", which is not"),
                       std::runtime_error);
  dir.write("tokenizer_config.json", R"({"eos_token": )");
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("tokenizer_config.json: not valid JSON at byte 15"),
                       std::runtime_error);
}
