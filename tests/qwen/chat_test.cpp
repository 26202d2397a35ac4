// qwen::render_chat: the 22 golden conversations (text and token ids), the committed cases on which our chat path once
// disagreed with transformers, hand cases of the template's branches, and the rejection of what the template cannot
// render.
#include "qwen_gsm8k/text/chat.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/text/chat_template.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "support/shared.hpp"

namespace {

using nlohmann::json;
using qwen::ChatMessage;
using qwen::render_chat;

std::vector<ChatMessage> messages_of(const json& value) {
  std::vector<ChatMessage> messages;
  for (const json& message : value) messages.push_back({message.at("role"), message.at("content")});
  return messages;
}

}  // namespace

TEST_CASE("render_chat reproduces every golden conversation, text and ids") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer");
  if (!shared) return;
  const auto fixtures = *shared / "fixtures" / "tokenizer";
  const auto tokenizer = qwen::Tokenizer::from_directory(fixtures / "qwen2.5");
  // render_chat hard-codes this template; if a checkpoint's differs, it is not the right renderer.
  CHECK(tokenizer.chat_template() == qwen::qwen25_chat_template());

  std::ifstream in(fixtures / "golden_chat.json");
  REQUIRE(in.good());
  const json golden = json::parse(in);
  REQUIRE(golden.size() == 22);
  for (std::size_t i = 0; i < golden.size(); ++i) {
    const json& item = golden[i];
    CAPTURE(i);
    const std::string text = render_chat(messages_of(item.at("messages")), item.at("add_generation_prompt"));
    CHECK(text == item.at("text").get<std::string>());
    CHECK(tokenizer.encode(text) == item.at("ids").get<std::vector<int32_t>>());
  }
}

// tests/fixtures/chat_regressions.json: conversations that tests/transformers/chat_test.cpp once found rendered or
// tokenized differently from transformers' apply_chat_template (see the file's description).
TEST_CASE("render_chat, the Jinja subset and encode reproduce the committed transformers regression cases") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!shared) return;
  const auto dir = *shared / "fixtures" / "tokenizer" / "qwen2.5";
  const auto tokenizer = qwen::Tokenizer::from_directory(dir);
  const auto file = qwen::read_chat_template(dir);
  REQUIRE(file.has_value());
  const qwen::jinja::Template chat_template(file->source);
  std::ifstream in(std::filesystem::path(DAPO_SOURCE_DIR) / "tests" / "fixtures" / "chat_regressions.json");
  REQUIRE(in.good());
  const json regressions = json::parse(in);
  REQUIRE_FALSE(regressions.at("cases").empty());
  REQUIRE_FALSE(regressions.at("known_differences").empty());

  // Both renderings must give transformers' text; the token ids checked are `ids_field`'s.
  const auto check = [&](const json& item, const char* ids_field) {
    CAPTURE(item.at("description").get<std::string>());
    const auto messages = messages_of(item.at("messages"));
    const bool add_generation_prompt = item.at("add_generation_prompt");
    const auto text = item.at("text").get<std::string>();
    CHECK(render_chat(messages, add_generation_prompt) == text);
    CHECK(qwen::render_chat_template(chat_template, file->special_tokens, messages, add_generation_prompt) == text);
    CHECK(tokenizer.encode(text) == item.at(ids_field).get<std::vector<int32_t>>());
  };
  for (const json& item : regressions.at("cases")) check(item, "ids");
  // tokenizers' NFC is Unicode 9.0's: we give the ids of Unicode's NFC (nfc_ids), which really differ from theirs.
  for (const json& item : regressions.at("known_differences")) {
    check(item, "nfc_ids");
    CHECK(item.at("nfc_ids") != item.at("ids"));
  }
}

TEST_CASE("render_chat: the template's branches") {
  // A first system message replaces the default one.
  CHECK(render_chat({{"system", "S"}, {"user", "U"}}, true) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  // Without one, Qwen's default system message is injected.
  CHECK(render_chat({{"user", "U"}}, false) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nU<|im_end|>\n");
  // A later system message is rendered in place; assistant turns are rendered; no generation prompt when not asked.
  CHECK(render_chat({{"system", "A"}, {"user", "U"}, {"assistant", "R"}, {"system", "B"}}, false) ==
        "<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nR<|im_end|>\n"
        "<|im_start|>system\nB<|im_end|>\n");
  // Content is inserted verbatim, special-token text included.
  CHECK(render_chat({{"system", ""}, {"user", "<|im_end|>\n"}}, false) ==
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_end|>\n");
}

TEST_CASE("render_chat rejects unknown roles and empty conversations") {
  CHECK_THROWS_WITH_AS(
      render_chat({{"user", "U"}, {"tool", "42"}}, true),
      doctest::Contains("messages[1].role is \"tool\"; expected \"system\", \"user\" or \"assistant\""),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(render_chat({{"User", "U"}}, true), doctest::Contains("messages[0].role is \"User\""),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(render_chat({}, true), doctest::Contains("messages is empty"), std::invalid_argument);
}
