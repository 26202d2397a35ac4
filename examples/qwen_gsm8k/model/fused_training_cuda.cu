// The training forward's fused operators' CUDA kernels (model/fused_training_kernels.hpp). The norms read and write
// each tensor in its own dtype (a code passed at run time, the same for every thread: no divergence), so that one
// kernel serves autocast's mixed dtypes; the others are templated on their one dtype.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <cstdint>

#include "qwen_gsm8k/model/block_sum.cuh"
#include "qwen_gsm8k/model/fused_training_kernels.hpp"

namespace qwen::fused::training_kernels {
namespace {

constexpr int kThreads = 256;  // a multiple of the warp's 32

enum Code : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

int code(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? kBFloat16 : dtype == at::kHalf ? kFloat16 : kFloat32;
}

__device__ __forceinline__ float load(const void* data, int type, int64_t i) {
  switch (type) {
    case kBFloat16:
      return static_cast<float>(static_cast<const at::BFloat16*>(data)[i]);
    case kFloat16:
      return static_cast<float>(static_cast<const at::Half*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

__device__ __forceinline__ void store(void* data, int type, int64_t i, float value) {
  switch (type) {
    case kBFloat16:
      static_cast<at::BFloat16*>(data)[i] = static_cast<at::BFloat16>(value);
      break;
    case kFloat16:
      static_cast<at::Half*>(data)[i] = static_cast<at::Half>(value);
      break;
    default:
      static_cast<float*>(data)[i] = value;
  }
}

// value rounded to the dtype, as a tensor of that dtype stores it.
__device__ __forceinline__ float round_to(float value, int type) {
  switch (type) {
    case kBFloat16:
      return static_cast<float>(static_cast<at::BFloat16>(value));
    case kFloat16:
      return static_cast<float>(static_cast<at::Half>(value));
    default:
      return value;
  }
}

struct NormTypes {
  int x, sum, weight, out, product;  // product: the dtype of weight * normed before the cast to out
};

// One block per row: s = residual + x (stored in `sum`) or x; inverse = rsqrt(mean(s^2) + eps); normed = s inverse
// rounded to s's dtype; out = weight * normed rounded to the product's dtype, then to out's.
__global__ void rms_norm_forward_kernel(const void* x, const void* residual, const void* weight, void* out, void* sum,
                                        float* inverse, int64_t hidden, float eps, NormTypes types) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  float squares = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float value = load(x, types.x, offset + i);
    if (residual != nullptr) {
      value = round_to(load(residual, types.sum, offset + i) + value, types.sum);
      store(sum, types.sum, offset + i, value);
    }
    squares += value * value;
  }
  const float inv = rsqrtf(cuda::block_sum<kThreads>(squares) / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) inverse[blockIdx.x] = inv;
  const void* input = residual != nullptr ? sum : x;
  const int input_type = residual != nullptr ? types.sum : types.x;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {  // each thread reads back its own writes
    const float normed = round_to(load(input, input_type, offset + i) * inv, input_type);
    store(out, types.out, offset + i, round_to(load(weight, types.weight, i) * normed, types.product));
  }
}

// One block per row: n = x inverse, dn = dy weight, d x = inverse (dn - n mean(dn n)) (+ grad_sum), in x's dtype.
__global__ void rms_norm_backward_kernel(const void* grad, int grad_type, const void* grad_sum, int grad_sum_type,
                                         const void* x, int x_type, const void* weight, int weight_type,
                                         const float* inverse, void* grad_x, int64_t hidden) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  const float inv = inverse[blockIdx.x];
  float dot = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    dot += load(grad, grad_type, offset + i) * load(weight, weight_type, i) * (load(x, x_type, offset + i) * inv);
  }
  const float mean = cuda::block_sum<kThreads>(dot) / static_cast<float>(hidden);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float n = load(x, x_type, offset + i) * inv;
    const float dn = load(grad, grad_type, offset + i) * load(weight, weight_type, i);
    float value = inv * (dn - n * mean);
    if (grad_sum != nullptr) value += load(grad_sum, grad_sum_type, offset + i);
    store(grad_x, x_type, offset + i, value);
  }
}

