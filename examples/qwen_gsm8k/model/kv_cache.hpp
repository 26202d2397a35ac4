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

class KVCache {
 public:
  KVCache(const Config& config, int64_t batch, int64_t max_length, torch::TensorOptions options);

  // Stores keys, values [B, KV, T, D] of `layer` at positions [length(), length() + T) and returns the keys and values
  // of all positions so far, [B, KV, length() + T, D] (views into the cache). The length advances in advance().
  std::pair<torch::Tensor, torch::Tensor> update(int64_t layer, const torch::Tensor& keys, const torch::Tensor& values);
  void advance(int64_t positions);  // after every layer has stored the same T positions

  int64_t length() const { return length_; }
  int64_t max_length() const { return max_length_; }
  int64_t batch() const { return batch_; }

 private:
  std::vector<torch::Tensor> keys_, values_;  // per layer [B, KV, max_length, D]
  int64_t batch_, max_length_, length_ = 0;
};

}  // namespace qwen
