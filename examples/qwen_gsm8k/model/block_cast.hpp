// A block of parameters read as one tensor in the dtype a product computes in, with one backward node that puts the
// block's gradient straight into the parameters' gradients.
//
// The parameters (`parts`) lie side by side along the first axis of `block` (a fused q/k/v or gate/up block), or
// `parts` is the block itself (one weight). block_cast gives the block's values in `dtype`: a cast (the optimizer
// step's bfloat16 copy of float32 weights, WeightCasts) or, in the block's own dtype, a new tensor over its memory.
//
// Its backward, in a backward that accumulates into .grad (Tensor::backward, no inputs named), is one in-place add of
// the incoming gradient (in the compute dtype) into the parts' gradients (in theirs): the first one of an optimizer
// step makes them slices of one gradient block (a cast copy), every later one adds to that block. So a micro-batch's
// backward costs one kernel per block, where autocast's cast back to float32, the block's split and each parameter's
// AccumulateGrad cost a cast copy (a float32 temporary the block's size) and an add per parameter: on a GPU about 10
// bytes of traffic per parameter instead of 18, and no temporary. The sums are the same float32 additions in the same
// order, except for a weight with a second path to its gradient (the tied embedding's lookup): that path's part, which
// autograd would have added to this one first, is added after it.
//
// Where the engine hands gradients to named inputs instead (autograd::grad, a checkpoint's recompute) or a part's
// gradient lies elsewhere (set by another path), it hands each part its rows of the gradient in the part's dtype, as
// autocast's cast and a split would, and the parameters' AccumulateGrad nodes take them from there.
#pragma once

#include <torch/types.h>

#include <vector>

namespace qwen {

// `block` [rows, ...] in `dtype`, differentiable with respect to `parts` (each a slice of `block` along dimension 0,
// in order, or {block}) when grad mode is on and one of them asks for gradients; otherwise a plain cast (a new tensor
// over the block's memory where the dtype is the block's).
torch::Tensor block_cast(const std::vector<torch::Tensor>& parts, const torch::Tensor& block, torch::ScalarType dtype);

// Whether the backward running on this thread accumulates into the leaves' .grad (Tensor::backward with no inputs
// named), rather than handing gradients to named inputs (autograd::grad); false outside a backward.
bool accumulating_backward();

// Whether `tensors` lie side by side in memory, in order, each contiguous and of the first's dtype, device and storage,
// covering exactly `block` (its first element where the first begins, its bytes) when `block` is given.
bool lie_side_by_side(const std::vector<torch::Tensor>& tensors, const torch::Tensor& block = {});

// A contiguous tensor of `sizes` over `like`'s storage from element `offset`: a new TensorImpl with no autograd
// history and no view of another (LibTorch 1.13's zero_grad detaches gradients in place, which it refuses for views).
// The storage must hold it (lie_side_by_side checks that first).
torch::Tensor alias_over(const torch::Tensor& like, int64_t offset, at::IntArrayRef sizes);

}  // namespace qwen