// partials[slice, j] = the sum over the slice's rows r of dy[r, j] x[r, j] inverse[r]: a thread per column (reads
// coalesced along the row), blockIdx.y the slice; no atomics, so the sum's order is fixed.
__global__ void rms_norm_weight_partials_kernel(const void* grad, int grad_type, const void* x, int x_type,
                                                const float* inverse, float* partials, int64_t rows, int64_t hidden,
                                                int64_t rows_per_slice) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= hidden) return;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_slice;
  const int64_t last = first + rows_per_slice < rows ? first + rows_per_slice : rows;
  float total = 0;
  for (int64_t r = first; r < last; ++r) {
    total += load(grad, grad_type, r * hidden + column) * (load(x, x_type, r * hidden + column) * inverse[r]);
  }
  partials[static_cast<int64_t>(blockIdx.y) * hidden + column] = total;
}

// d gate = silu'(gate) (dy up), d up = dy silu(gate), each product stored in T first as ATen's calls store them.
template <typename T>
__global__ void silu_and_mul_backward_kernel(const T* grad, const T* gate_up, T* out, int64_t rows, int64_t width) {
  using Acc = at::opmath_type<T>;
  const int64_t total = rows * width;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / width, j = e % width;
    const Acc gate = static_cast<Acc>(gate_up[row * 2 * width + j]);
    const Acc up = static_cast<Acc>(gate_up[row * 2 * width + width + j]);
    const Acc dy = static_cast<Acc>(grad[e]);
    const Acc sigmoid = Acc(1) / (Acc(1) + exp(-gate));
    const T silu = static_cast<T>(gate / (Acc(1) + exp(-gate)));
    const Acc dy_up = static_cast<Acc>(static_cast<T>(dy * up));
    out[row * 2 * width + j] = static_cast<T>(dy_up * sigmoid * (Acc(1) + gate * (Acc(1) - sigmoid)));
    out[row * 2 * width + width + j] = static_cast<T>(dy * static_cast<Acc>(silu));
  }
}

struct RotaryLayout {
  int64_t batch, positions, heads, kv_heads, head_dim;
};

// Where head h's element d of token row (b, t) lives heads first: q for h < N, then k, then v.
__device__ __forceinline__ int64_t heads_first_index(const RotaryLayout& l, int64_t row, int64_t head, int64_t d,
                                                     int64_t group_heads, int64_t first_head) {
  const int64_t b = row / l.positions, t = row % l.positions;
  return ((b * group_heads + (head - first_head)) * l.positions + t) * l.head_dim + d;
}

// One block per token row: x cos + roll(x, D / 2) signed_sin on the rotated heads (each product stored, then the sum),
// the value heads copied; to `packed` [rows, W D] or heads first to q, k, v.
template <typename T>
__global__ void rotary_kernel(const T* product, const T* cos, const T* signed_sin, T* packed, T* q, T* k, T* v,
                              RotaryLayout l) {
  using Acc = at::opmath_type<T>;
  const int64_t row = blockIdx.x, rotated = l.heads + l.kv_heads, half = l.head_dim / 2;
  const int64_t width = (rotated + l.kv_heads) * l.head_dim;
  const T* in = product + row * width;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int64_t head = e / l.head_dim, d = e % l.head_dim;
    T value = in[e];
    if (head < rotated) {
      const T partner = in[head * l.head_dim + (d + half) % l.head_dim];
      const T straight = static_cast<T>(static_cast<Acc>(value) * static_cast<Acc>(cos[row * l.head_dim + d]));
      const T turned = static_cast<T>(static_cast<Acc>(partner) * static_cast<Acc>(signed_sin[row * l.head_dim + d]));
      value = static_cast<T>(static_cast<Acc>(straight) + static_cast<Acc>(turned));
    }
    if (packed != nullptr) {
      packed[row * width + e] = value;
    } else if (head < l.heads) {
      q[heads_first_index(l, row, head, d, l.heads, 0)] = value;
    } else if (head < rotated) {
      k[heads_first_index(l, row, head, d, l.kv_heads, l.heads)] = value;
    } else {
      v[heads_first_index(l, row, head, d, l.kv_heads, rotated)] = value;
    }
  }
}

