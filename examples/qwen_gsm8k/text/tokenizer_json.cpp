// Tokenizer::from_directory: tokenizer.json (model, normalizer, pre-tokenizer, decoder, added tokens) and
// tokenizer_config.json (chat template, eos and pad), each field checked, every error naming the file, the entry and
// a hint. Only the byte-level BPE subset that Qwen2.5 and GPT-2 use is accepted; anything else is refused by name.
#include <nlohmann/json.hpp>

#include <dapo/core/error.hpp>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "qwen_gsm8k/common/json_error.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/text/tokenizer_impl.hpp"

namespace qwen {
namespace {

namespace fs = std::filesystem;
using dapo::concat;
using detail::kMaxTokenId;
using detail::TokenKind;
using nlohmann::json;

std::string hint_for(const fs::path& path) {
  return path.filename() == "tokenizer_config.json"
             ? "hint: tokenizer_config.json is optional; fix or delete it"
             : "hint: pass the directory of a Hugging Face byte-level BPE tokenizer, such as a Qwen2.5 checkpoint, "
               "and download tokenizer.json again if it was cut short";
}

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw std::runtime_error(concat(path.string(), ": ", problem, " (", hint_for(path), ")"));
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return json::parse(text);
  } catch (const json::exception& error) {
    fail(path, concat("not valid JSON ", json_error_where(error), " of ", text.size(), ": ", error.what()));
  }
}

// A JSON field that must exist and have the right kind; `name` is its dotted path for the message. (A string_view, not
// a const std::string&: g++ 14 takes a temporary name bound to a reference as a sign that the result dangles.)
const json& require_field(const json& object, const char* key, std::string_view name, const fs::path& path) {
  if (!object.is_object() || !object.contains(key)) fail(path, concat("missing \"", name, "\""));
  return object.at(key);
}

std::string string_field(const json& object, const char* key, const std::string& name, const fs::path& path) {
  const json& value = require_field(object, key, name, path);
  if (!value.is_string()) fail(path, concat("\"", name, "\" must be a string, not ", value.type_name()));
  return value.get<std::string>();
}

bool bool_field(const json& object, const char* key, bool fallback, const std::string& name, const fs::path& path) {
  if (!object.contains(key) || object.at(key).is_null()) return fallback;
  if (!object.at(key).is_boolean()) fail(path, concat("\"", name, ".", key, "\" must be true or false"));
  return object.at(key).get<bool>();
}

// tokenizer_config.json names tokens either as "<|im_end|>" or as {"content": "<|im_end|>", ...}.
std::optional<std::string> config_token_name(const json& config, const char* key, const fs::path& path) {
  if (!config.contains(key) || config.at(key).is_null()) return std::nullopt;
  const json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  fail(path, concat("\"", key, "\" must be a token string or an object with a \"content\" string"));
}

AddedToken load_added_token(const json& entry, const std::string& name, const fs::path& path) {
  AddedToken token;
  token.content = string_field(entry, "content", name + ".content", path);
  const json& id = require_field(entry, "id", name + ".id", path);
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
    fail(path, concat(name, ".id is ", id.dump(), "; ids must be integers in [0, ", kMaxTokenId, "]"));
  }
  if (token.content.empty()) fail(path, concat(name, ".content is empty"));
  token.id = static_cast<int32_t>(id.get<int64_t>());
  token.special = bool_field(entry, "special", false, name, path);
  token.lstrip = bool_field(entry, "lstrip", false, name, path);
  token.rstrip = bool_field(entry, "rstrip", false, name, path);
  token.single_word = bool_field(entry, "single_word", false, name, path);
  token.normalized = bool_field(entry, "normalized", !token.special, name, path);
  return token;
}

std::vector<AddedToken> load_added_tokens(const json& root, const fs::path& path) {
  std::vector<AddedToken> added;
  if (!root.contains("added_tokens") || root.at("added_tokens").is_null()) return added;
  const json& entries = root.at("added_tokens");
  if (!entries.is_array()) fail(path, "\"added_tokens\" must be an array");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    added.push_back(load_added_token(entries[i], concat("added_tokens[", i, "]"), path));
  }
  return added;
}

