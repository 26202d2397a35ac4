// The slot pool's buffers: written in place by index, never reallocated.
#include "qwen_gsm8k/engine/slot_cache.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "qwen_gsm8k/model/fused_ops.hpp"

namespace qwen {

SlotCache::SlotCache(const Config& config, int64_t slots, int64_t capacity, torch::TensorOptions options)
    : slots_(slots), capacity_(capacity) {
  if (slots <= 0 || capacity <= 0) {
    throw std::invalid_argument("SlotCache: slots " + std::to_string(slots) + " and capacity " +
                                std::to_string(capacity) + " must be > 0");
  }
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    keys_.push_back(torch::zeros({slots, config.num_key_value_heads, capacity, config.head_dim()}, options));
    values_.push_back(torch::zeros({slots, config.num_key_value_heads, capacity, config.head_dim()}, options));
  }
  slot_index_ = torch::arange(slots, options.dtype(torch::kInt64));
}

void SlotCache::set_step(int64_t rows, const torch::Tensor& positions, int64_t window) {
  if (rows <= 0 || rows > slots_ || window <= 0 || window > capacity_ || positions.numel() != rows) {
    throw std::invalid_argument("SlotCache: a step of " + std::to_string(rows) + " rows (" +
                                std::to_string(positions.numel()) + " positions) over a window of " +
                                std::to_string(window) + " does not fit " + std::to_string(slots_) + " slots of " +
                                std::to_string(capacity_) + " positions");
  }
  row_index_ = slot_index_.narrow(0, 0, rows);
  rows_ = rows;
  window_ = window;
  positions_ = positions;
}

std::pair<torch::Tensor, torch::Tensor> SlotCache::update(int64_t layer, const torch::Tensor& keys,
                                                          const torch::Tensor& values) {
  using torch::indexing::Slice;
  const auto index = static_cast<std::size_t>(layer);
  torch::Tensor& layer_keys = keys_.at(index);
  torch::Tensor& layer_values = values_.at(index);
  // Row r's new position goes to [r, :, positions[r], :]: one indexed write per buffer for the whole step.
  layer_keys.index_put_({row_index_, Slice(), positions_}, keys.squeeze(2));
  layer_values.index_put_({row_index_, Slice(), positions_}, values.squeeze(2));
  return {window(layer_keys), window(layer_values)};
}

AttentionCache::Operands SlotCache::rotate_and_update(int64_t layer, const torch::Tensor& qkv, const torch::Tensor& cos,
                                                      const torch::Tensor& signed_sin, int64_t heads,
                                                      int64_t kv_heads) {
  if (qkv.size(1) != 1 || torch::GradMode::is_enabled()) return {};
  const auto index = static_cast<std::size_t>(layer);
  const torch::Tensor& layer_keys = keys_.at(index);
  const torch::Tensor& layer_values = values_.at(index);
  torch::Tensor query =
      fused::rope_and_cache(qkv, cos, signed_sin, layer_keys, layer_values, row_index_, positions_, heads, kv_heads);
  return {std::move(query), window(layer_keys), window(layer_values)};
}

// The contiguous buffer's rows [0, R) and positions [0, W) as one view (one operator, not two narrows).
torch::Tensor SlotCache::window(const torch::Tensor& buffer) const {
  return buffer.as_strided({rows_, buffer.size(1), window_, buffer.size(3)}, buffer.strides());
}

void SlotCache::fill(const torch::Tensor& slots, const std::vector<torch::Tensor>& keys,
                     const std::vector<torch::Tensor>& values, const torch::Tensor& rows) {
  for (std::size_t layer = 0; layer < keys_.size(); ++layer) {
    const int64_t width = keys.at(layer).size(2);
    keys_[layer].narrow(2, 0, width).index_copy_(0, slots, keys[layer].index_select(0, rows));
    values_[layer].narrow(2, 0, width).index_copy_(0, slots, values.at(layer).index_select(0, rows));
  }
}

void SlotCache::move(const torch::Tensor& to, const torch::Tensor& from, int64_t width) {
  for (std::size_t layer = 0; layer < keys_.size(); ++layer) {
    for (auto* buffers : {&keys_, &values_}) {
      const torch::Tensor part = (*buffers)[layer].narrow(2, 0, width);
      part.index_copy_(0, to, part.index_select(0, from));
    }
  }
}

int64_t SlotCache::bytes() const {
  int64_t total = 0;
  for (std::size_t layer = 0; layer < keys_.size(); ++layer) {
    total += static_cast<int64_t>(keys_[layer].nbytes() + values_[layer].nbytes());
  }
  return total;
}

}  // namespace qwen