// The gradient dy of head h's element d of token row (b, t), packed or heads first (a missing tensor: zero).
template <typename T>
__device__ __forceinline__ T gradient(const T* packed, const T* gq, const T* gk, const T* gv, const RotaryLayout& l,
                                      int64_t row, int64_t head, int64_t d) {
  const int64_t rotated = l.heads + l.kv_heads;
  if (packed != nullptr) return packed[(row * (rotated + l.kv_heads) + head) * l.head_dim + d];
  if (head < l.heads) return gq != nullptr ? gq[heads_first_index(l, row, head, d, l.heads, 0)] : T(0);
  if (head < rotated) return gk != nullptr ? gk[heads_first_index(l, row, head, d, l.kv_heads, l.heads)] : T(0);
  return gv != nullptr ? gv[heads_first_index(l, row, head, d, l.kv_heads, rotated)] : T(0);
}

// One block per token row: d x = dy cos + roll(dy signed_sin, D / 2) on the rotated heads (each product stored, then
// the sum, as the composite's calls), dy on the value heads.
template <typename T>
__global__ void rotary_backward_kernel(const T* packed, const T* gq, const T* gk, const T* gv, const T* cos,
                                       const T* signed_sin, T* grad_product, RotaryLayout l) {
  using Acc = at::opmath_type<T>;
  const int64_t row = blockIdx.x, rotated = l.heads + l.kv_heads, half = l.head_dim / 2;
  const int64_t width = (rotated + l.kv_heads) * l.head_dim;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int64_t head = e / l.head_dim, d = e % l.head_dim;
    const T dy = gradient(packed, gq, gk, gv, l, row, head, d);
    if (head >= rotated) {
      grad_product[row * width + e] = dy;
      continue;
    }
    const int64_t partner = (d + half) % l.head_dim;
    const T partner_dy = gradient(packed, gq, gk, gv, l, row, head, partner);
    const T straight = static_cast<T>(static_cast<Acc>(dy) * static_cast<Acc>(cos[row * l.head_dim + d]));
    const T turned =
        static_cast<T>(static_cast<Acc>(partner_dy) * static_cast<Acc>(signed_sin[row * l.head_dim + partner]));
    grad_product[row * width + e] = static_cast<T>(static_cast<Acc>(straight) + static_cast<Acc>(turned));
  }
}

unsigned blocks_for(int64_t elements) {
  const int64_t wanted = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65535 ? (wanted > 0 ? wanted : 1) : 65535);
}

template <typename T>
const T* optional_data(const torch::Tensor& tensor) {
  return tensor.defined() ? tensor.data_ptr<T>() : nullptr;
}

}  // namespace

bool takes(torch::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
}

