// Reading config.json: every field this implementation uses, checked, with the file named in every error.
#include "qwen_gsm8k/model/config.hpp"

#include <fstream>
#include <stdexcept>

#include "qwen_gsm8k/common/json_error.hpp"

namespace qwen {
namespace {

[[noreturn]] void config_error(const std::string& source, const std::string& message) {
  throw std::invalid_argument(source + ": " + message);
}

int64_t required_int(const nlohmann::json& json, const char* key, const std::string& source) {
  if (!json.contains(key)) config_error(source, std::string("missing field \"") + key + "\"");
  if (!json.at(key).is_number_integer()) {
    config_error(source, std::string("field \"") + key + "\" is " + json.at(key).dump() + ", expected an integer");
  }
  return json.at(key).get<int64_t>();
}

double number_or(const nlohmann::json& json, const char* key, double fallback, const std::string& source) {
  if (!json.contains(key) || json.at(key).is_null()) return fallback;
  if (!json.at(key).is_number()) {
    config_error(source, std::string("field \"") + key + "\" is " + json.at(key).dump() + ", expected a number");
  }
  return json.at(key).get<double>();
}

// nlohmann's json.value(key, fallback) throws its own type_error, naming no file, when the field has another type.
std::string string_or(const nlohmann::json& json, const char* key, const std::string& fallback,
                      const std::string& source) {
  if (!json.contains(key)) return fallback;
  if (!json.at(key).is_string()) {
    config_error(source, std::string("field \"") + key + "\" is " + json.at(key).dump() + ", expected a string");
  }
  return json.at(key).get<std::string>();
}

bool bool_or(const nlohmann::json& json, const char* key, bool fallback, const std::string& source) {
  if (!json.contains(key) || json.at(key).is_null()) return fallback;
  if (!json.at(key).is_boolean()) {
    config_error(source, std::string("field \"") + key + "\" is " + json.at(key).dump() + ", expected true or false");
  }
  return json.at(key).get<bool>();
}

std::optional<int64_t> optional_id(const nlohmann::json& json, const char* key) {
  if (!json.contains(key) || !json.at(key).is_number_integer()) return std::nullopt;
  return json.at(key).get<int64_t>();
}

// RoPE's base: top-level "rope_theta" (transformers 4, every Qwen2.5 checkpoint on the Hub) or
// "rope_parameters": {"rope_type": "default", "rope_theta": ...} (transformers 5 writes only this). Both present must
// agree; any rope_type but "default" is a scaled RoPE this implementation does not have.
double read_rope_theta(const nlohmann::json& json, const std::string& source) {
  const double legacy = number_or(json, "rope_theta", 0.0, source);
  if (!json.contains("rope_parameters") || json.at("rope_parameters").is_null()) return legacy > 0.0 ? legacy : 10000.0;
  const auto& parameters = json.at("rope_parameters");
  if (!parameters.is_object()) config_error(source, "rope_parameters is " + parameters.dump() + ", expected an object");
  const std::string type = string_or(parameters, "rope_type", "default", source + " rope_parameters");
  if (type != "default") {
    config_error(source, "rope_parameters.rope_type is \"" + type + "\"; only plain RoPE (\"default\") is supported");
  }
  const double theta =
      number_or(parameters, "rope_theta", legacy > 0.0 ? legacy : 10000.0, source + " rope_parameters");
  if (legacy > 0.0 && legacy != theta) {
    config_error(source, "rope_theta " + json.at("rope_theta").dump() + " and rope_parameters.rope_theta " +
                             parameters.at("rope_theta").dump() + " disagree");
  }
  return theta;
}

}  // namespace

Config Config::from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) config_error(source, "expected a JSON object");
  const std::string model_type = string_or(json, "model_type", "", source);
  if (model_type != "qwen2") {
    config_error(source,
                 "model_type is \"" + model_type + "\", expected \"qwen2\" (this driver implements Qwen2 / Qwen2.5)");
  }
  const std::string activation = string_or(json, "hidden_act", "silu", source);
  if (activation != "silu") config_error(source, "hidden_act is \"" + activation + "\", only \"silu\" is supported");
  if (bool_or(json, "use_sliding_window", false, source)) {
    config_error(source, "use_sliding_window is true; sliding-window attention is not supported");
  }
  if (json.contains("rope_scaling") && !json.at("rope_scaling").is_null()) {
    config_error(source, "rope_scaling is " + json.at("rope_scaling").dump() + "; only plain RoPE is supported");
  }
  if (json.contains("layer_types") && json.at("layer_types").is_array()) {
    for (const auto& type : json.at("layer_types")) {
      if (type != "full_attention") {
        config_error(source, "layer_types holds " + type.dump() + "; only \"full_attention\" layers are supported");
      }
    }
  }
  Config config;
  config.vocab_size = required_int(json, "vocab_size", source);
  config.hidden_size = required_int(json, "hidden_size", source);
  config.intermediate_size = required_int(json, "intermediate_size", source);
  config.num_hidden_layers = required_int(json, "num_hidden_layers", source);
  config.num_attention_heads = required_int(json, "num_attention_heads", source);
  config.num_key_value_heads = json.contains("num_key_value_heads") ? required_int(json, "num_key_value_heads", source)
                                                                    : config.num_attention_heads;
  config.max_position_embeddings =
      json.contains("max_position_embeddings") ? required_int(json, "max_position_embeddings", source) : 32768;
  config.rms_norm_eps = number_or(json, "rms_norm_eps", 1e-6, source);
  config.rope_theta = read_rope_theta(json, source);
  config.tie_word_embeddings = bool_or(json, "tie_word_embeddings", false, source);
  config.bos_token_id = optional_id(json, "bos_token_id");
  config.pad_token_id = optional_id(json, "pad_token_id");
  if (json.contains("eos_token_id")) {
    const auto& eos = json.at("eos_token_id");
    if (eos.is_number_integer()) {
      config.eos_token_ids.push_back(eos.get<int64_t>());
    } else if (eos.is_array()) {
      for (const auto& id : eos) {
        if (!id.is_number_integer()) config_error(source, "eos_token_id holds " + id.dump() + ", expected integers");
        config.eos_token_ids.push_back(id.get<int64_t>());
      }
    } else if (!eos.is_null()) {
      config_error(source, "eos_token_id is " + eos.dump() + ", expected an integer or a list of integers");
    }
  }
  // transformers 5 writes "dtype"; earlier versions "torch_dtype".
  config.torch_dtype = "float32";
  for (const char* key : {"dtype", "torch_dtype"}) {  // where both are present, torch_dtype, as before
    if (json.contains(key) && !json.at(key).is_null()) config.torch_dtype = string_or(json, key, "", source);
  }
  config.validate(source);
  return config;
}