// Whether the text is NFC-normalised: no normalizer, NFC, or a Sequence of NFC steps are supported.
bool load_normalizer(const json& root, const fs::path& path) {
  if (!root.contains("normalizer") || root.at("normalizer").is_null()) return false;
  const json& normalizer = root.at("normalizer");
  const std::string type = string_field(normalizer, "type", "normalizer.type", path);
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const json& steps = require_field(normalizer, "normalizers", "normalizer.normalizers", path);
    bool nfc = false;
    for (const json& step : steps) {
      if (string_field(step, "type", "normalizer.normalizers[].type", path) != "NFC") {
        fail(path, concat("normalizer ", step.dump(), " is not supported (supported: none, NFC)"));
      }
      nfc = true;
    }
    return nfc;
  }
  fail(path, concat("normalizer type \"", type, "\" is not supported (supported: none, NFC)"));
}

// A merge as [left, right], or in the legacy "left right" form.
std::pair<std::string, std::string> merge_parts(const json& merge, std::size_t rank, const fs::path& path) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  if (merge.is_string() && merge.get<std::string>().find(' ') != std::string::npos) {
    const std::string text = merge.get<std::string>();
    const auto space = text.find(' ');
    return {text.substr(0, space), text.substr(space + 1)};
  }
  fail(path, concat("model.merges[", rank, "] is ", merge.dump(),
                    "; a merge is a pair [\"left\", \"right\"] or a string \"left right\""));
}

}  // namespace

void Tokenizer::Impl::load_model(const json& root, const fs::path& path) {
  const json& model = require_field(root, "model", "model", path);
  // Old files omit "type"; their merges say they are BPE.
  const std::string type = model.contains("type") ? string_field(model, "type", "model.type", path) : "BPE";
  if (type != "BPE") {
    fail(path, concat("model.type is \"", type, "\", but only byte-level \"BPE\" models are supported"));
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout") != 0.0) {
    fail(path, "model.dropout is set; BPE dropout is for training and is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "") {
      fail(path, concat("model.", key, " is set; byte-level BPE uses none and it is not supported"));
    }
  }
  ignore_merges = bool_field(model, "ignore_merges", false, "model", path);
  load_vocab(require_field(model, "vocab", "model.vocab", path), path);
  load_merges(require_field(model, "merges", "model.merges", path), path);
}

void Tokenizer::Impl::load_vocab(const json& vocab, const fs::path& path) {
  if (!vocab.is_object()) {
    fail(path, concat("\"model.vocab\" must be an object of token -> id, not ", vocab.type_name()));
  }
  ids.reserve(vocab.size() + 64);
  for (const auto& [token, id_value] : vocab.items()) {
    if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 || id_value.get<int64_t>() > kMaxTokenId) {
      fail(path, concat("model.vocab[\"", token, "\"] is ", id_value.dump(), "; ids must be integers in [0, ",
                        kMaxTokenId, "]"));
    }
    const auto id = static_cast<int32_t>(id_value.get<int64_t>());
    if (static_cast<std::size_t>(id) < kinds.size() && kinds[id] != TokenKind::kNone) {
      fail(path, concat("model.vocab gives id ", id, " to both \"", tokens[id], "\" and \"", token, "\""));
    }
    set_token(id, token, alphabet.bytes_of(token), TokenKind::kModel);
  }
}

void Tokenizer::Impl::load_merges(const json& merge_list, const fs::path& path) {
  if (!merge_list.is_array()) fail(path, concat("\"model.merges\" must be an array, not ", merge_list.type_name()));
  merges.reserve(merge_list.size());
  merge_pairs.reserve(merge_list.size());
  for (std::size_t rank = 0; rank < merge_list.size(); ++rank) {
    const json& merge = merge_list[rank];
    const auto [left, right] = merge_parts(merge, rank, path);
    const auto id_of_model_token = [&](const std::string& token) -> int32_t {
      const auto found = ids.find(token);
      if (found == ids.end()) {
        fail(path, concat("model.merges[", rank, "] ", merge.dump(), " needs \"", token,
                          "\", which is not in model.vocab (the merges do not belong to this vocabulary)"));
      }
      return found->second;
    };
    const int32_t left_id = id_of_model_token(left), right_id = id_of_model_token(right);
    const int32_t result = id_of_model_token(left + right);
    merges.add(left_id, right_id, static_cast<int32_t>(rank), result);
    merge_pairs.push_back({left_id, right_id});
  }
}

