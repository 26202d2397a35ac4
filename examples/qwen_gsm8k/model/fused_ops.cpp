// The fused operators: their dispatcher schemas (torch.ops.qwen.*), the composites every device runs, and the CUDA
// kernels' registration where they were built.
#include "qwen_gsm8k/model/fused_ops.hpp"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/version.h>

#include <tuple>
#include <vector>

#if DAPO_DRIVER_CUDA_KERNELS
#include "qwen_gsm8k/model/fused_kernels.hpp"
#endif

namespace qwen::fused {
namespace {

using torch::Tensor;

// The composites: the unfused path's ATen calls, in its order (the CPU's bits, and CUDA's for inputs the kernels do
// not take).
std::tuple<Tensor, Tensor> composite_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                                  double eps) {
  Tensor sum = residual + x;
  Tensor normed = rms_norm(sum, weight, eps);
  return {std::move(normed), std::move(sum)};
}

Tensor composite_silu_and_mul(const Tensor& gate_up) {
  const std::vector<Tensor> halves = gate_up.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

Tensor composite_rope_and_cache(const Tensor& qkv, const Tensor& cos, const Tensor& signed_sin, const Tensor& key_cache,
                                const Tensor& value_cache, const Tensor& rows, const Tensor& positions, int64_t heads,
                                int64_t kv_heads) {
  using torch::indexing::Slice;
  const int64_t batch = qkv.size(0), steps = qkv.size(1), head_dim = key_cache.size(3);
  // [R, 1, (N + 2 KV) D] -> heads [R, N + 2 KV, 1, D] (a view), RoPE on the query and key heads together.
  const Tensor heads_first = qkv.view({batch, steps, heads + 2 * kv_heads, head_dim}).transpose(1, 2);
  const std::vector<Tensor> qk_v = heads_first.split_with_sizes({heads + kv_heads, kv_heads}, 1);
  const std::vector<Tensor> q_k = rotary(qk_v[0], cos, signed_sin).split_with_sizes({heads, kv_heads}, 1);
  // Row r's key and value go to [rows[r], :, positions[r], :]: one indexed write per buffer.
  Tensor keys = key_cache,
         values = value_cache;  // handles to the same buffers (LibTorch 1.x's index_put_ is not const)
  keys.index_put_({rows, Slice(), positions}, q_k[1].squeeze(2));
  values.index_put_({rows, Slice(), positions}, qk_v[1].squeeze(2));
  return q_k[0];
}

void check_rope_and_cache(const Tensor& qkv, const Tensor& cos, const Tensor& key_cache, const Tensor& value_cache,
                          const Tensor& rows, const Tensor& positions, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() && key_cache.size(1) == kv_heads,
              "qwen::rope_and_cache: key_cache ", key_cache.sizes(), " and value_cache ", value_cache.sizes(),
              " must both be [S, ", kv_heads, ", C, D]");
  const int64_t head_dim = key_cache.size(3);
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(1) == 1 && qkv.size(2) == (heads + 2 * kv_heads) * head_dim,
              "qwen::rope_and_cache: qkv has shape ", qkv.sizes(), ", expected [R, 1, ", (heads + 2 * kv_heads), " x ",
              head_dim, "] (one decode position per row)");
  const int64_t batch = qkv.size(0);
  TORCH_CHECK(cos.dim() == 4 && cos.size(0) == batch && cos.size(3) == head_dim && head_dim % 2 == 0,
              "qwen::rope_and_cache: cos has shape ", cos.sizes(), ", expected [", batch, ", 1, 1, ", head_dim, "]");
  TORCH_CHECK(rows.dim() == 1 && rows.size(0) == batch && positions.sizes() == rows.sizes(),
              "qwen::rope_and_cache: rows ", rows.sizes(), " and positions ", positions.sizes(), " must be [", batch,
              "]");
}

