// The Qwen2 modules. Every numerical choice follows Hugging Face's modeling_qwen2 (eager attention), so logits match
// the reference within float32 rounding.
#include "qwen_gsm8k/model/model.hpp"

#include <torch/version.h>

#include <cmath>
#include <limits>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/batched_matmul.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"
#include "qwen_gsm8k/model/fused_training.hpp"
#include "qwen_gsm8k/model/gradient_checkpointing.hpp"
#include "qwen_gsm8k/model/host_door.hpp"

namespace qwen {

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return fused::rms_norm(x, weight, eps_);
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

namespace {

// RoPE's cos and sin [..., D] in `dtype`, sin's first half negated (fused::rotary's sign).
std::pair<torch::Tensor, torch::Tensor> rotary_input(const torch::Tensor& cos, const torch::Tensor& sin,
                                                     torch::ScalarType dtype) {
  const int64_t half = sin.size(-1) / 2;
  return {cos.to(dtype), torch::cat({-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)}, -1).to(dtype)};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> RotaryEmbeddingImpl::table(int64_t length, torch::ScalarType dtype) {
  std::pair<torch::Tensor, torch::Tensor>& kept = tables_[dtype];
  if (kept.first.defined() && kept.first.size(0) >= length) return kept;
  const torch::NoGradGuard no_grad;
  constexpr int64_t kStep = 256;
  const int64_t rows = (length + kStep - 1) / kStep * kStep;
  const auto [cos, sin] = forward(torch::arange(rows, inv_freq.options().dtype(torch::kInt64)));
  kept = rotary_input(cos, sin, dtype);
  return kept;
}

void RotaryEmbeddingImpl::to(torch::Device device, torch::Dtype /*dtype*/, bool non_blocking) {
  tables_.clear();
  torch::nn::Module::to(device, non_blocking);
}

void RotaryEmbeddingImpl::to(torch::Dtype /*dtype*/, bool /*non_blocking*/) {}

void RotaryEmbeddingImpl::to(torch::Device device, bool non_blocking) {
  tables_.clear();
  torch::nn::Module::to(device, non_blocking);
}

namespace {

// Scaled dot-product attention's own kernels: on CUDA, and on the CPU from LibTorch 2.14 (model.hpp).
bool sdpa_on(const torch::Device& device) {
#if TORCH_VERSION_MAJOR >= 2
  return uses_sdpa_on_cpu() || !device.is_cpu();
#else
  (void)device;
  return false;
#endif
}

#if TORCH_VERSION_MAJOR >= 2
// One scaled_dot_product_attention call as a layer makes it, so that attention_backend asks about the very call.
struct SdpaCall {
  torch::Tensor query, key, value, mask;
  bool causal = false, gqa = false;
};

// query [B, N, T, D]; key, value [B, KV, S, D]; mask as AttentionInputs (undefined: causal).
SdpaCall sdpa_call(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                   const torch::Tensor& mask, int64_t kv_heads) {
  const int64_t groups = query.size(1) / kv_heads;
  if (!mask.defined()) {
    // Causal and no mask: FlashAttention's case on CUDA (and the CPU's flash kernel), grouped heads read in place.
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
    return {query, key, value, {}, true, groups > 1};
#else
    return {query, repeat_kv(key, groups), repeat_kv(value, groups), {}, true, false};
#endif
  }
  // A mask (padding, or each decode row's own length): the query heads of a key/value head folded into the query
  // axis, [B, KV, G x T, D] against the shared [B, KV, S, D]: equal head counts, which every backend that takes a
  // mask accepts (the memory-efficient one on CUDA), no copy of K/V per group, no GQA support needed.
  return {
      query.reshape({query.size(0), kv_heads, groups * query.size(2), query.size(3)}), key, value, mask, false, false};
}

// The mask as SDPA takes it: no value at all for a causal call (an undefined tensor counts as a mask).
std::optional<torch::Tensor> sdpa_mask(const SdpaCall& call) {
  return call.mask.defined() ? std::optional<torch::Tensor>(call.mask) : std::nullopt;
}

torch::Tensor run_sdpa(const SdpaCall& call) {
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
  return at::scaled_dot_product_attention(call.query, call.key, call.value, sdpa_mask(call), 0.0, call.causal,
                                          std::nullopt, call.gqa);
#else
  return at::scaled_dot_product_attention(call.query, call.key, call.value, sdpa_mask(call), 0.0, call.causal);
#endif
}

int64_t sdpa_choice(const SdpaCall& call) {
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
  return at::_fused_sdp_choice(call.query, call.key, call.value, sdpa_mask(call), 0.0, call.causal, std::nullopt,
                               call.gqa);
#else
  return at::_fused_sdp_choice(call.query, call.key, call.value, sdpa_mask(call), 0.0, call.causal);
#endif
}
#endif

AttentionInputs attention_inputs(const torch::Tensor& mask, const torch::Tensor& cos, const torch::Tensor& sin,
                                 torch::ScalarType dtype, int64_t groups, int64_t positions);

// layer(x), reading the weight as autocast_weight gives it (no cast per decode step); the bias as it is. ATen's linear
// (torch.nn.functional.linear's, transformers'): one operator, and with a bias one addmm over the rows (LibTorch's C++
// functional::linear is matmul with weight.t(), then an add of the bias). The training forward's products with
// gradients: the same call, with its backward as one node (fused::linear).
torch::Tensor project(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return fused::linear(x, autocast_weight(layer->weight), layer->bias);
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
  qkv_ = FusedLinears({q_proj, k_proj, v_proj});
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& hidden, const AttentionInputs& inputs, AttentionCache* cache,
                                     int64_t layer) {
  const int64_t batch = hidden.size(0), positions = hidden.size(1);
  // One product for q, k and v: [B, T, (N + 2 KV) D].
  const torch::Tensor product = qkv_.forward(hidden);
  if (cache != nullptr) {
    // A decode step in the engine's cache: RoPE and the cache write in one operator.
    const AttentionCache::Operands fused =
        cache->rotate_and_update(layer, product, inputs.cos, inputs.sin, heads_, kv_heads_);
    if (fused.query.defined()) return project(o_proj, attend(fused.query, fused.keys, fused.values, inputs.mask));
  }
  if (cache == nullptr && fused::uses_fused_training(product)) {
    // The training forward: RoPE, heads first and the split in one operator with its own backward.
    const std::vector<torch::Tensor> q_k_v =
        fused::rotary_qkv_heads(product, inputs.cos, inputs.sin, heads_, kv_heads_);
    return project(o_proj, attend(q_k_v[0], q_k_v[1], q_k_v[2], inputs.mask));
  }
  // Heads [B, N + 2 KV, T, D] (a view).
  const torch::Tensor qkv = product.view({batch, positions, heads_ + 2 * kv_heads_, head_dim_}).transpose(1, 2);
  // RoPE on the query and key heads together, then the three as views (a split is one operator, a narrow each).
  const std::vector<torch::Tensor> qk_v = qkv.split_with_sizes({heads_ + kv_heads_, kv_heads_}, 1);
  const std::vector<torch::Tensor> q_k =
      fused::rotary(qk_v[0], inputs.cos, inputs.sin).split_with_sizes({heads_, kv_heads_}, 1);
  const torch::Tensor& query = q_k[0];  // [B, N, T, D]
  torch::Tensor key = q_k[1];           // [B, KV, T, D]
  torch::Tensor value = qk_v[1];
  if (cache != nullptr) std::tie(key, value) = cache->update(layer, key, value);  // [B, KV, S, D]

  return project(o_proj, attend(query, key, value, inputs.mask));
}

torch::Tensor AttentionImpl::attend(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                                    const torch::Tensor& mask) const {
  const int64_t batch = query.size(0), positions = query.size(2);
#if TORCH_VERSION_MAJOR >= 2
  if (sdpa_on(query.device())) {
    const torch::Tensor attended = run_sdpa(sdpa_call(query, key, value, mask, kv_heads_));
    // [B, N, T, D] (causal) or [B, KV, G T, D] (folded): the same order of heads, query head h = kv G + g. One
    // position (decode): that is already [B, 1, N D].
    if (positions == 1) return attended.reshape({batch, 1, heads_ * head_dim_});
    const torch::Tensor heads_first =
        attended.size(1) == heads_ ? attended : attended.reshape({batch, heads_, positions, head_dim_});
    return heads_first.transpose(1, 2).reshape({batch, positions, heads_ * head_dim_});
  }
#endif
  // Eager attention (LibTorch 1.x's only one, and the CPU's before 2.14: measured on 2 cores, docs/benchmarks.md,
  // LibTorch 2.6's SDPA takes twice the eager path's time in a decode step): scores in the weights' dtype, mask and
  // softmax in float32 (modeling_qwen2's eager path). The products are torch::matmul's with repeat_kv's heads, bit
  // for bit, without LibTorch 1.x's per-matrix overhead and, in generation, without copying the cache's heads
  // (batched_matmul.hpp).
  const torch::Tensor scores =
      grouped_matmul(query, key, /*transpose_shared=*/true) / std::sqrt(static_cast<double>(head_dim_));
  const torch::Tensor weights = torch::softmax(scores.to(torch::kFloat32) + mask, -1).to(query.scalar_type());
  const torch::Tensor attended = grouped_matmul(weights, value, /*transpose_shared=*/false);  // [B, N, T, D]
  return attended.transpose(1, 2).reshape({batch, positions, heads_ * head_dim_});
}

torch::Tensor AttentionImpl::forward_shared(const torch::Tensor& hidden, const SharedAttentionInputs& inputs) {
  const int64_t prompts = inputs.prompts, prompt_positions = inputs.prompt_positions;
  const int64_t responses = inputs.responses, response_positions = inputs.response_positions;
  const int64_t tokens = hidden.size(0), width = heads_ + 2 * kv_heads_;
  // As forward, with the packed tokens as one axis: [tokens, N + 2 KV, D], RoPE on the query and key heads.
  const torch::Tensor product = qkv_.forward(hidden);
  const auto rotate = [&] {
    if (fused::uses_fused_training(product)) {
      return fused::rotary_qkv(product, inputs.cos, inputs.sin, heads_, kv_heads_);
    }
    const std::vector<torch::Tensor> qk_v =
        product.view({tokens, width, head_dim_}).split_with_sizes({heads_ + kv_heads_, kv_heads_}, 1);
    return torch::cat({fused::rotary(qk_v[0], inputs.cos, inputs.sin), qk_v[1]}, 1);
  };
  const torch::Tensor rotated = rotate();
  if (inputs.varlen.defined()) {
    // The packed tokens as they are: each sequence's keys and values gathered ([keys, 2 KV, D]), one call.
    const VarlenInputs& varlen = inputs.varlen;
    const torch::Tensor query = rotated.narrow(1, 0, heads_);
    const torch::Tensor key_value = rotated.narrow(1, heads_, 2 * kv_heads_).index_select(0, varlen.key_tokens);
    const torch::Tensor key = key_value.narrow(1, 0, kv_heads_), value = key_value.narrow(1, kv_heads_, kv_heads_);
    const torch::Tensor out = inputs.varlen_reference ? varlen_attention_reference(query, key, value, varlen)
                                                      : varlen_attention(query, key, value, varlen);
    return project(o_proj, out.reshape({tokens, heads_ * head_dim_}));
  }
  // Padded for attention: [rows x positions, N + 2 KV, D], zero where no token is (those slots are masked or their
  // outputs dropped), then heads first, [rows, N + 2 KV, positions, D], split into q, k, v.
  const auto padded = [&](const torch::Tensor& packed, const torch::Tensor& slots, int64_t rows, int64_t positions) {
    const torch::Tensor layout =
        torch::zeros({rows * positions, width, head_dim_}, packed.options()).index_copy(0, slots, packed);
    return layout.view({rows, positions, width, head_dim_})
        .transpose(1, 2)
        .split_with_sizes({heads_, kv_heads_, kv_heads_}, 1);
  };
  // Back to the packed tokens: [rows, positions, N D] -> [tokens of those rows, N D].
  const auto packed = [&](const torch::Tensor& out, const torch::Tensor& slots) {
    return out.reshape({-1, heads_ * head_dim_}).index_select(0, slots);
  };
  const int64_t prompt_tokens = inputs.prompt_tokens;
  const std::vector<torch::Tensor> prompt =
      padded(rotated.narrow(0, 0, prompt_tokens), inputs.prompt_slots, prompts, prompt_positions);
  const torch::Tensor prompt_out =
      packed(attend(prompt[0], prompt[1], prompt[2], inputs.prompt_mask), inputs.prompt_slots);
  if (tokens <= prompt_tokens) return project(o_proj, prompt_out);
  const std::vector<torch::Tensor> response = padded(rotated.narrow(0, prompt_tokens, tokens - prompt_tokens),
                                                     inputs.response_slots, responses, response_positions);
  // Each row's keys and values: its prompt's P, then its own R.
  const torch::Tensor key = torch::cat({prompt[1].index_select(0, inputs.row_prompt), response[1]}, 2);
  const torch::Tensor value = torch::cat({prompt[2].index_select(0, inputs.row_prompt), response[2]}, 2);
  const torch::Tensor response_out =
      packed(attend(response[0], key, value, inputs.response_mask), inputs.response_slots);
  return project(o_proj, torch::cat({prompt_out, response_out}, 0));
}

MLPImpl::MLPImpl(const Config& config) {
  const auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", linear(config.hidden_size, config.intermediate_size));
  up_proj = register_module("up_proj", linear(config.hidden_size, config.intermediate_size));
  down_proj = register_module("down_proj", linear(config.intermediate_size, config.hidden_size));
  gate_up_ = FusedLinears({gate_proj, up_proj});
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  const torch::Tensor product = gate_up_.forward(x);
  if (fused::uses_fused_training(product)) return project(down_proj, fused::silu_and_mul_trained(product));
  const std::vector<torch::Tensor> gate_up = product.chunk(2, -1);  // [..., I] each
  return project(down_proj, torch::silu(gate_up[0]) * gate_up[1]);
}

torch::Tensor MLPImpl::forward_generating(const torch::Tensor& x) {
  return project(down_proj, fused::silu_and_mul(gate_up_.forward(x)));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& config) {
  self_attn = register_module("self_attn", Attention(config));
  mlp = register_module("mlp", MLP(config));
  input_layernorm = register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& hidden, const AttentionInputs& inputs,
                                        AttentionCache* cache, int64_t layer) {
  if (cache == nullptr && fused::uses_fused_training(hidden)) {
    return forward_fused(hidden,
                         [&](const torch::Tensor& normed) { return self_attn(normed, inputs, nullptr, layer); });
  }
  const torch::Tensor attended = hidden + self_attn(input_layernorm(hidden), inputs, cache, layer);
  return attended + mlp(post_attention_layernorm(attended));
}

std::pair<torch::Tensor, torch::Tensor> DecoderLayerImpl::forward_generating(const torch::Tensor& normed,
                                                                             const torch::Tensor& residual,
                                                                             const AttentionInputs& inputs,
                                                                             AttentionCache* cache, int64_t layer,
                                                                             const RMSNormImpl& next_norm) {
  const torch::Tensor attended = self_attn(normed, inputs, cache, layer);
  const auto [mlp_input, mid] =
      fused::add_rms_norm(attended, residual, post_attention_layernorm->weight, post_attention_layernorm->eps());
  return fused::add_rms_norm(mlp->forward_generating(mlp_input), mid, next_norm.weight, next_norm.eps());
}

torch::Tensor DecoderLayerImpl::forward_shared(const torch::Tensor& hidden, const SharedAttentionInputs& inputs) {
  if (fused::uses_fused_training(hidden)) {
    return forward_fused(hidden,
                         [&](const torch::Tensor& normed) { return self_attn->forward_shared(normed, inputs); });
  }
  const torch::Tensor attended = hidden + self_attn->forward_shared(input_layernorm(hidden), inputs);
  return attended + mlp(post_attention_layernorm(attended));
}

torch::Tensor DecoderLayerImpl::forward_fused(const torch::Tensor& hidden,
                                              const std::function<torch::Tensor(const torch::Tensor&)>& attention) {
  // The norms' outputs in the dtype the products compute in (autocast's cast of their input, made by the norm).
  const torch::ScalarType dtype =
      active_autocast_dtype(hidden.device())
          .value_or(c10::promoteTypes(hidden.scalar_type(), input_layernorm->weight.scalar_type()));
  const torch::Tensor attended =
      attention(fused::rms_norm_trained(hidden, input_layernorm->weight, input_layernorm->eps(), dtype));
  const auto [normed, mid] = fused::add_rms_norm_trained(attended, hidden, post_attention_layernorm->weight,
                                                         post_attention_layernorm->eps(), dtype);
  return mid + mlp(normed);
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

double mask_lowest(torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 ? -3.38e38
         : dtype == torch::kHalf   ? -65504.0
                                   : static_cast<double>(std::numeric_limits<float>::lowest());
}

namespace {

// The mask [B, 1, T, S] (float32, or undefined: causal) in the form the attention path takes (AttentionInputs::mask).
torch::Tensor mask_input(const torch::Tensor& mask, torch::ScalarType dtype, int64_t groups, int64_t positions,
                         torch::Device device) {
  if (sdpa_on(device)) {
    if (!mask.defined()) return {};  // is_causal
    // The float32 mask's lowest value overflows 16-bit floats to -inf (NaN for a fully padded row): clamp first. A
    // mask made in `dtype` with mask_lowest(dtype) (the engine's decode steps) is taken as it is.
    torch::Tensor cast = mask.scalar_type() == dtype ? mask : mask.clamp_min(mask_lowest(dtype)).to(dtype);
    // Folded query heads (AttentionImpl): row g T + t of a key/value head is query head g's position t.
    if (groups > 1 && positions > 1) cast = cast.repeat({1, 1, groups, 1});
    return cast;
  }
  if (mask.defined()) return mask;
  // causal: query t sees keys s <= t; one [1, 1, T, T] for every row
  return torch::full({positions, positions}, std::numeric_limits<float>::lowest(),
                     torch::TensorOptions().device(device).dtype(torch::kFloat32))
      .triu(1)
      .view({1, 1, positions, positions});
}

// cos, sin and the mask as every layer reads them (AttentionInputs), made once per forward. `dtype`: what the
// projections compute in (autocast's dtype where it is on, else the weights').
AttentionInputs attention_inputs(const torch::Tensor& mask, const torch::Tensor& cos, const torch::Tensor& sin,
                                 torch::ScalarType dtype, int64_t groups, int64_t positions) {
  AttentionInputs inputs;
  std::tie(inputs.cos, inputs.sin) = rotary_input(cos.unsqueeze(1), sin.unsqueeze(1), dtype);
  inputs.mask = mask_input(mask, dtype, groups, positions, cos.device());
  return inputs;
}

}  // namespace

torch::Tensor Qwen2ModelImpl::forward_with_mask(const torch::Tensor& input_ids, const torch::Tensor& mask,
                                                const torch::Tensor& position_ids, AttentionCache* cache) {
  TORCH_CHECK(position_ids.sizes() == input_ids.sizes(), "position_ids has shape ", position_ids.sizes(),
              " but input_ids has ", input_ids.sizes());
  TORCH_CHECK(
      !mask.defined() || (mask.dim() == 4 && mask.size(0) == input_ids.size(0) && mask.size(2) == input_ids.size(1)),
      "mask has shape ", mask.sizes(), ", expected [B, 1, T, S] for input_ids ", input_ids.sizes());
  TORCH_CHECK(mask.defined() || cache == nullptr, "forward_with_mask: causal attention without a mask takes no cache");
  torch::Tensor hidden = embed_tokens(input_ids);
  const torch::ScalarType dtype = active_autocast_dtype(hidden.device()).value_or(hidden.scalar_type());
  const int64_t groups = config_.num_attention_heads / config_.num_key_value_heads;
  if (cache != nullptr && !torch::GradMode::is_enabled()) {
    // Generation: each position's cos and sin gathered from the kept table (a position a cache holds is below the
    // mask's S), not computed and cast at every step; the same values.
    const auto [cos_table, sin_table] = rotary_emb->table(mask.size(3), dtype);
    AttentionInputs inputs;
    inputs.cos = at::embedding(cos_table, position_ids).unsqueeze(1);  // [B, 1, T, D]
    inputs.sin = at::embedding(sin_table, position_ids).unsqueeze(1);
    inputs.mask = mask_input(mask, dtype, groups, input_ids.size(1), hidden.device());
    return forward_generating(hidden, inputs, cache);
  }
  const auto [cos, sin] = rotary_emb(position_ids);
  const AttentionInputs inputs = attention_inputs(mask, cos, sin, dtype, groups, input_ids.size(1));
  const bool checkpoint = gradient_checkpointing_ && cache == nullptr && torch::GradMode::is_enabled();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::shared_ptr<DecoderLayerImpl> layer = layers->ptr<DecoderLayerImpl>(static_cast<std::size_t>(i));
    if (checkpoint) {
      const auto run = [layer, inputs, i](const torch::Tensor& x) { return layer->forward(x, inputs, nullptr, i); };
      hidden = checkpointed(run, hidden, layer->parameters());
    } else {
      hidden = layer->forward(hidden, inputs, cache, i);
    }
  }
  return norm(hidden);
}

// Generation (a cache, no gradients): the layers carry the residual stream beside its normed form, each residual add
// fused with the next norm, the first layer's input norm alone, the last layer's add fused with the final norm.
torch::Tensor Qwen2ModelImpl::forward_generating(const torch::Tensor& hidden, const AttentionInputs& inputs,
                                                 AttentionCache* cache) {
  const auto layer = [&](int64_t i) { return layers->ptr<DecoderLayerImpl>(static_cast<std::size_t>(i)); };
  torch::Tensor residual = hidden;
  torch::Tensor normed = layer(0)->input_layernorm(hidden);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const RMSNormImpl& next_norm = i + 1 < config_.num_hidden_layers ? *layer(i + 1)->input_layernorm : *norm;
    std::tie(normed, residual) = layer(i)->forward_generating(normed, residual, inputs, cache, i, next_norm);
  }
  return normed;
}

namespace {

// The int64 values of a 1-d tensor, on the host (a counted read when it is on a device).
std::vector<int64_t> host_values(const torch::Tensor& tensor) {
  const torch::Tensor host = host_door::on_host(tensor).to(torch::kInt64).contiguous();
  return {host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel()};
}

}  // namespace

torch::Tensor Qwen2ModelImpl::forward_shared(const SharedPromptBatch& batch) {
  const torch::Tensor& prompt_ids = batch.prompt_ids;
  const torch::Tensor& response_ids = batch.response_ids;
  TORCH_CHECK(prompt_ids.dim() == 2 && prompt_ids.size(0) > 0 && prompt_ids.size(1) > 0,
              "forward_shared: prompt_ids has shape ", prompt_ids.sizes(), ", expected [Pn, P] with Pn, P >= 1");
  TORCH_CHECK(response_ids.dim() == 2, "forward_shared: response_ids has shape ", response_ids.sizes(),
              ", expected [Rn, R]");
  const int64_t prompts = prompt_ids.size(0), prompt_positions = prompt_ids.size(1);
  const int64_t responses = response_ids.size(0), response_positions = response_ids.size(1);
  const auto sized = [](const torch::Tensor& tensor, int64_t count, const char* name) {
    TORCH_CHECK(tensor.dim() == 1 && tensor.size(0) == count, "forward_shared: ", name, " has shape ", tensor.sizes(),
                ", expected [", count, "]");
    return host_values(tensor);
  };
  const std::vector<int64_t> prompt_lengths = sized(batch.prompt_lengths, prompts, "prompt_lengths");
  const std::vector<int64_t> response_lengths = sized(batch.response_lengths, responses, "response_lengths");
  const std::vector<int64_t> row_prompt = sized(batch.row_prompt, responses, "row_prompt");
  // The packed tokens (real ones: each prompt's, then each response row's), their positions, and their slots in the
  // padded [Pn x P] and [Rn x R] layouts.
  std::vector<int64_t> prompt_slots, response_slots, positions;
  for (int64_t p = 0; p < prompts; ++p) {
    const int64_t length = prompt_lengths[static_cast<std::size_t>(p)];
    TORCH_CHECK(length >= 1 && length <= prompt_positions, "forward_shared: prompt ", p, " has length ", length,
                ", expected 1..", prompt_positions);
    for (int64_t s = 0; s < length; ++s) {
      prompt_slots.push_back(p * prompt_positions + s);
      positions.push_back(s);
    }
  }
  for (int64_t r = 0; r < responses; ++r) {
    const int64_t length = response_lengths[static_cast<std::size_t>(r)], p = row_prompt[static_cast<std::size_t>(r)];
    TORCH_CHECK(length >= 0 && length <= response_positions, "forward_shared: response ", r, " has length ", length,
                ", expected 0..", response_positions);
    TORCH_CHECK(p >= 0 && p < prompts, "forward_shared: response ", r, " continues prompt ", p, ", expected 0..",
                prompts - 1);
    for (int64_t k = 0; k < length; ++k) {
      response_slots.push_back(r * response_positions + k);
      positions.push_back(prompt_lengths[static_cast<std::size_t>(p)] + k);
    }
  }
  const auto device = embed_tokens->weight.device();
  const auto on = torch::TensorOptions().device(device).dtype(torch::kInt64);
  const auto to_device = [&](const std::vector<int64_t>& values) { return host_door::to_device(values, device); };
  // The batch's tensors are the host's (shared_prompt_batch): each goes to the device once, through host_door.
  const auto on_device = [&](const torch::Tensor& tensor) { return host_door::on_device(tensor, device); };
  SharedAttentionInputs inputs;
  inputs.prompts = prompts;
  inputs.prompt_positions = prompt_positions;
  inputs.responses = responses;
  inputs.response_positions = response_positions;
  inputs.prompt_tokens = static_cast<int64_t>(prompt_slots.size());
  inputs.prompt_slots = to_device(prompt_slots);
  inputs.response_slots = to_device(response_slots);
  inputs.row_prompt = to_device(row_prompt);
  const torch::Tensor ids = torch::cat({on_device(prompt_ids).reshape({-1}).index_select(0, inputs.prompt_slots),
                                        on_device(response_ids).reshape({-1}).index_select(0, inputs.response_slots)});
  torch::Tensor hidden = embed_tokens(ids);                               // [tokens, H]
  const auto [cos, sin] = rotary_emb(to_device(positions).unsqueeze(0));  // [1, tokens, D]
  const torch::ScalarType dtype = active_autocast_dtype(device).value_or(hidden.scalar_type());
  const int64_t groups = config_.num_attention_heads / config_.num_key_value_heads;
  std::tie(inputs.cos, inputs.sin) = rotary_input(cos.squeeze(0).unsqueeze(1), sin.squeeze(0).unsqueeze(1), dtype);
  const SharedAttention attention = shared_attention_choice();
  if (attention == SharedAttention::kReference ||
      (attention == SharedAttention::kAuto &&
       varlen_attention_usable(device, dtype, config_.num_attention_heads, config_.num_key_value_heads,
                               config_.head_dim()))) {
    inputs.varlen = varlen_inputs(shared_prompt_layout(prompt_lengths, response_lengths, row_prompt), device);
    inputs.varlen_reference = attention == SharedAttention::kReference;
  } else {
    inputs.prompt_mask = mask_input(torch::Tensor(), dtype, groups, prompt_positions, device);
  }
  if (!inputs.varlen.defined() && responses > 0 && response_positions > 0) {
    // Response query t of row r sees its prompt's real keys (s < its length) and its own keys 0..t.
    const torch::Tensor row_lengths = on_device(batch.prompt_lengths).index_select(0, inputs.row_prompt);  // [Rn]
    const torch::Tensor prompt_keys =
        (torch::arange(prompt_positions, on).unsqueeze(0) < row_lengths.unsqueeze(1))  // [Rn, P]
            .unsqueeze(1)
            .expand({responses, response_positions, prompt_positions});
    const torch::Tensor own_keys =
        (torch::arange(response_positions, on).unsqueeze(0) <= torch::arange(response_positions, on).unsqueeze(1))
            .unsqueeze(0)
            .expand({responses, response_positions, response_positions});
    const torch::Tensor allowed = torch::cat({prompt_keys, own_keys}, 2).unsqueeze(1);  // [Rn, 1, R, P + R]
    const torch::Tensor mask =
        torch::zeros(allowed.sizes(), torch::TensorOptions().device(device).dtype(torch::kFloat32))
            .masked_fill(~allowed, std::numeric_limits<float>::lowest());
    inputs.response_mask = mask_input(mask, dtype, groups, response_positions, device);
  }
  const bool checkpoint = gradient_checkpointing_ && torch::GradMode::is_enabled();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::shared_ptr<DecoderLayerImpl> layer = layers->ptr<DecoderLayerImpl>(static_cast<std::size_t>(i));
    if (checkpoint) {
      const auto run = [layer, inputs](const torch::Tensor& x) { return layer->forward_shared(x, inputs); };
      hidden = checkpointed(run, hidden, layer->parameters());
    } else {
      hidden = layer->forward_shared(hidden, inputs);
    }
  }
  return norm(hidden);
}

int64_t attention_backend(const Config& config, int64_t batch, int64_t positions, int64_t keys, bool masked,
                          torch::TensorOptions options) {
#if TORCH_VERSION_MAJOR >= 2
  if (!sdpa_on(options.device())) return -1;
  const torch::NoGradGuard no_grad;
  const int64_t heads = config.num_attention_heads, kv_heads = config.num_key_value_heads, dim = config.head_dim();
  // The layer's tensors with their layouts: q and k slices of the rotated heads, v a slice of the q/k/v product,
  // and with a mask, keys and values read from a cache of 2 S positions.
  const torch::Tensor qkv = torch::zeros({batch, positions, heads + 2 * kv_heads, dim}, options).transpose(1, 2);
  const torch::Tensor rotated = qkv.narrow(1, 0, heads + kv_heads).contiguous();
  torch::Tensor key = rotated.narrow(1, heads, kv_heads), value = qkv.narrow(1, heads + kv_heads, kv_heads);
  torch::Tensor mask;
  const torch::Tensor angles = torch::zeros({batch, positions, dim}, options.dtype(torch::kFloat32));
  if (masked) {
    key = torch::zeros({batch, kv_heads, 2 * keys, dim}, options).narrow(2, 0, keys);
    value = torch::zeros({batch, kv_heads, 2 * keys, dim}, options).narrow(2, 0, keys);
    mask = torch::zeros({batch, 1, positions, keys}, options.dtype(torch::kFloat32));
  }
  const AttentionInputs inputs =
      attention_inputs(mask, angles, angles, options.dtype().toScalarType(), heads / kv_heads, positions);
  return sdpa_choice(sdpa_call(rotated.narrow(1, 0, heads), key, value, inputs.mask, kv_heads));
#else
  (void)config, (void)batch, (void)positions, (void)keys, (void)masked, (void)options;
  return -1;
#endif
}

bool right_padded(const torch::Tensor& attention_mask) {
  TORCH_CHECK(attention_mask.dim() == 2, "right_padded: attention_mask has shape ", attention_mask.sizes(),
              ", expected [B, S]");
  if (attention_mask.size(1) < 2) return true;
  const torch::Tensor mask = attention_mask.to(torch::kBool);
  // No real token after padding: mask[:, s + 1] implies mask[:, s].
  return !(mask.narrow(1, 1, mask.size(1) - 1) & ~mask.narrow(1, 0, mask.size(1) - 1)).any().item<bool>();
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

torch::Tensor Qwen2ForCausalLMImpl::right_padded_hidden_states(const torch::Tensor& input_ids,
                                                               const torch::Tensor& attention_mask,
                                                               const torch::Tensor& position_ids) {
  TORCH_CHECK(attention_mask.sizes() == input_ids.sizes(), "attention_mask has shape ", attention_mask.sizes(),
              " but input_ids has ", input_ids.sizes());
  return model->forward_with_mask(input_ids, torch::Tensor(), position_ids, nullptr);
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
  // The [V, H] matrix cast once per autocast region (autocast_weight), not at every decode step as autocast casts
  // matmul's weight.t() (a view, which it never caches). linear is matmul with weight.t(): the same products.
  return at::linear(hidden, autocast_weight(lm_head_weight()));
}

torch::Tensor Qwen2ForCausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

}  // namespace qwen
