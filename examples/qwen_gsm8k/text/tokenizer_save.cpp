// Tokenizer::save: a tokenizer's tables written back as the tokenizer.json and tokenizer_config.json of Hugging Face's
// save_pretrained (tokenizers' BPE model, a Split + ByteLevel pre-tokenizer, the ByteLevel decoder), which
// from_directory and transformers' AutoTokenizer read back as the same tokenizer. The demo's checkpoints carry them.
#include <nlohmann/json.hpp>

#include <string>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/text/tokenizer_impl.hpp"

namespace qwen {
namespace {

using ordered_json = nlohmann::ordered_json;

// The ByteLevel step without its own regex: the splits before it are written as Split steps.
ordered_json byte_level_step() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

ordered_json added_token_fields(const AddedToken& token) {
  return {{"content", token.content}, {"lstrip", token.lstrip},           {"normalized", token.normalized},
          {"rstrip", token.rstrip},   {"single_word", token.single_word}, {"special", token.special}};
}

}  // namespace

const std::string& Tokenizer::Impl::vocab_spelling(int32_t id) const {
  for (const auto& [spelling, shadowed_id] : shadowed_vocab) {
    if (shadowed_id == id) return spelling;
  }
  return tokens[id];
}

ordered_json Tokenizer::Impl::tokenizer_json() const {
  ordered_json added_list = ordered_json::array();
  for (const AddedToken& token : added) {
    ordered_json entry = {{"id", token.id}};
    entry.update(added_token_fields(token));
    added_list.push_back(std::move(entry));
  }
  ordered_json steps = ordered_json::array();
  for (const SplitSource& split : split_sources) {
    steps.push_back({{"type", "Split"},
                     {"pattern", {{split.literal ? "String" : "Regex", split.pattern}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
  }
  steps.push_back(byte_level_step());
  ordered_json vocab = ordered_json::object();
  for (std::size_t id = 0; id < kinds.size(); ++id) {
    if (kinds[id] == TokenKind::kModel) vocab[tokens[id]] = id;
  }
  for (const auto& [spelling, id] : shadowed_vocab) vocab[spelling] = id;
  ordered_json merge_list = ordered_json::array();
  for (const auto& [left, right] : merge_pairs) merge_list.push_back({vocab_spelling(left), vocab_spelling(right)});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added_list)},
          {"normalizer", nfc ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr)},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}}},
          {"post_processor", byte_level_step()},
          {"decoder", byte_level_step()},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merge_list)}}}};
}

ordered_json Tokenizer::Impl::config_json() const {
  ordered_json decoder = ordered_json::object();
  for (const AddedToken& token : added) decoder[std::to_string(token.id)] = added_token_fields(token);
  const bool qwen_like = nfc && split_sources.size() == 1 && !split_sources[0].literal &&
                         split_sources[0].pattern == detail::kQwen2SplitPattern;
  const auto name = [&](const std::optional<int32_t>& id) { return id ? ordered_json(tokens[*id]) : ordered_json(); };
  ordered_json config = {{"add_prefix_space", false},
                         {"added_tokens_decoder", std::move(decoder)},
                         {"bos_token", nullptr},
                         {"clean_up_tokenization_spaces", false},
                         {"eos_token", name(eos)},
                         {"errors", "replace"},
                         {"pad_token", name(pad)},
                         {"split_special_tokens", false},
                         {"tokenizer_class", qwen_like ? "Qwen2Tokenizer" : "PreTrainedTokenizerFast"},
                         {"unk_token", nullptr}};
  if (!chat_template.empty()) config["chat_template"] = chat_template;
  return config;
}

void Tokenizer::save(const std::filesystem::path& dir) const {
  write_file_atomically(dir / "tokenizer.json", impl_->tokenizer_json().dump(2) + "\n");
  write_file_atomically(dir / "tokenizer_config.json", impl_->config_json().dump(2) + "\n");
}

}  // namespace qwen
