// The CUDA kernels of model/fused_ops (model/fused_ops_cuda.cu), compiled only where the build has a CUDA compiler and
// LibTorch's CUDA (DAPO_DRIVER_CUDA_KERNELS). Each writes into outputs its caller allocated, on the inputs' GPU and
// its current stream (so a CUDA graph captures it), and takes only what fused_ops.cpp checked: one floating dtype
// for every floating tensor, contiguous tensors, int64 indices. Shapes as fused_ops.hpp says.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace qwen::fused::kernels {

// normed, sum [rows, H] as x.
void add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps,
                  const torch::Tensor& normed, const torch::Tensor& sum);
// out [..., I] for gate_up [..., 2 I].
void silu_and_mul(const torch::Tensor& gate_up, const torch::Tensor& out);
// query [R, N, 1, D].
void rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                    const torch::Tensor& key_cache, const torch::Tensor& value_cache, const torch::Tensor& rows,
                    const torch::Tensor& positions, int64_t heads, int64_t kv_heads, const torch::Tensor& query);

// token [R] int64, logprob [R] float32; uniforms [R] float32, undefined when greedy.
void sample_tokens(const torch::Tensor& logits, const torch::Tensor& uniforms, double temperature,
                   const torch::Tensor& token, const torch::Tensor& logprob);

}  // namespace qwen::fused::kernels
