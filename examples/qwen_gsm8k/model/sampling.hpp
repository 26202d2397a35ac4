// Next-token selection with Hugging Face's logits-processor semantics, applied in Hugging Face's order: repetition
// penalty, temperature, top-k, top-p (the draw: fused::sample_tokens, model/fused_ops.hpp). Not a beam search.
//
// Shapes: B = batch, V = vocabulary, S = tokens seen so far (prompt, padding included, and generated).
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>

namespace qwen {

struct SamplingOptions {
  double temperature = 1.0;         // 0 means greedy (argmax of the processed logits)
  int64_t top_k = 0;                // keep the k most likely tokens (ties with the k-th kept); 0: off
  double top_p = 1.0;               // keep the smallest set with probability mass >= top_p; 1: off
  double repetition_penalty = 1.0;  // > 1 discourages every token seen (HF: divide positive, multiply negative); 1: off

  bool greedy() const { return temperature == 0.0; }
  // Whether a processor other than the temperature changes the logits (then the draw reads processed scores).
  bool filtered() const { return repetition_penalty != 1.0 || top_k > 0 || top_p < 1.0; }
  void validate() const;  // throws std::invalid_argument naming the option
  bool operator==(const SamplingOptions&) const = default;
};

// logits [B, V] (float32) and the tokens seen [B, S] -> processed scores [B, V]: filtered tokens are -inf.
// As in Hugging Face, the repetition penalty also sees padding tokens.
torch::Tensor process_logits(const torch::Tensor& logits, const torch::Tensor& seen_tokens,
                             const SamplingOptions& options);

}  // namespace qwen
