// check_chat_template: a model directory's chat template against render_chat, on the conversations the driver
// renders. See chat_template.hpp.
#include "qwen_gsm8k/text/chat_template.hpp"

#include <dapo/core/error.hpp>
#include <dapo/core/utf8.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "qwen_gsm8k/common/json_error.hpp"
#include "qwen_gsm8k/text/text_difference.hpp"

namespace qwen {
namespace {

namespace fs = std::filesystem;
using dapo::concat;
using jinja::Json;

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  const char* separator = !problem.empty() && problem.back() == '\n' ? "" : " ";
  throw std::runtime_error(concat(path.string(), ": ", problem, separator, "(hint: ", kChatTemplateOverrideHint, ")"));
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (std::size_t at = 0; at < text.size();) {
    const auto sequence = dapo::utf8::decode(text, at);
    if (!sequence.valid) fail(path, concat("invalid UTF-8 at byte ", at));
    at += sequence.length;
  }
  return text;
}

Json read_json(const fs::path& path) {
  const std::string text = read_text(path);
  try {
    return Json::parse(text);
  } catch (const Json::exception& error) {
    fail(path, concat("not valid JSON ", json_error_where(error), " of ", text.size(), ": ", error.what()));
  }
}

// tokenizer_config.json's "chat_template": a string, or [{"name": "default", "template": ...}, ...].
std::optional<std::string> config_template(const Json& config, const fs::path& path) {
  if (!config.contains("chat_template") || config.at("chat_template").is_null()) return std::nullopt;
  const Json& templates = config.at("chat_template");
  if (templates.is_string()) return templates.get<std::string>();
  if (!templates.is_array()) fail(path, "\"chat_template\" must be a string or a list of {\"name\", \"template\"}");
  for (const Json& named : templates) {
    if (named.is_object() && named.contains("name") && named.at("name") == "default" && named.contains("template") &&
        named.at("template").is_string()) {
      return named.at("template").get<std::string>();
    }
  }
  fail(path,
       "\"chat_template\" is a list of named templates without one named \"default\", so transformers has no "
       "template to apply either");
}

// The special tokens of a tokenizer config (a string or {"content": ...} each) that are not in `tokens` yet.
void add_special_tokens(const Json& config, Json& tokens) {
  if (!config.is_object()) return;
  const auto content = [](const Json& token) -> std::optional<std::string> {
    if (token.is_string()) return token.get<std::string>();
    if (token.is_object() && token.contains("content") && token.at("content").is_string()) {
      return token.at("content").get<std::string>();
    }
    return std::nullopt;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (tokens.contains(key) || !config.contains(key)) continue;
    if (const auto text = content(config.at(key))) tokens[key] = *text;
  }
  if (!tokens.contains("additional_special_tokens") && config.contains("additional_special_tokens") &&
      config.at("additional_special_tokens").is_array()) {
    Json list = Json::array();
    for (const Json& token : config.at("additional_special_tokens")) {
      if (const auto text = content(token)) list.push_back(*text);
    }
    tokens["additional_special_tokens"] = std::move(list);
  }
}

// A conversation the check renders both ways.
struct Conversation {
  const char* name;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
};

// The driver's prompts are {system, user} with a generation prompt (train/rollout.cpp's prompt_ids; --system-prompt
// "" still sends an empty system message), so every conversation here starts with a system message. A user-only
// conversation is left out on purpose: templates differ in the default system message they inject (Qwen2's "You are
// a helpful assistant.", Qwen2.5's "You are Qwen, ..."), which the driver never renders, and failing on it would
// refuse checkpoints whose training prompts are identical. The system prompt keeps the seed's leading and trailing
// newlines so that a template that trims content (as Llama 3's does) shows up; the multi-turn and no-generation-
// prompt cases cover the rest of what render_chat promises.
std::vector<Conversation> driver_conversations() {
  const std::string system =
      "\nAnswer in this format (\xE6\x8C\x89\xE7\x85\xA7\xE5\xA6\x82\xE4\xB8\x8B\xE6\xA0\xBC\xE5\xBC\x8F):\n<think>\n"
      "your reasoning\n</think>\n<answer>\nyour answer\n</answer>\n";
  const std::string question =
      "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
      "did Natalia sell altogether in April and May?";
  const std::string reply = "<think>\n48 / 2 = 24 in May, 48 + 24 = 72.\n</think>\n<answer>\n72\n</answer>\n";
  const std::string follow_up = "And if she sold 10 more in June than in May?";
  return {
      {"system + user, with the generation prompt (the driver's prompt)",
       {{"system", system}, {"user", question}},
       true},
      {"empty system prompt + user, with the generation prompt", {{"system", ""}, {"user", question}}, true},
      {"system + user, without the generation prompt", {{"system", system}, {"user", question}}, false},
      {"system + user + assistant reply, without the generation prompt",
       {{"system", system}, {"user", question}, {"assistant", reply}},
       false},
      {"system + user + assistant + user, with the generation prompt",
       {{"system", system}, {"user", question}, {"assistant", reply}, {"user", follow_up}},
       true},
  };
}

std::string describe(const ChatTemplateFile& file) {
  return file.path.filename() == "tokenizer_config.json" ? "its \"chat_template\"" : "the template";
}

}  // namespace

