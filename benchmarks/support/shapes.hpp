// The model shapes the benchmarks run at, by name: one table for every benchmark program, so that "qwen2.5-1.5b" is
// the same architecture wherever it appears. Only the architecture: the benchmarks fill the weights at random.
#pragma once

#include <stdexcept>
#include <string>

#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/model/config.hpp"

namespace dapo::bench {

inline constexpr const char* kShapeNames = "qwen2.5-1.5b, qwen2.5-1.5b-2-layers, qwen2.5-0.5b, small or demo";

// Qwen2.5's architecture with Qwen2.5's vocabulary (151936, tied embeddings), RoPE theta 1e6 and context 32768.
inline qwen::Config qwen25_shape(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                                 const std::string& name, int64_t vocab = 151936) {
  return qwen::Config::from_json({{"model_type", "qwen2"},
                                  {"vocab_size", vocab},
                                  {"hidden_size", hidden},
                                  {"intermediate_size", intermediate},
                                  {"num_hidden_layers", layers},
                                  {"num_attention_heads", heads},
                                  {"num_key_value_heads", 2},
                                  {"max_position_embeddings", 32768},
                                  {"rms_norm_eps", 1e-6},
                                  {"rope_theta", 1000000.0},
                                  {"tie_word_embeddings", true},
                                  {"eos_token_id", 151645}},
                                 name + " shape");
}

// The configuration of a named shape; throws std::invalid_argument naming --shape for any other name.
//   qwen2.5-1.5b: hidden 1536, 28 layers, 12 / 2 heads, intermediate 8960 (1.54 B parameters)
//   qwen2.5-1.5b-2-layers: two of the 1.5B's 28 decoder layers, each the same, with the vocabulary cut to 2/28 of
//                 Qwen2.5's (10852): a token's decoder and lm-head work in the 1.5B's proportion, attention against the
//                 products as in the 1.5B, at 1/14 of its cost (110 M parameters)
//   qwen2.5-0.5b: hidden 896, 24 layers, 14 / 2 heads, intermediate 4864 (494 M parameters)
//   small:        hidden 256, 4 layers, 4 / 2 heads, intermediate 1024, Qwen2.5's vocabulary with tied embeddings (the
//                 lm-head dominates, as in the 0.5B-1.5B models), context 4096, RoPE theta 10000 (43 M parameters)
//   demo:         the built-in demo model (hidden 64, 3 layers, byte vocabulary of 259; qwen::demo_model_config())
inline qwen::Config model_shape(const std::string& name) {
  if (name == "qwen2.5-1.5b") return qwen25_shape(1536, 8960, 28, 12, name);
  if (name == "qwen2.5-1.5b-2-layers") return qwen25_shape(1536, 8960, 2, 12, name, 10852);
  if (name == "qwen2.5-0.5b") return qwen25_shape(896, 4864, 24, 14, name);
  if (name == "small") {
    return qwen::Config::from_json({{"model_type", "qwen2"},
                                    {"vocab_size", 151936},
                                    {"hidden_size", 256},
                                    {"intermediate_size", 1024},
                                    {"num_hidden_layers", 4},
                                    {"num_attention_heads", 4},
                                    {"num_key_value_heads", 2},
                                    {"max_position_embeddings", 4096},
                                    {"tie_word_embeddings", true}},
                                   "small shape");
  }
  if (name == "demo") return qwen::demo_model_config();
  throw std::invalid_argument("--shape is '" + name + "', expected " + kShapeNames);
}

}  // namespace dapo::bench