std::tuple<Tensor, Tensor> composite_sample_tokens(const Tensor& logits, const c10::optional<Tensor>& uniforms,
                                                   double temperature) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && at::isFloatingType(logits.scalar_type()),
              "qwen::sample_tokens: logits have shape ", logits.sizes(), " and dtype ", logits.scalar_type(),
              ", expected [R, V] floating");
  TORCH_CHECK(temperature > 0, "qwen::sample_tokens: temperature is ", temperature, ", expected > 0");
  const bool greedy = !uniforms.has_value() || !uniforms->defined();
  TORCH_CHECK(
      greedy || (uniforms->dim() == 1 && uniforms->size(0) == logits.size(0) && uniforms->scalar_type() == at::kFloat),
      "qwen::sample_tokens: uniforms have shape ", (greedy ? logits.sizes() : uniforms->sizes()), ", expected [",
      logits.size(0), "] float32");
  // The casts and the division only where they change something (each is a pass over [R, V]).
  Tensor x = logits.scalar_type() == at::kFloat ? logits : logits.to(at::kFloat);
  if (temperature != 1.0) x = x / temperature;
  const Tensor logp = x.log_softmax(-1);
  Tensor token;
  if (greedy) {
    token = x.argmax(-1);
  } else {
    const Tensor cdf = logp.exp().cumsum(-1);  // [R, V] float32
    const int64_t vocab = cdf.size(1);
    const Tensor target = uniforms->unsqueeze(1) * cdf.narrow(1, vocab - 1, 1);
    token = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(vocab - 1);
  }
  Tensor logprob = logp.gather(1, token.unsqueeze(1)).squeeze(1);
  return {std::move(token), std::move(logprob)};
}

#if DAPO_DRIVER_CUDA_KERNELS
bool one_floating_dtype(std::initializer_list<const Tensor*> tensors) {
  const auto dtype = (*tensors.begin())->scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  for (const Tensor* tensor : tensors) {
    if (tensor->scalar_type() != dtype || !tensor->is_contiguous()) return false;
  }
  return true;
}

std::tuple<Tensor, Tensor> cuda_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                             double eps) {
  if (!one_floating_dtype({&x, &residual, &weight}) || x.sizes() != residual.sizes() || x.dim() == 0 ||
      weight.dim() != 1 || x.size(-1) != weight.size(0)) {
    return composite_add_rms_norm(x, residual, weight, eps);
  }
  Tensor normed = at::empty_like(x), sum = at::empty_like(x);
  kernels::add_rms_norm(x, residual, weight, eps, normed, sum);
  return {std::move(normed), std::move(sum)};
}

Tensor cuda_silu_and_mul(const Tensor& gate_up) {
  if (!one_floating_dtype({&gate_up}) || gate_up.dim() == 0 || gate_up.size(-1) % 2 != 0) {
    return composite_silu_and_mul(gate_up);
  }
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() /= 2;
  Tensor out = at::empty(shape, gate_up.options());
  kernels::silu_and_mul(gate_up, out);
  return out;
}

Tensor cuda_rope_and_cache(const Tensor& qkv, const Tensor& cos, const Tensor& signed_sin, const Tensor& key_cache,
                           const Tensor& value_cache, const Tensor& rows, const Tensor& positions, int64_t heads,
                           int64_t kv_heads) {
  check_rope_and_cache(qkv, cos, key_cache, value_cache, rows, positions, heads, kv_heads);
  const bool indices = rows.scalar_type() == at::kLong && positions.scalar_type() == at::kLong &&
                       rows.is_contiguous() && positions.is_contiguous();
  if (!indices || !one_floating_dtype({&qkv, &cos, &signed_sin, &key_cache, &value_cache})) {
    return composite_rope_and_cache(qkv, cos, signed_sin, key_cache, value_cache, rows, positions, heads, kv_heads);
  }
  Tensor query = at::empty({qkv.size(0), heads, 1, key_cache.size(3)}, qkv.options());
  kernels::rope_and_cache(qkv, cos, signed_sin, key_cache, value_cache, rows, positions, heads, kv_heads, query);
  return query;
}

