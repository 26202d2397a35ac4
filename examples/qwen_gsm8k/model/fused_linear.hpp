// Linear layers that read the same input, computed as one matrix product: q/k/v of an attention layer, gate/up of an
// MLP (what vLLM's QKVParallelLinear and MergedColumnParallelLinear do). The layers stay what they are — registered
// under Hugging Face's names, each weight its own parameter, so checkpoints, the optimizer and transformers see
// nothing new — but their weights (and biases) live side by side in one block, each parameter a slice of it. One
// product of the input with the block gives every layer's output, concatenated on the last axis.
//
// The block is made on the first forward and again whenever a parameter no longer lies in it (after model->to(),
// set_data, a clone): a check of data pointers per forward, nothing on the device. In-place updates (the optimizer,
// load_weights, broadcasts) keep the slices in the block.
//
// Gradients: with grad mode on, the product reads the block through block_cast, whose backward adds the block's
// gradient into the parameters' gradients in one pass (they become slices of one gradient block). Without it
// (generation) the product reads the block itself, cast once per autocast region (autocast_weight: one cast per
// generation), never per decode step. Inside a WeightCastScope both read the scope's block_cast of the block, made once
// (one cast per optimizer step).
//
// Shapes: O = the layers' outputs summed, I = input features.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace qwen {

class FusedLinears {
 public:
  FusedLinears() = default;
  // The layers, in the order their outputs are concatenated. All have biases or none; weights of one dtype and device.
  explicit FusedLinears(std::vector<torch::nn::Linear> layers);
  // x [..., I] -> [..., O]: every layer's output, in order. Equal to cat of each layer(x) within rounding (BLAS may
  // sum a wider product in another order).
  torch::Tensor forward(const torch::Tensor& x);
  // Whether every parameter lies in the block now (false before the first forward and after a device move).
  bool fused() const;

 private:
  void fuse();
  std::vector<torch::nn::Linear> layers_;
  torch::Tensor weight_, bias_;  // [O, I], [O]: the blocks (leaves; never given gradients themselves)
};

}  // namespace qwen
