// A copy of a model for inference in a lower precision, as serving engines (vLLM, SGLang) and transformers run a
// bfloat16 model: every parameter in the compute dtype (the rotary frequencies stay float32), activations and the
// residual stream in it too, so a forward under no autocast makes no float32 <-> bfloat16 cast (autocast over float32
// weights casts each product's input and keeps a float32 residual). refresh() writes the source's current values into
// the copy in place, one cast per parameter, so whatever holds the copy's addresses (a CUDA graph) reads the new
// weights. The generation engine keeps one while its model's weights are float32 and autocast asks for less.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "qwen_gsm8k/model/model.hpp"

namespace qwen {

class ComputeCopy {
 public:
  ComputeCopy(const Qwen2ForCausalLM& source, torch::ScalarType dtype);

  Qwen2ForCausalLM& model() { return copy_; }
  void refresh();         // the source's parameters and buffers, cast into the copy's in place
  int64_t bytes() const;  // of the copy's parameters and buffers

 private:
  Qwen2ForCausalLM copy_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs_;  // (source, copy), parameters and buffers
};

}  // namespace qwen
