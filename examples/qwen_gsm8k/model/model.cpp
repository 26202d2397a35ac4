// The Qwen2 modules. Every numerical choice follows Hugging Face's modeling_qwen2 (eager attention), so logits match
// the reference within float32 rounding.
#include "qwen_gsm8k/model/model.hpp"

#include <torch/version.h>

#include <cmath>
#include <limits>

#include "qwen_gsm8k/model/batched_matmul.hpp"
#include "qwen_gsm8k/model/gradient_checkpointing.hpp"

namespace qwen {

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  const auto input_dtype = x.scalar_type();
  const torch::Tensor h = x.to(torch::kFloat32);
  const torch::Tensor normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(input_dtype);
}

RotaryEmbeddingImpl::RotaryEmbeddingImpl(int64_t head_dim, double theta) {
  const torch::Tensor exponents = torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) / head_dim;
  inv_freq = register_buffer("inv_freq", 1.0 / torch::pow(theta, exponents));
}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbeddingImpl::forward(const torch::Tensor& position_ids) const {
  TORCH_CHECK(inv_freq.device() == position_ids.device(), "rotary_emb: position_ids are on ", position_ids.device(),
              " but the model is on ", inv_freq.device(), " (move the model with model->to(device))");
  const torch::Tensor frequencies = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [B, T, D / 2]
  const torch::Tensor angles = torch::cat({frequencies, frequencies}, -1);                      // [B, T, D]
  return {angles.cos(), angles.sin()};
}

void RotaryEmbeddingImpl::to(torch::Device device, torch::Dtype /*dtype*/, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
}

void RotaryEmbeddingImpl::to(torch::Dtype /*dtype*/, bool /*non_blocking*/) {}

void RotaryEmbeddingImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
}

namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {  // [..., D]: (x1, x2) -> (-x2, x1)
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;  // x [B, N, T, D]; cos, sin [B, 1, T, D]
}

}  // namespace

AttentionImpl::AttentionImpl(const Config& config)
    : heads_(config.num_attention_heads), kv_heads_(config.num_key_value_heads), head_dim_(config.head_dim()) {
  const int64_t hidden = config.hidden_size;
  q_proj =
      register_module("q_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, heads_ * head_dim_).bias(true)));
  k_proj =
      register_module("k_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, kv_heads_ * head_dim_).bias(true)));
  v_proj =
      register_module("v_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, kv_heads_ * head_dim_).bias(true)));
  o_proj =
      register_module("o_proj", torch::nn::Linear(torch::nn::LinearOptions(heads_ * head_dim_, hidden).bias(false)));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                                     const torch::Tensor& mask, AttentionCache* cache, int64_t layer) {
  const int64_t batch = hidden.size(0), positions = hidden.size(1);
  torch::Tensor query = q_proj(hidden).view({batch, positions, heads_, head_dim_}).transpose(1, 2);   // [B, N, T, D]
  torch::Tensor key = k_proj(hidden).view({batch, positions, kv_heads_, head_dim_}).transpose(1, 2);  // [B, KV, T, D]
  torch::Tensor value = v_proj(hidden).view({batch, positions, kv_heads_, head_dim_}).transpose(1, 2);
  const torch::Tensor cos_h = cos.unsqueeze(1).to(query.scalar_type()),
                      sin_h = sin.unsqueeze(1).to(query.scalar_type());
  query = apply_rotary(query, cos_h, sin_h);
  key = apply_rotary(key, cos_h, sin_h);
  if (cache != nullptr) std::tie(key, value) = cache->update(layer, key, value);  // [B, KV, S, D]

  // On CUDA, and on CPU from LibTorch 2.14, scaled_dot_product_attention. On CPU before that, the eager products:
  // measured on 2 cores (docs/benchmarks.md), LibTorch 2.6's SDPA takes twice the eager path's time in a decode step,
  // 2.14's is faster than it. The eager path is LibTorch 1.x's only one.
  torch::Tensor attended;
#if TORCH_VERSION_MAJOR >= 2
  constexpr bool kSdpaOnCpu = uses_sdpa_on_cpu();
  if (kSdpaOnCpu || !query.device().is_cpu()) {
    // The float32 mask's lowest value overflows 16-bit floats to -inf (NaN for a fully padded row): clamp first.
    const double lowest = query.scalar_type() == torch::kBFloat16 ? -3.38e38
                          : query.scalar_type() == torch::kHalf
                              ? -65504.0
                              : static_cast<double>(std::numeric_limits<float>::lowest());
    const torch::Tensor attention_mask = mask.clamp_min(lowest).to(query.scalar_type());
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
    // Grouped-query attention inside SDPA: the backends that support it read the shared K/V heads in place, the
    // others expand them themselves; no copy of the whole cache per decode step here.
    attended = at::scaled_dot_product_attention(query, key, value, attention_mask, 0.0, false, std::nullopt,
                                                /*enable_gqa=*/heads_ != kv_heads_);
#else
    attended = at::scaled_dot_product_attention(query, repeat_kv(key, heads_ / kv_heads_),
                                                repeat_kv(value, heads_ / kv_heads_), attention_mask);
#endif
    return o_proj(attended.transpose(1, 2).reshape({batch, positions, heads_ * head_dim_}));
  }
#endif
  // Eager attention: scores in the weights' dtype, mask and softmax in float32 (modeling_qwen2's eager path). The
  // products are torch::matmul's with repeat_kv's heads, bit for bit, without LibTorch 1.x's per-matrix overhead
  // and, in generation, without copying the cache's heads (batched_matmul.hpp).
  const torch::Tensor scores =
      grouped_matmul(query, key, /*transpose_shared=*/true) / std::sqrt(static_cast<double>(head_dim_));
  const torch::Tensor weights = torch::softmax(scores.to(torch::kFloat32) + mask, -1).to(query.scalar_type());
  attended = grouped_matmul(weights, value, /*transpose_shared=*/false);  // [B, N, T, D]
  return o_proj(attended.transpose(1, 2).reshape({batch, positions, heads_ * head_dim_}));
}

MLPImpl::MLPImpl(const Config& config) {
  const auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", linear(config.hidden_size, config.intermediate_size));
  up_proj = register_module("up_proj", linear(config.hidden_size, config.intermediate_size));
  down_proj = register_module("down_proj", linear(config.intermediate_size, config.hidden_size));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& config) {
  self_attn = register_module("self_attn", Attention(config));
  mlp = register_module("mlp", MLP(config));
  input_layernorm = register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                                        const torch::Tensor& mask, AttentionCache* cache, int64_t layer) {
  const torch::Tensor attended = hidden + self_attn(input_layernorm(hidden), cos, sin, mask, cache, layer);
  return attended + mlp(post_attention_layernorm(attended));
}

torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask) {
  const torch::Tensor mask = attention_mask.to(torch::kInt64);
  return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1);
}

Qwen2ModelImpl::Qwen2ModelImpl(const Config& config) : config_(config) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(DecoderLayer(config));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  rotary_emb = register_module("rotary_emb", RotaryEmbedding(config.head_dim(), config.rope_theta));
}