void Config::validate(const std::string& source) const {
  auto positive = [&](int64_t value, const char* name) {
    if (value <= 0) config_error(source, std::string(name) + " is " + std::to_string(value) + ", expected > 0");
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  if (hidden_size % num_attention_heads != 0) {
    config_error(source, "hidden_size " + std::to_string(hidden_size) + " is not a multiple of num_attention_heads " +
                             std::to_string(num_attention_heads));
  }
  if (head_dim() % 2 != 0) {
    config_error(source, "the head dimension " + std::to_string(head_dim()) + " is odd; RoPE needs pairs");
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    config_error(source, "num_attention_heads " + std::to_string(num_attention_heads) +
                             " is not a multiple of num_key_value_heads " + std::to_string(num_key_value_heads));
  }
  if (!(rms_norm_eps > 0.0)) config_error(source, "rms_norm_eps must be > 0");
  if (!(rope_theta > 0.0)) config_error(source, "rope_theta must be > 0");
}

Config Config::from_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(path.string() + ": cannot open the model config (expected a Hugging Face config.json)");
  }
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    config_error(path.string(), "invalid JSON " + json_error_where(error) + ": " + error.what());
  }
  return from_json(json, path.string());
}

nlohmann::json Config::to_json() const {
  nlohmann::json json{{"architectures", {"Qwen2ForCausalLM"}},
                      {"model_type", "qwen2"},
                      {"hidden_act", "silu"},
                      {"vocab_size", vocab_size},
                      {"hidden_size", hidden_size},
                      {"intermediate_size", intermediate_size},
                      {"num_hidden_layers", num_hidden_layers},
                      {"num_attention_heads", num_attention_heads},
                      {"num_key_value_heads", num_key_value_heads},
                      {"max_position_embeddings", max_position_embeddings},
                      {"rms_norm_eps", rms_norm_eps},
                      {"rope_theta", rope_theta},
                      {"tie_word_embeddings", tie_word_embeddings},
                      {"torch_dtype", torch_dtype},
                      {"use_sliding_window", false},
                      {"sliding_window", nullptr},
                      {"attention_dropout", 0.0}};
  if (bos_token_id) json["bos_token_id"] = *bos_token_id;
  if (pad_token_id) json["pad_token_id"] = *pad_token_id;
  if (eos_token_ids.size() == 1) json["eos_token_id"] = eos_token_ids.front();
  if (eos_token_ids.size() > 1) json["eos_token_id"] = eos_token_ids;
  return json;
}

}  // namespace qwen
