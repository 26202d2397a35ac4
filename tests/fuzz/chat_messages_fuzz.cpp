// Fuzz target: the `tokenize` command's input lines (a JSON string, or {"messages": [...], "add_generation_prompt"}),
// and the chat renderer behind it. Malformed lines must be reported on the error stream, never crash the command;
// for conversations it accepts, the built-in renderer must agree byte for byte with the Jinja template it implements.
#include <nlohmann/json.hpp>

#include <sstream>
#include <vector>

#include "fuzz_support.hpp"
#include "qwen_gsm8k/text/chat.hpp"
#include "qwen_gsm8k/text/chat_template.hpp"
#include "qwen_gsm8k/text/tokenize_command.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)dapo::fuzz::fuzz_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text = dapo::fuzz::as_text(data, size);
  std::istringstream in{std::string(text)};
  std::ostringstream out, err;
  (void)qwen::run_tokenize(dapo::fuzz::fuzz_tokenizer(), in, out, err);

  // Differential: render_chat against the Jinja source it hard-codes, on the conversations render_chat accepts.
  static const qwen::jinja::Template chat_template(qwen::qwen25_chat_template());
  const nlohmann::json line = nlohmann::json::parse(text, nullptr, false);
  if (!line.is_object() || !line.contains("messages") || !line.at("messages").is_array()) return 0;
  std::vector<qwen::ChatMessage> messages;
  for (const auto& message : line.at("messages")) {
    if (!message.is_object() || !message.contains("role") || !message.contains("content") ||
        !message.at("role").is_string() || !message.at("content").is_string()) {
      return 0;
    }
    messages.push_back({message.at("role").get<std::string>(), message.at("content").get<std::string>()});
  }
  const bool add_generation_prompt = line.value("add_generation_prompt", false);
  std::string built_in;
  try {
    built_in = qwen::render_chat(messages, add_generation_prompt);
  } catch (const std::invalid_argument&) {
    return 0;  // an empty conversation or an unknown role: refused, and run_tokenize reported it
  }
  const std::string jinja =
      qwen::render_chat_template(chat_template, qwen::jinja::Json::object(), messages, add_generation_prompt);
  if (jinja != built_in) dapo::fuzz::finding("render_chat and the Qwen2.5 Jinja template disagree");
  return 0;
}
