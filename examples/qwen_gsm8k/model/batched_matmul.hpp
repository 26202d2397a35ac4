// Batched matrix products for the eager attention on CPU (LibTorch 1.x, whose attention has no fused kernel).
//
// Without MKL, LibTorch 1.13's bmm multiplies the batch one matrix at a time, on one thread, each through the full
// mm operator (views, checks, dispatch: ~8 us before any arithmetic). Attention's products are many small matrices
// (batch x heads of them per layer; in a decode step each is 1 x head_dim by head_dim x length), so that overhead was
// two thirds of the demo's DAPO step (docs/benchmarks.md). batched_matmul makes the same BLAS sgemm call for each
// matrix as LibTorch's mm would (the same operand order, transposes and leading dimensions, chosen from the strides by
// LibTorch's rules), but directly and in parallel over the batch: the results are bitwise those of torch::bmm, which
// the tests check, and the demo's numbers do not move. Where that cannot hold (not CPU float32, no BLAS sgemm in
// the process, LibTorch with MKL, products small enough for LibTorch's own loop) it calls torch::bmm. Autograd is
// supported: the backward products are the ones LibTorch's bmm backward forms, made the same way.
#pragma once

#include <torch/torch.h>

namespace qwen {

// a [B, M, K] x b [B, K, N] -> [B, M, N], bitwise equal to torch::bmm(a, b); differentiable.
torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b);

// torch::matmul for a [..., M, K] x b [..., K, N] with equal leading dimensions, through batched_matmul.
torch::Tensor batched_matmul_nd(const torch::Tensor& a, const torch::Tensor& b);

// [B, KV, S, D] -> [B, KV * groups, S, D]: each key/value head repeated for the `groups` query heads it serves (a
// copy, as Hugging Face's repeat_kv; x itself when groups is 1).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t groups);

// Attention's products with grouped-query heads: a [B, N, M, K] times each of its heads' shared key/value head,
// `shared` [B, KV, S, D] (query head h reads head h / (N / KV)), transposed ([.., D, S]: scores = q k^T) or not
// (weights v): bitwise torch::matmul(a, repeat_kv(shared)[^T]). Without gradients it reads the shared heads in place
// (and, for one query row per head, multiplies two heads of a group in one sgemm call where that is checked to give
// the same bits); with them it makes repeat_kv's copy, whose backward sums each group's gradients.
torch::Tensor grouped_matmul(const torch::Tensor& a, const torch::Tensor& shared, bool transpose_shared);

// Whether batched_matmul can take the direct path in this process (a BLAS sgemm_ is loaded and LibTorch has no
// MKL, so its bmm calls sgemm for each matrix).
bool direct_batched_matmul_available();

}  // namespace qwen