std::tuple<Tensor, Tensor> cuda_sample_tokens(const Tensor& logits, const c10::optional<Tensor>& uniforms,
                                              double temperature) {
  const bool greedy = !uniforms.has_value() || !uniforms->defined();
  const bool taken = logits.dim() == 2 && logits.size(1) > 0 && temperature > 0 && one_floating_dtype({&logits}) &&
                     (greedy || (uniforms->dim() == 1 && uniforms->size(0) == logits.size(0) &&
                                 uniforms->scalar_type() == at::kFloat && uniforms->is_contiguous() &&
                                 uniforms->device() == logits.device()));
  if (!taken) return composite_sample_tokens(logits, uniforms, temperature);
  Tensor token = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  Tensor logprob = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  kernels::sample_tokens(logits, greedy ? Tensor() : *uniforms, temperature, token, logprob);
  return {std::move(token), std::move(logprob)};
}
#endif

Tensor composite_checked_rope_and_cache(const Tensor& qkv, const Tensor& cos, const Tensor& signed_sin,
                                        const Tensor& key_cache, const Tensor& value_cache, const Tensor& rows,
                                        const Tensor& positions, int64_t heads, int64_t kv_heads) {
  check_rope_and_cache(qkv, cos, key_cache, value_cache, rows, positions, heads, kv_heads);
  return composite_rope_and_cache(qkv, cos, signed_sin, key_cache, value_cache, rows, positions, heads, kv_heads);
}

}  // namespace

TORCH_LIBRARY(qwen, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def(
      "rope_and_cache(Tensor qkv, Tensor cos, Tensor signed_sin, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor rows, Tensor positions, int heads, int kv_heads) -> Tensor");
  m.def("sample_tokens(Tensor logits, Tensor? uniforms, float temperature) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(qwen, CompositeExplicitAutograd, m) {
  m.impl("add_rms_norm", &composite_add_rms_norm);
  m.impl("silu_and_mul", &composite_silu_and_mul);
  m.impl("rope_and_cache", &composite_checked_rope_and_cache);
  m.impl("sample_tokens", &composite_sample_tokens);
}

#if DAPO_DRIVER_CUDA_KERNELS
TORCH_LIBRARY_IMPL(qwen, CUDA, m) {
  m.impl("add_rms_norm", &cuda_add_rms_norm);
  m.impl("silu_and_mul", &cuda_silu_and_mul);
  m.impl("rope_and_cache", &cuda_rope_and_cache);
  m.impl("sample_tokens", &cuda_sample_tokens);
}
#endif

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // One operator (a fused kernel where LibTorch has one): the same formula, normalised in float32 and cast back
  // before the weight's product.
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
#else
  // The casts only where they change something (the residual stream is float32 under autocast too): a no-op to() is
  // still an operator call.
  const auto input_dtype = x.scalar_type();
  const bool cast = input_dtype != torch::kFloat32;
  const Tensor h = cast ? x.to(torch::kFloat32) : x;
  const Tensor normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * (cast ? normed.to(input_dtype) : normed);
#endif
}

Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& signed_sin) {
  return x * cos + x.roll(x.size(-1) / 2, -1) * signed_sin;  // roll by half a head: (x2, x1)
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("qwen::add_rms_norm", "")
                             .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double)>();
  auto [normed, sum] = op.call(x, residual, weight, eps);
  return {std::move(normed), std::move(sum)};
}

Tensor silu_and_mul(const Tensor& gate_up) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("qwen::silu_and_mul", "").typed<Tensor(const Tensor&)>();
  return op.call(gate_up);
}

Tensor rope_and_cache(const Tensor& qkv, const Tensor& cos, const Tensor& signed_sin, const Tensor& key_cache,
                      const Tensor& value_cache, const Tensor& rows, const Tensor& positions, int64_t heads,
                      int64_t kv_heads) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("qwen::rope_and_cache", "")
                             .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&, int64_t, int64_t)>();
  return op.call(qkv, cos, signed_sin, key_cache, value_cache, rows, positions, heads, kv_heads);
}

std::pair<Tensor, Tensor> sample_tokens(const Tensor& logits, const Tensor& uniforms, double temperature) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("qwen::sample_tokens", "")
                             .typed<std::tuple<Tensor, Tensor>(const Tensor&, const c10::optional<Tensor>&, double)>();
  auto [token, logprob] =
      op.call(logits, uniforms.defined() ? c10::optional<Tensor>(uniforms) : c10::optional<Tensor>(), temperature);
  return {std::move(token), std::move(logprob)};
}

bool cuda_kernels_built() {
#if DAPO_DRIVER_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace qwen::fused
