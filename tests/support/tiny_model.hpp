// A small Qwen2 configuration for tests that build a model in memory (random weights, no checkpoint).
#pragma once

#include <cstdint>
#include <filesystem>

#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

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

// Trainer settings small enough for a test: 2 steps of 2 prompts x 2 responses, 8 new tokens, 2 epochs of 2
// mini-batches, no dynamic sampling (a random model is never right: every group would be filtered), a checkpoint
// every step into `output` (none when empty).
inline qwen::TrainOptions small_train_options(const std::filesystem::path& output) {
  qwen::TrainOptions options;
  options.total_steps = 2;
  options.train_batch_size = 2;
  options.rollout_n = 2;
  options.ppo_mini_batch_size = 1;
  options.ppo_epochs = 2;
  options.max_new_tokens = 8;
  options.rewards.overlong_cache = 4;
  options.dynamic_sampling = false;
  options.lr = 1e-3;
  options.eval_problems = 2;
  options.save_every = 1;
  options.output_dir = output;
  options.quiet = true;
  options.seed = 3;
  return options;
}

// small_train_options for one quick step of the demo model without output: 6 new tokens, a short system prompt.
inline qwen::TrainOptions demo_step_options() {
  qwen::TrainOptions options = small_train_options({});
  options.max_new_tokens = 6;
  options.system_prompt = "Answer.";
  return options;
}

}  // namespace dapo::test