torch::Tensor Qwen2ModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                      const torch::Tensor& position_ids, KVCache* cache) {
  const int64_t positions = input_ids.size(1), total = attention_mask.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;
  TORCH_CHECK(total == past + positions, "attention_mask covers ", total, " positions but the cache holds ", past,
              " and ", positions, " are new");
  // Additive mask [B, 1, T, S]: query t (absolute position past + t) sees key s <= past + t that is not padding.
  const auto device = input_ids.device();
  const torch::Tensor causal = torch::arange(total, torch::TensorOptions().device(device)).unsqueeze(0) <=
                               (torch::arange(positions, torch::TensorOptions().device(device)) + past).unsqueeze(1);
  const torch::Tensor allowed =
      causal.unsqueeze(0).unsqueeze(0) & attention_mask.to(torch::kBool).unsqueeze(1).unsqueeze(1);
  const torch::Tensor mask = torch::zeros(allowed.sizes(), torch::TensorOptions().device(device).dtype(torch::kFloat32))
                                 .masked_fill(~allowed, std::numeric_limits<float>::lowest());
  torch::Tensor hidden = forward_with_mask(input_ids, mask, position_ids, cache);
  if (cache != nullptr) cache->advance(positions);
  return hidden;
}

torch::Tensor Qwen2ModelImpl::forward_with_mask(const torch::Tensor& input_ids, const torch::Tensor& mask,
                                                const torch::Tensor& position_ids, AttentionCache* cache) {
  TORCH_CHECK(position_ids.sizes() == input_ids.sizes(), "position_ids has shape ", position_ids.sizes(),
              " but input_ids has ", input_ids.sizes());
  TORCH_CHECK(mask.dim() == 4 && mask.size(0) == input_ids.size(0) && mask.size(2) == input_ids.size(1),
              "mask has shape ", mask.sizes(), ", expected [B, 1, T, S] for input_ids ", input_ids.sizes());
  torch::Tensor hidden = embed_tokens(input_ids);
  const auto [cos, sin] = rotary_emb(position_ids);
  const bool checkpoint = gradient_checkpointing_ && cache == nullptr && torch::GradMode::is_enabled();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::shared_ptr<DecoderLayerImpl> layer = layers->ptr<DecoderLayerImpl>(static_cast<std::size_t>(i));
    if (checkpoint) {
      const auto run = [layer, cos = cos, sin = sin, mask, i](const torch::Tensor& x) {
        return layer->forward(x, cos, sin, mask, nullptr, i);
      };
      hidden = checkpointed(run, hidden, layer->parameters());
    } else {
      hidden = layer->forward(hidden, cos, sin, mask, cache, i);
    }
  }
  return norm(hidden);
}

Qwen2ForCausalLMImpl::Qwen2ForCausalLMImpl(const Config& config) : config_(config) {
  model = register_module("model", Qwen2Model(config));
  if (!config.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
}

torch::Tensor Qwen2ForCausalLMImpl::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                  const torch::Tensor& position_ids, KVCache* cache) {
  return model(input_ids, attention_mask, position_ids, cache);
}

torch::Tensor Qwen2ForCausalLMImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                            const torch::Tensor& position_ids, KVCache* cache) {
  return logits(hidden_states(input_ids, attention_mask, position_ids, cache));
}

torch::Tensor Qwen2ForCausalLMImpl::last_logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                const torch::Tensor& position_ids, KVCache* cache) {
  return logits(hidden_states(input_ids, attention_mask, position_ids, cache).select(1, -1));
}

torch::Tensor Qwen2ForCausalLMImpl::logits(const torch::Tensor& hidden) const {
  return torch::matmul(hidden, lm_head_weight().t());
}

torch::Tensor Qwen2ForCausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

}  // namespace qwen