bool Tokenizer::Impl::load_pre_tokenizer_step(const json& step, const fs::path& path) {
  const std::string type = string_field(step, "type", "pre_tokenizer.type", path);
  if (type == "Split") {
    const json& pattern = require_field(step, "pattern", "pre_tokenizer.pattern", path);
    const std::string behavior =
        step.contains("behavior") ? string_field(step, "behavior", "pre_tokenizer.behavior", path) : "Isolated";
    if (behavior != "Isolated" || bool_field(step, "invert", false, "pre_tokenizer", path)) {
      fail(path, concat("Split pre-tokenizer with behavior \"", behavior,
                        "\" or invert is not supported (supported: Isolated, invert false)"));
    }
    if (pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      add_split(pattern.at("Regex").get<std::string>(), false, path.string());
    } else if (pattern.contains("String") && pattern.at("String").is_string()) {
      add_split(pattern.at("String").get<std::string>(), true, path.string());
    } else {
      fail(path, concat("Split pattern ", pattern.dump(), " must be {\"Regex\": ...} or {\"String\": ...}"));
    }
    return false;
  }
  if (type == "ByteLevel") {
    if (bool_field(step, "add_prefix_space", false, "pre_tokenizer", path)) {
      fail(path, "ByteLevel add_prefix_space = true is not supported");
    }
    if (bool_field(step, "use_regex", true, "pre_tokenizer", path)) {
      add_split(detail::kGpt2SplitPattern, false, path.string());
    }
    return true;
  }
  fail(path, concat("pre_tokenizer type \"", type, "\" is not supported (supported: Split, ByteLevel, Sequence)"));
}

void Tokenizer::Impl::load_pre_tokenizer(const json& root, const fs::path& path) {
  const json& pre_tokenizer = require_field(root, "pre_tokenizer", "pre_tokenizer", path);
  bool byte_level = false;
  if (pre_tokenizer.is_object() && pre_tokenizer.contains("type") && pre_tokenizer.at("type") == "Sequence") {
    for (const json& step : require_field(pre_tokenizer, "pretokenizers", "pre_tokenizer.pretokenizers", path)) {
      byte_level = load_pre_tokenizer_step(step, path) || byte_level;
    }
  } else {
    byte_level = load_pre_tokenizer_step(pre_tokenizer, path);
  }
  if (!byte_level) fail(path, "pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are supported");
  if (root.contains("decoder") && !root.at("decoder").is_null()) {
    const std::string decoder = string_field(root.at("decoder"), "type", "decoder.type", path);
    if (decoder != "ByteLevel") {
      fail(path, concat("decoder type \"", decoder, "\" is not supported (supported: ByteLevel)"));
    }
  }
}

void Tokenizer::Impl::load_config(const fs::path& path) {
  const json config = read_json_file(path);
  if (!config.is_object()) fail(path, "the top level must be a JSON object");
  if (config.contains("chat_template") && !config.at("chat_template").is_null()) {
    const json& templates = config.at("chat_template");
    if (templates.is_string()) {
      chat_template = templates.get<std::string>();
    } else if (templates.is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
      for (const json& named : templates) {
        if (named.is_object() && named.contains("name") && named.at("name") == "default" &&
            named.contains("template") && named.at("template").is_string()) {
          chat_template = named.at("template").get<std::string>();
        }
      }
    } else {
      fail(path, "\"chat_template\" must be a string or a list of {\"name\", \"template\"}");
    }
  }
  const auto resolve = [&](const char* key) -> std::optional<int32_t> {
    const auto name = config_token_name(config, key, path);
    if (!name) return std::nullopt;
    const auto id = id_of(*name);
    if (!id) fail(path, concat("\"", key, "\" is \"", *name, "\", which is not a token of tokenizer.json"));
    return id;
  };
  eos = resolve("eos_token");
  pad = resolve("pad_token");
}

Tokenizer Tokenizer::from_directory(const std::filesystem::path& dir) {
  if (!fs::is_directory(dir)) {
    throw std::runtime_error(concat(dir.string(),
                                    ": not a directory (hint: pass the directory that holds tokenizer.json, such as a "
                                    "downloaded Qwen2.5 checkpoint)"));
  }
  const fs::path path = dir / "tokenizer.json", config = dir / "tokenizer_config.json";
  auto impl = std::make_shared<Impl>();
  // The loaders check the fields they know; a wrongly typed field they read in passing surfaces as a json::exception.
  fs::path reading = path;
  try {
    const json root = read_json_file(path);
    if (!root.is_object()) fail(path, "the top level must be a JSON object");
    impl->load_model(root, path);
    impl->nfc = load_normalizer(root, path);
    impl->load_pre_tokenizer(root, path);
    impl->find_byte_ids(path.string());  // before the added tokens, which may reuse a byte's spelling
    impl->add_added_tokens(load_added_tokens(root, path));
    reading = config;
    if (fs::exists(config)) impl->load_config(config);
  } catch (const json::exception& error) {
    fail(reading, concat("unexpected content: ", error.what()));
  }
  impl->default_eos_and_pad();
  return Tokenizer(std::move(impl));
}

}  // namespace qwen
