// Fuzz target: the Jinja subset that reads a model's chat template (tokenizer_config.json's "chat_template" comes with
// the model, from whoever published it). A template it cannot parse or render must be refused with TemplateError,
// and rendering must end: a template may not make the renderer loop or allocate without bound.
#include "fuzz_support.hpp"
#include "qwen_gsm8k/text/chat_template.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::vector<qwen::ChatMessage> messages = {
      {"system", "You are a helpful assistant."}, {"user", "What is 2 + 3?"}, {"assistant", "5"}};
  qwen::jinja::Json special_tokens = {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
  try {
    const qwen::jinja::Template chat_template(dapo::fuzz::as_text(data, size));
    (void)qwen::render_chat_template(chat_template, special_tokens, messages, true);
  } catch (const qwen::jinja::TemplateError&) {
    // refused, with the construct and its place
  }
  return 0;
}
