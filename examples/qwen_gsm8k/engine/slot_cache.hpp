// The generation engine's key/value cache: a fixed pool of sequence slots, per layer one [slots, KV, capacity, D]
// buffer for keys and one for values, allocated once. Each slot holds one sequence from position 0 (its prompt, then
// its tokens) and has its own length, so a finished sequence's slot is refilled without touching the others. The
// engine keeps its live sequences in slots [0, rows): a decode step reads narrow(0, 0, rows) of every buffer.
//
// Shapes: S = slots, R = live rows, KV = key/value heads, C = capacity (positions per slot), D = head dimension,
// W = the step's window (positions [0, W) are attended; each row's own mask hides what lies past its length).
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/model/kv_cache.hpp"

namespace qwen {

class SlotCache final : public AttentionCache {
 public:
  SlotCache(const Config& config, int64_t slots, int64_t capacity, torch::TensorOptions options);

  // The next decode step: rows [0, rows) each write one new position, row r at positions[r] ([R] int64 on the
  // cache's device), and attend to positions [0, window). The step's index tensors are views of buffers that live as
  // long as the cache (a CUDA graph of the step reads them at fixed addresses).
  void set_step(int64_t rows, const torch::Tensor& positions, int64_t window);
  // keys, values [R, KV, 1, D] of `layer` -> [R, KV, W, D] views of the cache, the new position written.
  std::pair<torch::Tensor, torch::Tensor> update(int64_t layer, const torch::Tensor& keys,
                                                 const torch::Tensor& values) override;
  // The decode step's fused form (one position per row, no gradients): RoPE on the query and key heads, the key and
  // value written, in one operator; [R, KV, W, D] views as update's.
  Operands rotate_and_update(int64_t layer, const torch::Tensor& qkv, const torch::Tensor& cos,
                             const torch::Tensor& signed_sin, int64_t heads, int64_t kv_heads) override;

  // Prefilled positions [0, W) into slots: slot slots[i] takes row rows[i] of keys[layer] and values[layer]
  // ([P, KV, W, D] per layer, e.g. a KVCache's buffers).
  void fill(const torch::Tensor& slots, const std::vector<torch::Tensor>& keys,
            const std::vector<torch::Tensor>& values, const torch::Tensor& rows);
  // Slot to[i] takes slot from[i]'s positions [0, width) (compaction after sequences finish).
  void move(const torch::Tensor& to, const torch::Tensor& from, int64_t width);

  int64_t slots() const { return slots_; }
  int64_t capacity() const { return capacity_; }
  int64_t bytes() const;  // of all buffers

 private:
  std::vector<torch::Tensor> keys_, values_;  // per layer [S, KV, C, D]
  int64_t slots_, capacity_;
  torch::Tensor window(const torch::Tensor& buffer) const;  // rows [0, R), positions [0, W) of a layer's buffer
  int64_t rows_ = 0, window_ = 0;
  torch::Tensor slot_index_;             // [S] int64: 0, 1, ..., S - 1 (its first R are the step's rows)
  torch::Tensor row_index_, positions_;  // [R] int64: the step's rows and write positions
};

}  // namespace qwen
