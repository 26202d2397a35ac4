// The generation path's fused operators, as vLLM's (fused_add_rms_norm, silu_and_mul, the rotary embedding with the
// cache write) and a sampler that gives the token's log-prob from the same reads of the logits: each is one operator
// of the dispatcher (torch.ops.qwen.*) and one kernel on CUDA (model/fused_ops_cuda.cu, where the build has a CUDA
// compiler and LibTorch's CUDA). Everywhere else, and on CUDA inputs the kernels do not take (mixed dtypes), the
// operator runs a composite of ATen calls: for the first three the unfused path's calls in their order (a CPU run
// computes the same bits as before), for the sampler the formula it names. A CPU profile counts one operator where a
// GPU launches one kernel. No autograd: the model calls them only while generating (a cache, no gradients).
//
// Shapes: R = rows, H = hidden, I = MLP width, N = query heads, KV = key/value heads, D = head dimension,
// S = cache slots, C = positions per slot, V = vocabulary.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>

namespace qwen::fused {

// RMSNorm as Hugging Face's Qwen2RMSNorm: x normalised in float32, cast back to x's dtype, times weight.
// x [..., H], weight [H] -> [..., H]. Not a dispatcher operator (LibTorch 2.4 and later have at::rms_norm, one).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The residual add and the next norm in one: sum = residual + x, then {rms_norm(sum, weight, eps), sum}.
// x, residual [..., H]; weight [H].
std::pair<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                     const torch::Tensor& weight, double eps);

// silu(gate) * up, for gate and up the two halves of gate_up [..., 2 I] (one product's output) -> [..., I].
torch::Tensor silu_and_mul(const torch::Tensor& gate_up);

// RoPE as rotate-half: x * cos + rotate_half(x) * sin, written x * cos + roll(x, D / 2) * signed_sin, with
// signed_sin = (-sin1, sin2) (the same products: a negation is exact). x [B, heads, T, D]; cos, signed_sin
// [B, 1, T, D].
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& signed_sin);

// One decode step's attention input of a layer, in one kernel: RoPE on the query and key heads, the rotated key and
// the value written to the cache at row r's slot rows[r] and position positions[r], the rotated query returned.
// qkv [R, 1, (N + 2 KV) D] (the q/k/v product's output); cos, signed_sin [R, 1, 1, D] (as rotary's);
// key_cache, value_cache [S, KV, C, D] (written in place); rows, positions [R] int64 -> query [R, N, 1, D].
torch::Tensor rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                             const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                             const torch::Tensor& rows, const torch::Tensor& positions, int64_t heads,
                             int64_t kv_heads);

// One token per row and its log-probability, from the logits in one kernel (two reads of each row): x = logits / T
// in float32, read in the logits' dtype (no cast of the [R, V] logits); token = argmax(x) where `uniforms` is undefined
// (greedy), else the inverse of the row's float32 CDF of softmax(x) at uniforms[r] (the first token whose cumulative
// sum exceeds uniforms[r] x the row's total); logprob = log_softmax(x)[token]. A token of probability 0 (a -inf logit)
// is never drawn when every uniform is at most 1 - 2^-23 (then u x total < total in float32). The composite sums the
// CDF with cumsum, the kernel in per-thread chunks: they agree but for a uniform within float32 rounding of a bound.
// logits [R, V] (float32, bfloat16 or float16); uniforms [R] float32 in [0, 1 - 2^-23] -> {token [R] int64,
// logprob [R] float32}.
std::pair<torch::Tensor, torch::Tensor> sample_tokens(const torch::Tensor& logits, const torch::Tensor& uniforms,
                                                      double temperature);

// Whether the CUDA kernels were built into this program (else CUDA inputs run the composites).
bool cuda_kernels_built();

}  // namespace qwen::fused
