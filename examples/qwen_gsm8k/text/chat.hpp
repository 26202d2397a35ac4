// The Qwen2.5 chat format: turns a conversation into the prompt text that tokenizer_config.json's chat template
// produces. Not a Jinja engine: the Qwen2.5 template (without its tools branch) is hard-coded here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qwen {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The system message Qwen2.5 injects when the conversation does not start with one.
inline constexpr std::string_view kQwenDefaultSystemPrompt =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// The Jinja source that render_chat implements, character for character as Qwen2.5's tokenizer_config.json has it.
// A caller can compare a tokenizer's chat_template() with it to know whether render_chat is the right renderer.
std::string_view qwen25_chat_template();

// <|im_start|>{role}\n{content}<|im_end|>\n for each message, after the default system message when messages[0] is
// not a system message, then <|im_start|>assistant\n when add_generation_prompt. Throws std::invalid_argument for
// an empty conversation or a role other than system/user/assistant (the template would silently drop it).
std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace qwen
