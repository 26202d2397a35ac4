// The static KV cache: buffers allocated once per generation, written in place.
#include "qwen_gsm8k/model/kv_cache.hpp"

#include <stdexcept>
#include <string>

namespace qwen {

KVCache::KVCache(const Config& config, int64_t batch, int64_t max_length, torch::TensorOptions options)
    : batch_(batch), max_length_(max_length) {
  if (batch <= 0 || max_length <= 0) {
    throw std::invalid_argument("KVCache: batch " + std::to_string(batch) + " and max_length " +
                                std::to_string(max_length) + " must be > 0");
  }
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    keys_.push_back(torch::zeros({batch, config.num_key_value_heads, max_length, config.head_dim()}, options));
    values_.push_back(torch::zeros({batch, config.num_key_value_heads, max_length, config.head_dim()}, options));
  }
}

std::pair<torch::Tensor, torch::Tensor> KVCache::update(int64_t layer, const torch::Tensor& keys,
                                                        const torch::Tensor& values) {
  const int64_t positions = keys.size(2);
  if (length_ + positions > max_length_) {
    throw std::length_error("KVCache: " + std::to_string(length_ + positions) + " positions exceed max_length " +
                            std::to_string(max_length_));
  }
  keys_.at(static_cast<std::size_t>(layer)).narrow(2, length_, positions).copy_(keys);
  values_.at(static_cast<std::size_t>(layer)).narrow(2, length_, positions).copy_(values);
  return {keys_[static_cast<std::size_t>(layer)].narrow(2, 0, length_ + positions),
          values_[static_cast<std::size_t>(layer)].narrow(2, 0, length_ + positions)};
}

void KVCache::advance(int64_t positions) {
  length_ += positions;
}

}  // namespace qwen
