// Batched autoregressive generation: prompts are left-padded into one batch, decoded with the static KV cache (or, for
// comparison, by recomputing the whole prefix each step), with per-sequence stops. Seeded and reproducible.
//
// Shapes: B = prompts, N = max_new_tokens.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/sampling.hpp"

namespace qwen {

struct GenerationOptions {
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_ids;  // a sequence ends after emitting any of these (it is kept in the output)
  SamplingOptions sampling;
  uint64_t seed = 0;      // the draws depend only on the seed, the prompts and the weights
  bool use_cache = true;  // false recomputes the prefix every step (slow; for checks and benchmarks)
  int64_t pad_id = 0;     // left padding of prompts, and filler after a sequence ends
  // Fill GenerationOutput::logprobs (a log-softmax over the vocabulary per step; training recomputes them instead).
  bool return_logprobs = false;
};

struct GenerationOutput {
  torch::Tensor tokens;     // [B, N] int64: generated tokens, pad_id after each sequence's end
  torch::Tensor lengths;    // [B] int64: generated tokens, the stop token included
  torch::Tensor truncated;  // [B] bool: reached max_new_tokens without a stop token
  // [B, N] float32: log p(token) under softmax(logits / temperature) of the model, the distribution a trainer
  // recomputes (temperature 1 when greedy; repetition penalty, top-k and top-p excluded); 0 after the end.
  // Undefined unless GenerationOptions::return_logprobs.
  torch::Tensor logprobs;
};

GenerationOutput generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options);

// Left-pads prompts into input_ids and attention_mask [B, P] (P = the longest prompt) on `device`.
std::pair<torch::Tensor, torch::Tensor> left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id,
                                                 torch::Device device);

}  // namespace qwen
