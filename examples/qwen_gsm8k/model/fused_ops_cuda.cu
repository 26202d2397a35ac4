// The fused operators' CUDA kernels (model/fused_kernels.hpp). Each rounds where the unfused ATen calls round (every
// elementwise result stored in the tensors' dtype, computed in float32 as ATen's opmath does), so a kernel computes
// what the composite it replaces computes, bar the norm's sum order and the exponential's last bits.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <cstdint>

#include "qwen_gsm8k/model/block_sum.cuh"
#include "qwen_gsm8k/model/fused_kernels.hpp"

namespace qwen::fused::kernels {
namespace {

constexpr int kThreads = 256;  // a multiple of the warp's 32

// One block per row: sum = residual + x (stored), then Qwen2RMSNorm of the stored sum: normalised in float32, cast
// back, times the weight.
template <typename T>
__global__ void add_rms_norm_kernel(const T* x, const T* residual, const T* weight, T* normed, T* sum, int64_t hidden,
                                    float eps) {
  using Acc = at::opmath_type<T>;
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  Acc squares = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const T total = static_cast<T>(static_cast<Acc>(residual[offset + i]) + static_cast<Acc>(x[offset + i]));
    sum[offset + i] = total;
    const Acc value = static_cast<Acc>(total);
    squares += value * value;
  }
  const Acc inverse = rsqrt(cuda::block_sum<kThreads>(squares) / static_cast<Acc>(hidden) + static_cast<Acc>(eps));
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {  // each thread reads back its own writes
    const T scaled = static_cast<T>(static_cast<Acc>(sum[offset + i]) * inverse);
    normed[offset + i] = static_cast<T>(static_cast<Acc>(weight[i]) * static_cast<Acc>(scaled));
  }
}

// out[r, j] = silu(gate_up[r, j]) * gate_up[r, I + j], the silu stored before the product as ATen's two calls do.
template <typename T>
__global__ void silu_and_mul_kernel(const T* gate_up, T* out, int64_t rows, int64_t width) {
  using Acc = at::opmath_type<T>;
  const int64_t total = rows * width;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / width, j = e % width;
    const Acc gate = static_cast<Acc>(gate_up[row * 2 * width + j]);
    const T silu = static_cast<T>(gate / (Acc(1) + exp(-gate)));
    out[e] = static_cast<T>(static_cast<Acc>(silu) * static_cast<Acc>(gate_up[row * 2 * width + width + j]));
  }
}

struct CacheLayout {
  int64_t slot, head, position;  // strides of [S, KV, C, D] (D's is 1)
};

// One block per row: RoPE on the row's query and key heads (x * cos + roll(x, D / 2) * signed_sin, each product
// stored, then the sum), the query to `query`, the key and the value to the cache at [rows[r], h, positions[r], :].
template <typename T>
__global__ void rope_and_cache_kernel(const T* qkv, const T* cos, const T* signed_sin, T* key_cache, T* value_cache,
                                      const int64_t* rows, const int64_t* positions, T* query, int64_t heads,
                                      int64_t kv_heads, int64_t head_dim, CacheLayout cache) {
  using Acc = at::opmath_type<T>;
  const int64_t row = blockIdx.x, width = (heads + 2 * kv_heads) * head_dim, half = head_dim / 2;
  const T* in = qkv + row * width;
  const int64_t base = rows[row] * cache.slot + positions[row] * cache.position;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int64_t head = e / head_dim, d = e % head_dim;
    if (head >= heads + kv_heads) {
      value_cache[base + (head - heads - kv_heads) * cache.head + d] = in[e];
      continue;
    }
    const T partner = in[head * head_dim + (d + half) % head_dim];
    const T straight = static_cast<T>(static_cast<Acc>(in[e]) * static_cast<Acc>(cos[row * head_dim + d]));
    const T turned = static_cast<T>(static_cast<Acc>(partner) * static_cast<Acc>(signed_sin[row * head_dim + d]));
    const T rotated = static_cast<T>(static_cast<Acc>(straight) + static_cast<Acc>(turned));
    if (head < heads) {
      query[(row * heads + head) * head_dim + d] = rotated;
    } else {
      key_cache[base + (head - heads) * cache.head + d] = rotated;
    }
  }
}

