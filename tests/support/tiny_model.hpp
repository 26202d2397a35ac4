// A small Qwen2 configuration for tests that build a model in memory (random weights, no checkpoint).
#pragma once

#include <cstdint>

#include "qwen_gsm8k/model/config.hpp"

namespace dapo::test {

// hidden / heads is the head dimension; intermediate 2 x hidden; tied embeddings; 1024 positions.
inline qwen::Config tiny_qwen_config(int64_t vocab, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t layers) {
  qwen::Config config;
  config.vocab_size = vocab;
  config.hidden_size = hidden;
  config.intermediate_size = 2 * hidden;
  config.num_hidden_layers = layers;
  config.num_attention_heads = heads;
  config.num_key_value_heads = kv_heads;
  config.max_position_embeddings = 1024;
  config.tie_word_embeddings = true;
  return config;
}

}  // namespace dapo::test
