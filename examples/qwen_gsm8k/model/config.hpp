// The Qwen2 architecture hyper-parameters, read from (and written to) a Hugging Face config.json. Only what this
// implementation supports is accepted: model_type qwen2, silu, no sliding window, no rope scaling.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qwen {

struct Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json allows one id or a list
  std::string torch_dtype = "float32";

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // Parses and validates; `source` names the file in errors.
  static Config from_json(const nlohmann::json& json, const std::string& source);
  static Config from_file(const std::filesystem::path& path);
  nlohmann::json to_json() const;
  // Throws std::invalid_argument naming the first inconsistent field.
  void validate(const std::string& source) const;
};

}  // namespace qwen