constexpr int kSampleThreads = 1024;

// A thread's or a block's view of a row: the online softmax's running max and its sum of exp(x - max), and the
// argmax (the first index of the largest value). A plain aggregate (no constructor), so that it can live in shared
// memory; empty() is the view of no element.
struct RowSummary {
  float max, sum;
  float best;
  int64_t best_index;

  __device__ static RowSummary empty() { return {-INFINITY, 0.0f, -INFINITY, INT64_MAX}; }

  __device__ void add(float value, int64_t index) {
    if (value > best || (value == best && index < best_index)) {
      best = value;
      best_index = index;
    }
    if (value == -INFINITY) return;  // probability 0
    if (value > max) {
      sum = sum * expf(max - value) + 1.0f;
      max = value;
    } else {
      sum += expf(value - max);
    }
  }
  __device__ void merge(const RowSummary& other) {
    if (other.best > best || (other.best == best && other.best_index < best_index)) {
      best = other.best;
      best_index = other.best_index;
    }
    if (other.max == -INFINITY) return;
    if (max == -INFINITY) {
      max = other.max;
      sum = other.sum;
    } else if (other.max > max) {
      sum = sum * expf(max - other.max) + other.sum;
      max = other.max;
    } else {
      sum += other.sum * expf(other.max - max);
    }
  }
  __device__ RowSummary shuffled(int offset) const {
    RowSummary other = empty();
    other.max = __shfl_xor_sync(0xffffffffu, max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, sum, offset);
    other.best = __shfl_xor_sync(0xffffffffu, best, offset);
    other.best_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    return other;
  }
};

// The whole block's summary, returned to every thread.
__device__ RowSummary block_summary(RowSummary mine) {
  __shared__ RowSummary partial[kSampleThreads / 32];
  __shared__ RowSummary total;
  for (int offset = 16; offset > 0; offset /= 2) mine.merge(mine.shuffled(offset));
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) partial[warp] = mine;
  __syncthreads();
  if (warp == 0) {
    mine = lane < static_cast<int>(blockDim.x) / 32 ? partial[lane] : RowSummary::empty();
    for (int offset = 16; offset > 0; offset /= 2) mine.merge(mine.shuffled(offset));
    if (lane == 0) total = mine;
  }
  __syncthreads();
  return total;
}

