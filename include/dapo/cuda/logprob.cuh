// The lm-head log-prob's work over the vocabulary on CUDA, one pass each way: kernels and their launchers on raw
// device pointers (no LibTorch, no allocation), the CUDA form of <dapo/core/logprob.hpp>'s softmax_statistics and
// logprob_logits_grad, which are their reference.
//
// One thread block per row of logits. The forward reads the row once and keeps an online softmax per thread (the
// running max, sum exp(z - max) and sum exp(z - max) * z, rescaled when the max rises), merged over the block in a
// fixed order, so the results do not depend on timing. The backward reads each logit once and writes its gradient in
// place. exp in the compute type C (float for float32, bfloat16 and float16 logits), sums in double.
//
// Shapes: R = rows, V = vocabulary; logits [R, V] row-major (already divided by the temperature), targets [R] int64;
// every per-row input and output [R] in C.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace dapo::cuda {

constexpr int kLogprobThreads = 512;

namespace detail {

template <class C>
__device__ inline C device_exp(C x) {
  if constexpr (sizeof(C) == sizeof(float)) {
    return expf(x);
  } else {
    return exp(x);
  }
}

// sum = sum exp(z - max), weighted = sum exp(z - max) * z over the values seen. NaN in, NaN out (as the CPU).
template <class C>
struct OnlineSoftmax {
  C max;
  double sum, weighted;
};

template <class C>
__device__ inline void online_add(OnlineSoftmax<C>& s, C x) {
  if (x > s.max) {  // a new maximum: what was summed is rescaled to it
    const double scale = static_cast<double>(device_exp<C>(s.max - x));
    s.sum = s.sum * scale + 1.0;
    s.weighted = s.weighted * scale + static_cast<double>(x);
    s.max = x;
  } else {
    const double e = static_cast<double>(device_exp<C>(x - s.max));
    s.sum += e;
    s.weighted += e * static_cast<double>(x);
  }
}

template <class C>
__device__ inline OnlineSoftmax<C> online_merge(OnlineSoftmax<C> a, const OnlineSoftmax<C>& b) {
  if (b.sum == 0.0) return a;  // b saw nothing
  if (a.sum == 0.0) return b;
  if (b.max > a.max) {
    const double scale = static_cast<double>(device_exp<C>(a.max - b.max));
    return {b.max, b.sum + a.sum * scale, b.weighted + a.weighted * scale};
  }
  const double scale = static_cast<double>(device_exp<C>(b.max - a.max));
  return {a.max, a.sum + b.sum * scale, a.weighted + b.weighted * scale};
}

// Merges every thread's state over the block, warps first, then the warps' results in warp order; thread 0 gets it.
template <class C>
__device__ inline OnlineSoftmax<C> block_merge(OnlineSoftmax<C> s) {
  constexpr int kWarps = kLogprobThreads / 32;
  __shared__ OnlineSoftmax<C> warps[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) {
    const OnlineSoftmax<C> other{__shfl_down_sync(0xffffffffu, s.max, offset),
                                 __shfl_down_sync(0xffffffffu, s.sum, offset),
                                 __shfl_down_sync(0xffffffffu, s.weighted, offset)};
    s = online_merge(s, other);
  }
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    s = warps[0];
    for (int w = 1; w < kWarps; ++w) s = online_merge(s, warps[w]);
  }
  return s;
}

template <class C, class T>
__global__ void __launch_bounds__(kLogprobThreads)
    softmax_statistics_kernel(const T* logits, int64_t vocab, const int64_t* targets, C* lse, C* chosen, C* mean) {
  const int64_t row = blockIdx.x;
  const T* z = logits + row * vocab;
  OnlineSoftmax<C> s{-INFINITY, 0.0, 0.0};
  for (int64_t j = threadIdx.x; j < vocab; j += kLogprobThreads) online_add(s, static_cast<C>(z[j]));
  s = block_merge(s);
  if (threadIdx.x != 0) return;
  lse[row] = static_cast<C>(static_cast<double>(s.max) + log(s.sum));
  chosen[row] = static_cast<C>(z[targets[row]]);
  if (mean != nullptr) mean[row] = static_cast<C>(s.weighted / s.sum);
}

template <class C, class T>
__global__ void __launch_bounds__(kLogprobThreads)
    logits_grad_kernel(T* logits, int64_t vocab, const int64_t* targets, const C* lse, const C* mean,
                       const C* grad_logp, const C* grad_entropy) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * vocab;
  const C row_lse = lse[row], row_mean = mean != nullptr ? mean[row] : C(0);
  const C g_logp = grad_logp != nullptr ? grad_logp[row] : C(0);
  const C g_entropy = grad_entropy != nullptr ? grad_entropy[row] : C(0);
  const int64_t target = targets[row];
  for (int64_t j = threadIdx.x; j < vocab; j += kLogprobThreads) {
    const C x = static_cast<C>(z[j]);
    const C p = device_exp<C>(x - row_lse);
    const C grad = -p * (g_entropy * (x - row_mean) + g_logp);
    z[j] = static_cast<T>(j == target ? grad + g_logp : grad);
  }
}

}  // namespace detail

// lse[r] = logsumexp(z_r), chosen[r] = z_r[targets[r]] and, when mean is not null, mean[r] = E_softmax(z_r)[z_r]:
// log p(target) = chosen - lse, entropy = lse - mean. Launched on `stream`; returns the launch's status.
template <class C, class T>
cudaError_t launch_softmax_statistics(const T* logits, int64_t rows, int64_t vocab, const int64_t* targets, C* lse,
                                      C* chosen, C* mean, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  detail::softmax_statistics_kernel<C, T>
      <<<static_cast<unsigned>(rows), kLogprobThreads, 0, stream>>>(logits, vocab, targets, lse, chosen, mean);
  return cudaGetLastError();
}

// In place: z_r <- grad_logp[r] * (onehot(targets[r]) - p) - grad_entropy[r] * p * (z_r - mean[r]), p = softmax(z_r),
// from the statistics launch_softmax_statistics wrote. grad_logp or grad_entropy (with mean) may be null: zero.
template <class C, class T>
cudaError_t launch_logprob_logits_grad(T* logits, int64_t rows, int64_t vocab, const int64_t* targets, const C* lse,
                                       const C* mean, const C* grad_logp, const C* grad_entropy, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (grad_entropy != nullptr && mean == nullptr) return cudaErrorInvalidValue;
  detail::logits_grad_kernel<C, T><<<static_cast<unsigned>(rows), kLogprobThreads, 0, stream>>>(
      logits, vocab, targets, lse, mean, grad_logp, grad_entropy);
  return cudaGetLastError();
}

}  // namespace dapo::cuda
