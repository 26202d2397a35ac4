// A static key/value cache for decoding: per layer one preallocated [B, KV, max_length, D] buffer for keys and one for
// values, filled left to right. All sequences of a batch share the time axis (prompts are left-padded), so one length
// counts for the batch; the attention mask says which slots are padding.
//
// Shapes: B = batch, KV = key/value heads, D = head dimension, T = new positions.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "qwen_gsm8k/model/config.hpp"

namespace qwen {

// What an attention layer needs of a cache: store this step's keys and values of a layer and get back every position's
// that the step attends to. KVCache (one time axis for the batch) and the generation engine's slot cache (a length per
// sequence) implement it.
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  // keys, values [B, KV, T, D] of `layer` -> the keys and values [B, KV, S, D] the new positions attend to.
  virtual std::pair<torch::Tensor, torch::Tensor> update(int64_t layer, const torch::Tensor& keys,
                                                         const torch::Tensor& values) = 0;

  // What a layer attends with: the rotated query [B, N, T, D] and the keys and values [B, KV, S, D].
  struct Operands {
    torch::Tensor query, keys, values;
  };
  // RoPE and the cache write in one operator (fused::rope_and_cache), where the cache has that form for this call:
  // qkv [B, T, (N + 2 KV) D] (the q/k/v product's output) of `layer`, cos and signed_sin as AttentionInputs' -> the
  // operands. An undefined query where it does not: the layer then rotates and calls update. None by default.
  virtual Operands rotate_and_update(int64_t /*layer*/, const torch::Tensor& /*qkv*/, const torch::Tensor& /*cos*/,
                                     const torch::Tensor& /*signed_sin*/, int64_t /*heads*/, int64_t /*kv_heads*/) {
    return {};
  }
};

class KVCache final : public AttentionCache {
 public:
  KVCache(const Config& config, int64_t batch, int64_t max_length, torch::TensorOptions options);

  // Stores keys, values [B, KV, T, D] of `layer` at positions [length(), length() + T) and returns the keys and values
  // of all positions so far, [B, KV, length() + T, D] (views into the cache). The length advances in advance().
  std::pair<torch::Tensor, torch::Tensor> update(int64_t layer, const torch::Tensor& keys,
                                                 const torch::Tensor& values) override;
  void advance(int64_t positions);  // after every layer has stored the same T positions

  int64_t length() const { return length_; }
  int64_t max_length() const { return max_length_; }
  int64_t batch() const { return batch_; }
  // The whole buffers of `layer`, [B, KV, max_length, D]: a prefill's keys and values, copied out by the engine.
  const torch::Tensor& layer_keys(int64_t layer) const { return keys_.at(static_cast<std::size_t>(layer)); }
  const torch::Tensor& layer_values(int64_t layer) const { return values_.at(static_cast<std::size_t>(layer)); }

 private:
  std::vector<torch::Tensor> keys_, values_;  // per layer [B, KV, max_length, D]
  int64_t batch_, max_length_, length_ = 0;
};

}  // namespace qwen
