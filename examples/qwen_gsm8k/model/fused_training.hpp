// The training forward's fused operators, each with its own backward: one autograd node per call, whose backward is
// one dispatcher operator (torch.ops.qwen.*_backward) with the formula written out, in place of the chain of nodes
// ATen's autograd records for the unfused calls (an RMSNorm alone is seven). Used where the model computes in a
// 16-bit dtype, that is under autocast (every GPU run, and the CPU tests and benches that ask for it), and on CUDA
// inputs (uses_fused_training); the float32 CPU path (the CPU demo) keeps the unfused calls and their bits.
// Each operator is one CUDA kernel (model/fused_training_cuda.cu, where the build has them) and elsewhere a composite
// of ATen calls: the forwards compute what the unfused calls compute; the backwards equal ATen's autograd within
// rounding (tests).
//
// Shapes: H = hidden, I = MLP width, N = query heads, KV = key/value heads, W = N + 2 KV, D = head dimension.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace qwen::fused {

// Whether the model's training forward takes these operators for an input on x's device (see above).
bool uses_fused_training(const torch::Tensor& x);

// The unfused calls everywhere while an instance lives, for comparisons in tests and benches: process-wide, not per
// thread (checkpointed recomputes run on the autograd engine's threads); one at a time.
class UnfusedTraining {
 public:
  UnfusedTraining();
  ~UnfusedTraining();
  UnfusedTraining(const UnfusedTraining&) = delete;
  UnfusedTraining& operator=(const UnfusedTraining&) = delete;

 private:
  bool previous_;
};

// Qwen2RMSNorm (rms_norm's formula) with its output cast to `out_dtype`, as the next product's autocast cast would.
// x [..., H], weight [H] -> [..., H] in out_dtype.
torch::Tensor rms_norm_trained(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               torch::ScalarType out_dtype);

// The residual add and the norm of its sum: sum = residual + x (the promoted dtype), then
// {rms_norm_trained(sum, weight, eps, out_dtype), sum}. x, residual [..., H]; weight [H].
std::pair<torch::Tensor, torch::Tensor> add_rms_norm_trained(const torch::Tensor& x, const torch::Tensor& residual,
                                                             const torch::Tensor& weight, double eps,
                                                             torch::ScalarType out_dtype);

// silu(gate) * up for gate_up [..., 2 I] -> [..., I] (fused::silu_and_mul), differentiable.
torch::Tensor silu_and_mul_trained(const torch::Tensor& gate_up);

// at::linear(x, weight, bias) (autocast's casts included) with its backward as one node: d x = dy weight,
// d weight = dy^T x, d bias = the rows' sum of dy in the bias's dtype. x [..., in], weight [out, in], bias [out] or
// undefined -> [..., out].
torch::Tensor linear_trained(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// The product as the model's layers take it: linear_trained where grad mode is on and x takes the fused training
// operators (uses_fused_training), at::linear otherwise.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// RoPE on the query and key heads of the q/k/v product, the value heads as they are, each head as fused::rotary
// computes it. product [B, T, W D] or [T, W D]; cos and signed_sin contiguous with B T D elements each ([B, 1, T, D]
// or [T, 1, D], as fused::rotary takes them) -> [B, T, W, D] ([T, W, D]).
torch::Tensor rotary_qkv(const torch::Tensor& product, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                         int64_t heads, int64_t kv_heads);

// The same, heads first and split: {q [B, N, T, D], k [B, KV, T, D], v [B, KV, T, D]}, each contiguous (SDPA's
// operands), for a product [B, T, W D].
std::vector<torch::Tensor> rotary_qkv_heads(const torch::Tensor& product, const torch::Tensor& cos,
                                            const torch::Tensor& signed_sin, int64_t heads, int64_t kv_heads);

}  // namespace qwen::fused