void rms_norm_forward(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps,
                      const torch::Tensor& out, const torch::Tensor& sum, const torch::Tensor& inverse) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  if (rows == 0) return;
  const at::ScalarType input = residual.defined() ? sum.scalar_type() : x.scalar_type();
  const NormTypes types{code(x.scalar_type()), code(input), code(weight.scalar_type()), code(out.scalar_type()),
                        code(at::promoteTypes(weight.scalar_type(), input))};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());
  rms_norm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x.data_ptr(), residual.defined() ? residual.data_ptr() : nullptr, weight.data_ptr(), out.data_ptr(),
      residual.defined() ? sum.data_ptr() : nullptr, inverse.data_ptr<float>(), hidden, static_cast<float>(eps), types);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void rms_norm_backward(const torch::Tensor& grad, const torch::Tensor& grad_sum, const torch::Tensor& x,
                       const torch::Tensor& weight, const torch::Tensor& inverse, const torch::Tensor& grad_x,
                       const torch::Tensor& weight_partials) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  if (rows == 0) return;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());
  if (grad_x.defined()) {
    rms_norm_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        grad.data_ptr(), code(grad.scalar_type()), grad_sum.defined() ? grad_sum.data_ptr() : nullptr,
        grad_sum.defined() ? code(grad_sum.scalar_type()) : kFloat32, x.data_ptr(), code(x.scalar_type()),
        weight.data_ptr(), code(weight.scalar_type()), inverse.data_ptr<float>(), grad_x.data_ptr(), hidden);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (weight_partials.defined()) {
    const int64_t slices = weight_partials.size(0), rows_per_slice = (rows + slices - 1) / slices;
    const dim3 grid(static_cast<unsigned>((hidden + kThreads - 1) / kThreads), static_cast<unsigned>(slices));
    rms_norm_weight_partials_kernel<<<grid, kThreads, 0, stream>>>(
        grad.data_ptr(), code(grad.scalar_type()), x.data_ptr(), code(x.scalar_type()), inverse.data_ptr<float>(),
        weight_partials.data_ptr<float>(), rows, hidden, rows_per_slice);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

void silu_and_mul_backward(const torch::Tensor& grad, const torch::Tensor& gate_up, const torch::Tensor& out) {
  const c10::cuda::CUDAGuard guard(grad.device());
  const int64_t width = grad.size(-1), rows = grad.numel() / (width > 0 ? width : 1);
  if (grad.numel() == 0) return;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(grad.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "qwen::silu_and_mul_backward", [&] {
    silu_and_mul_backward_kernel<scalar_t><<<blocks_for(grad.numel()), kThreads, 0, stream>>>(
        grad.data_ptr<scalar_t>(), gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void rotary_qkv(const torch::Tensor& product, const torch::Tensor& cos, const torch::Tensor& signed_sin, int64_t batch,
                int64_t heads, int64_t kv_heads, const torch::Tensor& packed, const torch::Tensor& q,
                const torch::Tensor& k, const torch::Tensor& v) {
  const c10::cuda::CUDAGuard guard(product.device());
  const int64_t head_dim = cos.numel() / (product.numel() / product.size(-1));
  const int64_t rows = product.numel() / product.size(-1);
  if (rows == 0) return;
  const RotaryLayout layout{batch, rows / batch, heads, kv_heads, head_dim};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(product.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, product.scalar_type(), "qwen::rotary_qkv", [&] {
    rotary_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        product.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), signed_sin.data_ptr<scalar_t>(),
        packed.defined() ? packed.data_ptr<scalar_t>() : nullptr, packed.defined() ? nullptr : q.data_ptr<scalar_t>(),
        packed.defined() ? nullptr : k.data_ptr<scalar_t>(), packed.defined() ? nullptr : v.data_ptr<scalar_t>(),
        layout);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void rotary_qkv_backward(const torch::Tensor& packed, const torch::Tensor& grad_q, const torch::Tensor& grad_k,
                         const torch::Tensor& grad_v, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                         int64_t batch, int64_t heads, int64_t kv_heads, const torch::Tensor& grad_product) {
  const c10::cuda::CUDAGuard guard(grad_product.device());
  const int64_t rows = grad_product.numel() / grad_product.size(-1);
  if (rows == 0) return;
  const RotaryLayout layout{batch, rows / batch, heads, kv_heads, cos.numel() / rows};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(grad_product.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_product.scalar_type(), "qwen::rotary_qkv_backward", [&] {
        rotary_backward_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
            optional_data<scalar_t>(packed), optional_data<scalar_t>(grad_q), optional_data<scalar_t>(grad_k),
            optional_data<scalar_t>(grad_v), cos.data_ptr<scalar_t>(), signed_sin.data_ptr<scalar_t>(),
            grad_product.data_ptr<scalar_t>(), layout);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace qwen::fused::training_kernels
