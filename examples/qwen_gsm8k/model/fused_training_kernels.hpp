// The CUDA kernels of model/fused_training (model/fused_training_cuda.cu), compiled only where the build has a CUDA
// compiler and LibTorch's CUDA (DAPO_DRIVER_CUDA_KERNELS). Each writes into outputs its caller allocated, on the
// inputs' GPU and its current stream, and takes only what fused_training.cpp checked: contiguous tensors of float32,
// bfloat16 or float16 (the norms may mix them: autocast's bfloat16 products beside its float32 residual), shapes as
// fused_training.hpp says. Each rounds where the composite it replaces rounds (every stored intermediate in the
// composite's dtype, computed in float32), bar the sums' order.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace qwen::fused::training_kernels {

// Whether the kernels take this dtype.
bool takes(torch::ScalarType dtype);

// out = (weight * rms_norm(s)) rounded as the composite rounds, in out's dtype, with s = residual + x stored in `sum`
// (residual and sum of one dtype, the promoted one), or s = x where residual is undefined (sum undefined too);
// inverse [rows] float32. x, residual, sum, out [rows, H]; weight [H].
void rms_norm_forward(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps,
                      const torch::Tensor& out, const torch::Tensor& sum, const torch::Tensor& inverse);

// grad_x (undefined: not wanted) [rows, H] in x's dtype, plus grad_sum where defined; weight_partials (undefined: not
// wanted) [slices, H] float32, whose column sums are the weight's gradient. grad [rows, H]; x [rows, H] the norm's
// input; inverse [rows] float32.
void rms_norm_backward(const torch::Tensor& grad, const torch::Tensor& grad_sum, const torch::Tensor& x,
                       const torch::Tensor& weight, const torch::Tensor& inverse, const torch::Tensor& grad_x,
                       const torch::Tensor& weight_partials);

// out [..., 2 I] (d gate, d up) for grad [..., I], gate_up [..., 2 I], one dtype.
void silu_and_mul_backward(const torch::Tensor& grad, const torch::Tensor& gate_up, const torch::Tensor& out);

// RoPE on the product's N + KV rotated heads, the value heads copied. product [B T, W D]; cos, signed_sin [B T, D];
// either packed [B T, W D] defined, or q [B, N, T, D], k, v [B, KV, T, D]. One dtype.
void rotary_qkv(const torch::Tensor& product, const torch::Tensor& cos, const torch::Tensor& signed_sin, int64_t batch,
                int64_t heads, int64_t kv_heads, const torch::Tensor& packed, const torch::Tensor& q,
                const torch::Tensor& k, const torch::Tensor& v);

// grad_product [B T, W D] from the packed gradient [B T, W D], or from grad_q, grad_k, grad_v heads first (an
// undefined one: zero).
void rotary_qkv_backward(const torch::Tensor& packed, const torch::Tensor& grad_q, const torch::Tensor& grad_k,
                         const torch::Tensor& grad_v, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                         int64_t batch, int64_t heads, int64_t kv_heads, const torch::Tensor& grad_product);

}  // namespace qwen::fused::training_kernels
