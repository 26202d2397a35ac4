// Checking a model directory's own chat template against the built-in ChatML renderer (chat.hpp): the driver renders
// prompts with render_chat, which is right for Qwen2.5 only, so a Qwen2-architecture checkpoint with another template
// would silently be trained on prompts it was never shown. Not a renderer for other formats: a template that differs
// is reported, never used.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/text/chat.hpp"
#include "qwen_gsm8k/text/jinja/jinja.hpp"

namespace qwen {

// What `--chat-template builtin` tells the user in every error of this check.
inline constexpr const char* kChatTemplateOverrideHint =
    "pass --chat-template builtin to use the built-in ChatML renderer anyway";

// A model directory's chat template as transformers finds it: chat_template.jinja when present (transformers 5
// writes it, and it takes priority), else tokenizer_config.json's "chat_template" (a string, or a list of
// {"name", "template"} of which "default" is used). `special_tokens` holds the strings apply_chat_template passes
// along (bos_token, eos_token, unk_token, pad_token, additional_special_tokens) from tokenizer_config.json, or
// special_tokens_map.json for those it lacks.
struct ChatTemplateFile {
  std::filesystem::path path;
  std::string source;
  jinja::Json special_tokens = jinja::Json::object();
};

// The directory's template, or nothing when it has none. A path that is not a directory, and unreadable or malformed
// files, throw std::runtime_error naming the path or file, the place and a hint.
std::optional<ChatTemplateFile> read_chat_template(const std::filesystem::path& model_dir);

// `messages` rendered by `chat_template` with the variables apply_chat_template gives it: messages,
// add_generation_prompt, tools and documents (None) and the special tokens. Throws jinja::TemplateError.
std::string render_chat_template(const jinja::Template& chat_template, const jinja::Json& special_tokens,
                                 const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// Renders the conversations the driver produces (each starts with a system message; see chat_template.cpp) with the
// directory's template and with render_chat, and throws std::runtime_error at the first difference, naming the file,
// the conversation and both renderings around the first differing byte. A template the Jinja subset cannot run
// throws naming the construct and its place. Both carry kChatTemplateOverrideHint. A directory without a template
// passes: there is nothing to disagree with, and render_chat is then the only format on offer.
void check_chat_template(const std::filesystem::path& model_dir);

}  // namespace qwen