// One block per row. The first read: max, sum and argmax of x = logits / T (online softmax). Greedy: the argmax.
// Sampling, the second read: each thread sums exp(x - max) over its own contiguous chunk; thread 0 lays the chunks'
// sums end to end in order (prefix[t], one float chain, so the chunks' intervals [prefix[t], prefix[t + 1]) tile
// [0, total) with no gap or overlap); target = u x total, below total for u <= 1 - 2^-23; the one thread whose
// interval holds the target walks its chunk to the first token whose running sum exceeds it (else, where its own
// rounding fell short, its chunk's last token of positive probability). The log-prob: x[token] - max - log(sum).
template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_tokens_kernel(const T* logits, const float* uniforms, int64_t vocab, float temperature, int64_t* token,
                         float* logprob) {
  __shared__ float chunk_sums[kSampleThreads];
  __shared__ float prefix[kSampleThreads + 1];
  __shared__ int64_t chosen;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  const bool scale = temperature != 1.0f;
  const auto value = [&](int64_t i) {
    const float v = static_cast<float>(x[i]);
    return scale ? v / temperature : v;
  };
  RowSummary mine = RowSummary::empty();
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mine.add(value(i), i);
  const RowSummary all = block_summary(mine);
  int64_t picked = all.best_index;
  if (uniforms != nullptr) {
    const int64_t threads = blockDim.x, chunk = (vocab + threads - 1) / threads;
    const int64_t begin = min(vocab, static_cast<int64_t>(threadIdx.x) * chunk), end = min(vocab, begin + chunk);
    float own = 0;
    for (int64_t i = begin; i < end; ++i) own += expf(value(i) - all.max);
    chunk_sums[threadIdx.x] = own;
    if (threadIdx.x == 0) chosen = -1;
    __syncthreads();
    if (threadIdx.x == 0) {
      float running = 0;
      for (int64_t t = 0; t < threads; ++t) {
        prefix[t] = running;
        running += chunk_sums[t];
      }
      prefix[threads] = running;
    }
    __syncthreads();
    const float target = uniforms[row] * prefix[threads];
    if (prefix[threadIdx.x] <= target && target < prefix[threadIdx.x + 1]) {
      float running = prefix[threadIdx.x];
      int64_t found = -1, last_positive = -1;
      for (int64_t i = begin; i < end; ++i) {
        const float p = expf(value(i) - all.max);
        if (p > 0) last_positive = i;
        running += p;
        if (target < running) {
          found = i;
          break;
        }
      }
      chosen = found >= 0 ? found : last_positive;
    }
    __syncthreads();
    if (chosen >= 0) picked = chosen;  // else a row with no finite total (NaN logits): its argmax
  }
  if (picked < 0 || picked >= vocab) picked = vocab - 1;  // a row of NaNs only
  if (threadIdx.x == 0) {
    token[row] = picked;
    logprob[row] = value(picked) - all.max - logf(all.sum);
  }
}

unsigned blocks_for(int64_t elements) {
  const int64_t wanted = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65535 ? (wanted > 0 ? wanted : 1) : 65535);
}

}  // namespace

void add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps,
                  const torch::Tensor& normed, const torch::Tensor& sum) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  if (rows == 0) return;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "qwen::add_rms_norm", [&] {
    add_rms_norm_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), normed.data_ptr<scalar_t>(),
        sum.data_ptr<scalar_t>(), hidden, static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void silu_and_mul(const torch::Tensor& gate_up, const torch::Tensor& out) {
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const int64_t width = out.size(-1), rows = out.numel() / (width > 0 ? width : 1);
  if (out.numel() == 0) return;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(gate_up.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gate_up.scalar_type(), "qwen::silu_and_mul", [&] {
    silu_and_mul_kernel<scalar_t><<<blocks_for(out.numel()), kThreads, 0, stream>>>(
        gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                    const torch::Tensor& key_cache, const torch::Tensor& value_cache, const torch::Tensor& rows,
                    const torch::Tensor& positions, int64_t heads, int64_t kv_heads, const torch::Tensor& query) {
  const c10::cuda::CUDAGuard guard(qkv.device());
  const int64_t batch = qkv.size(0);
  if (batch == 0) return;
  const CacheLayout layout{key_cache.stride(0), key_cache.stride(1), key_cache.stride(2)};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(qkv.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, qkv.scalar_type(), "qwen::rope_and_cache", [&] {
    rope_and_cache_kernel<scalar_t><<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
        qkv.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), signed_sin.data_ptr<scalar_t>(),
        key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(), rows.data_ptr<int64_t>(),
        positions.data_ptr<int64_t>(), query.data_ptr<scalar_t>(), heads, kv_heads, key_cache.size(3), layout);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void sample_tokens(const torch::Tensor& logits, const torch::Tensor& uniforms, double temperature,
                   const torch::Tensor& token, const torch::Tensor& logprob) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logits.device().index());
  const float* draws = uniforms.defined() ? uniforms.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "qwen::sample_tokens", [&] {
    sample_tokens_kernel<scalar_t><<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
        logits.data_ptr<scalar_t>(), draws, vocab, static_cast<float>(temperature), token.data_ptr<int64_t>(),
        logprob.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace qwen::fused::kernels