std::optional<ChatTemplateFile> read_chat_template(const fs::path& model_dir) {
  if (!fs::is_directory(model_dir)) {  // not "no template": a mistyped path must not pass the check
    throw std::runtime_error(concat(model_dir.string(),
                                    ": not a directory (hint: pass the model directory, which holds "
                                    "config.json and tokenizer_config.json)"));
  }
  ChatTemplateFile file;
  const fs::path config_path = model_dir / "tokenizer_config.json";
  const fs::path jinja_path = model_dir / "chat_template.jinja";
  Json config = Json::object();
  if (fs::exists(config_path)) {
    config = read_json(config_path);
    if (!config.is_object()) fail(config_path, "the top level must be a JSON object");
  }
  if (fs::exists(jinja_path)) {
    file.path = jinja_path;
    file.source = read_text(jinja_path);
  } else if (auto source = config_template(config, config_path)) {
    file.path = config_path;
    file.source = std::move(*source);
  } else {
    return std::nullopt;
  }
  add_special_tokens(config, file.special_tokens);
  const fs::path map_path = model_dir / "special_tokens_map.json";
  if (fs::exists(map_path)) add_special_tokens(read_json(map_path), file.special_tokens);
  return file;
}

std::string render_chat_template(const jinja::Template& chat_template, const Json& special_tokens,
                                 const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  Json variables = special_tokens;
  Json list = Json::array();
  for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
  variables["messages"] = std::move(list);
  variables["add_generation_prompt"] = add_generation_prompt;
  variables["tools"] = nullptr;
  variables["documents"] = nullptr;
  return chat_template.render(variables);
}

void check_chat_template(const fs::path& model_dir) {
  const auto file = read_chat_template(model_dir);
  if (!file) return;  // no template: nothing to compare render_chat with (see the header)
  std::optional<jinja::Template> chat_template;
  try {
    chat_template.emplace(file->source);
  } catch (const jinja::TemplateError& error) {
    fail(file->path, concat("the built-in Jinja subset cannot run ", describe(*file), ": ", error.what()));
  }
  for (const Conversation& conversation : driver_conversations()) {
    std::string rendered;
    try {
      rendered = render_chat_template(*chat_template, file->special_tokens, conversation.messages,
                                      conversation.add_generation_prompt);
    } catch (const jinja::TemplateError& error) {
      fail(file->path, concat("rendering the conversation \"", conversation.name, "\" with ", describe(*file),
                              " failed: ", error.what()));
    }
    const std::string builtin = render_chat(conversation.messages, conversation.add_generation_prompt);
    if (rendered == builtin) continue;
    const std::size_t at = first_difference(rendered, builtin);
    fail(file->path, concat(describe(*file), " renders the conversation \"", conversation.name,
                            "\" differently from the built-in ChatML renderer, first at byte ", at, " (",
                            rendered.size(), " and ", builtin.size(), " bytes):\n  template: ", excerpt(rendered, at),
                            "\n  built-in: ", excerpt(builtin, at), "\n"));
  }
}

}  // namespace qwen
