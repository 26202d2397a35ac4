// Generation's options and output, and the reference decoder the generation engine is checked against: prompts
// left-padded into one batch and the whole sequence recomputed at every step, with no cache, greedy (transformers'
// generate() with use_cache=False and do_sample=False). Generation itself has one loop, the engine's
// (engine/engine.hpp; engine/generate.hpp is its one-call form for a list of prompts); this one is an oracle for tests
// and benchmarks, quadratic in the length.
//
// Shapes: B = prompts, N = max_new_tokens.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/sampling.hpp"

namespace qwen {

struct GenerationOptions {
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_ids;  // a sequence ends after emitting any of these (it is kept in the output)
  SamplingOptions sampling;
  uint64_t seed = 0;   // the draws depend only on the seed, the prompts and the weights
  int64_t pad_id = 0;  // filler after a sequence ends (and, in the reference, left padding of the prompts)
  // Fill GenerationOutput::logprobs (training recomputes them; rollout correction reads them).
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

// Throws std::invalid_argument naming what is wrong: no prompts, an empty prompt, a token or pad_id outside the
// vocabulary, max_new_tokens < 1, bad sampling settings.
void check_generation(const Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                      const GenerationOptions& options);

// The reference: greedy decoding (sampling.temperature must be 0; a repetition penalty sees the left padding too, as
// transformers' does) with the whole prefix recomputed every step.
GenerationOutput reference_generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                    const GenerationOptions& options);

// Left-pads prompts into input_ids and attention_mask [B, P] (P = the longest prompt) on `device`.
std::pair<torch::Tensor, torch::Tensor> left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id,
                                                 torch::Device device);

}  // namespace qwen
