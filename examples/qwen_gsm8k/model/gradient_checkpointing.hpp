// Gradient checkpointing (verl's enable_gradient_checkpointing, TRL's gradient_checkpointing): a function of one
// tensor, run without keeping its activations; the backward runs it again, with gradients, on the saved input and
// differentiates that. LibTorch's C++ API has no torch.utils.checkpoint: this is its non-reentrant idea as one
// autograd node. The recomputation is exact where the function draws no random numbers (the decoder layers: no
// dropout) and sees the same autocast state, which the node saves and restores: the gradients are those without
// checkpointing. In a backward into .grad (Tensor::backward) the recompute's backward puts the parameters' gradients
// in .grad itself, as torch.utils.checkpoint's reentrant form does (a weight block's one add: block_cast); under
// autograd::grad it hands them on to the parameters. What is kept per call: the input, and the output the caller holds;
// the function's own intermediate tensors live only inside the forward and, again, inside the backward of this one
// call.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace qwen {

// run(input) with the activations dropped. `parameters`: the tensors run reads that need gradients besides input
// (a layer's weights), whose gradients the backward accumulates as any other use would. Without grad mode, or when
// nothing needs a gradient, it is run(input) itself.
torch::Tensor checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& run, const torch::Tensor& input,
                           const std::vector<torch::Tensor>& parameters);

}  // namespace qwen
