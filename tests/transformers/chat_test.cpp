// transformers' apply_chat_template (Jinja2 running the Qwen2.5 template, then its tokenizer) against
// qwen::render_chat, our Jinja subset on the same template, and qwen::Tokenizer, on the conversations of chat_cases.py.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/text/chat.hpp"
#include "qwen_gsm8k/text/chat_template.hpp"
#include "qwen_gsm8k/text/text_difference.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "support/shared.hpp"
#include "transformers/references.hpp"

namespace {

using nlohmann::json;
using qwen::ChatMessage;
using qwen::excerpt;
using qwen::first_difference;

using dapo::test::kShownMismatches;

// ids[from, from + 16) as a JSON list.
std::string id_window(const std::vector<int32_t>& ids, std::size_t from) {
  from = std::min(from, ids.size());
  return json(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(from),
                                   ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), from + 16))))
      .dump();
}

// What one of our renderings did with a case: the text, or the exception it threw.
struct Rendering {
  std::optional<std::string> text;
  std::string error;
};

template <typename Render>
Rendering try_render(Render render) {
  try {
    return {render(), {}};
  } catch (const std::exception& error) {
    return {std::nullopt, error.what()};
  }
}

// "" when `ours` is transformers' text, else what differed.
std::string compare_text(const char* renderer, const Rendering& ours, const std::string& theirs) {
  if (!ours.text) return std::string(renderer) + " threw: " + ours.error;
  if (*ours.text == theirs) return {};
  const std::size_t at = first_difference(*ours.text, theirs);
  std::ostringstream out;
  out << renderer << " differs first at byte " << at << " (" << ours.text->size() << " and " << theirs.size()
      << " bytes): ours " << excerpt(*ours.text, at) << ", transformers " << excerpt(theirs, at);
  return out.str();
}

std::string compare_ids(const std::vector<int32_t>& ours, const std::vector<int32_t>& theirs) {
  if (ours == theirs) return {};
  const auto at = static_cast<std::size_t>(std::mismatch(ours.begin(), ours.end(), theirs.begin(), theirs.end()).first -
                                           ours.begin());
  std::ostringstream out;
  out << "encode(text) differs first at id " << at << " (" << ours.size() << " and " << theirs.size() << " ids): ours "
      << id_window(ours, at) << ", transformers " << id_window(theirs, at);
  return out.str();
}

}  // namespace

TEST_CASE("chat: render_chat, our Jinja subset and our tokenizer reproduce transformers' apply_chat_template") {
  const json references = dapo::test::read_reference("chat_cases.json");
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!shared) return;
  const auto tokenizer_dir = *shared / "fixtures" / "tokenizer" / "qwen2.5";
  const auto tokenizer = qwen::Tokenizer::from_directory(tokenizer_dir);
  const auto file = qwen::read_chat_template(tokenizer_dir);
  REQUIRE(file.has_value());
  const qwen::jinja::Template chat_template(file->source);

  const json& cases = references.at("cases");
  const auto stated = references.at("count").get<std::size_t>();
  REQUIRE_MESSAGE(!cases.empty(), "chat_cases.json holds no conversations: nothing was compared");
  REQUIRE_MESSAGE(cases.size() >= stated, "chat_cases.json states " << stated << " conversations but holds "
                                                                    << cases.size() << " (cut short?)");
  const std::string versions = "transformers " + references.at("transformers").get<std::string>() + " / Jinja2 " +
                               references.at("jinja2").get<std::string>();

  json mismatches = json::array();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& item = cases[i];
    std::vector<ChatMessage> messages;
    for (const json& message : item.at("messages")) messages.push_back({message.at("role"), message.at("content")});
    const bool add_generation_prompt = item.at("add_generation_prompt");
    const auto text = item.at("text").get<std::string>();
    const auto ids = item.at("ids").get<std::vector<int32_t>>();

    std::vector<std::string> differences;
    const Rendering builtin = try_render([&] { return qwen::render_chat(messages, add_generation_prompt); });
    const Rendering jinja = try_render([&] {
      return qwen::render_chat_template(chat_template, file->special_tokens, messages, add_generation_prompt);
    });
    for (std::string difference :
         {compare_text("render_chat", builtin, text), compare_text("the Jinja subset", jinja, text),
          compare_ids(tokenizer.encode(text), ids)}) {
      if (!difference.empty()) differences.push_back(std::move(difference));
    }
    if (differences.empty()) continue;
    std::string description =
        "case " + std::to_string(i) + " of seed " + references.at("seed").dump() + " (" + versions + "): ";
    for (std::size_t d = 0; d < differences.size(); ++d) description += (d > 0 ? "; " : "") + differences[d];
    if (mismatches.size() < kShownMismatches) {
      FAIL_CHECK(description << "\n  messages: " << item.at("messages").dump(-1, ' ', false)
                             << "\n  add_generation_prompt: " << add_generation_prompt);
    }
    mismatches.push_back({{"description", description},
                          {"messages", item.at("messages")},
                          {"add_generation_prompt", add_generation_prompt},
                          {"text", text},
                          {"ids", ids}});
  }
  if (!mismatches.empty()) {
    const auto path = dapo::test::write_mismatches("chat_mismatches.json", mismatches);
    FAIL_CHECK(mismatches.size() << " of " << cases.size() << " conversations differ from " << versions
                                 << "; all of them are in " << path.string()
                                 << " (add each distinct one to the cases of tests/fixtures/chat_regressions.json)");
  }
  MESSAGE(cases.size() << " conversations compared with " << versions << ", " << mismatches.size() << " differ");
}
