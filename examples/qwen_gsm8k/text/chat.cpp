// The Qwen2.5 chat template, rendered by hand: see chat.hpp. Each branch below names the template line it mirrors.
#include "qwen_gsm8k/text/chat.hpp"

#include <dapo/core/error.hpp>

namespace qwen {

std::string_view qwen25_chat_template() {
  return "{%- if messages[0]['role'] == 'system' %}"
         "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
         "{%- else %}"
         "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' "
         "}}"
         "{%- endif %}"
         "{%- for message in messages %}"
         "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
         "(message.role == \"assistant\") %}"
         "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
         "{%- endif %}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}"
         "{{- '<|im_start|>assistant\\n' }}"
         "{%- endif %}";
}

std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  DAPO_REQUIRE(!messages.empty(), "qwen::render_chat", "messages is empty; a conversation needs at least one message");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    DAPO_REQUIRE(role == "system" || role == "user" || role == "assistant", "qwen::render_chat", "messages[", i,
                 "].role is \"", role, "\"; expected \"system\", \"user\" or \"assistant\"");
  }
  const auto turn = [](std::string_view role, std::string_view content) {
    std::string text = "<|im_start|>";
    text.append(role).append("\n").append(content).append("<|im_end|>\n");
    return text;
  };
  // {%- if messages[0]['role'] == 'system' %} ... {%- else %} default system message {%- endif %}
  std::string text =
      messages[0].role == "system" ? turn("system", messages[0].content) : turn("system", kQwenDefaultSystemPrompt);
  // {%- for message in messages %}: user, assistant, and system messages after the first (the first was emitted).
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "system" && i == 0) continue;
    text += turn(messages[i].role, messages[i].content);
  }
  if (add_generation_prompt) text += "<|im_start|>assistant\n";
  return text;
}

}  // namespace qwen
