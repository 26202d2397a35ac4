// Qwen2 / Qwen2.5 decoder-only transformer in LibTorch, module for module as Hugging Face's modeling_qwen2, with the
// same child names, so named_parameters() are the checkpoint's tensor names ("model.layers.0.self_attn.q_proj.weight").
// RMSNorm and the attention softmax run in float32 whatever the weights' dtype; RoPE is rotate-half; K/V heads are
// shared by groups of query heads (GQA). Not a training framework: the loss lives in dapo, the loop in the trainer.
//
// Shapes: B = batch, T = new positions, S = all positions (cache + new), H = hidden, N = query heads,
// KV = key/value heads, D = head dimension, V = vocabulary.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/model/fused_linear.hpp"
#include "qwen_gsm8k/model/kv_cache.hpp"
#include "qwen_gsm8k/model/varlen_attention.hpp"

namespace qwen {

// Whether the CPU's attention is LibTorch's scaled_dot_product_attention (from 2.14) or the eager products (before),
// which keep the attention probabilities for the backward: the memory plan counts them.
constexpr bool uses_sdpa_on_cpu() {
  return TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14);
}

// The value that masks a position in an additive attention mask of `dtype`: float32's lowest, or a value that
// 16-bit floats hold (float32's lowest overflows them to -inf, and a fully masked row to NaN).
double mask_lowest(torch::ScalarType dtype);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);  // [..., H] -> [..., H], normalised in float32
  double eps() const { return eps_; }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// RoPE's inverse frequencies as a buffer ("rotary_emb.inv_freq", as in Hugging Face, where it is not persistent: not in
// the checkpoint), so that model->to(device) moves it with the weights and a forward never copies it from the host.
// It stays float32 whatever dtype the model is cast to (the angles are computed in float32, as Hugging Face does).
class RotaryEmbeddingImpl : public torch::nn::Module {
 public:
  RotaryEmbeddingImpl(int64_t head_dim, double theta);
  // cos, sin [B, T, D] for position_ids [B, T], in float32.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& position_ids) const;
  // cos and signed sin (sin's first half negated, as fused::rotary takes it) [L, D] in `dtype`, L >= length: rows
  // [0, L) as forward computes them for those positions, cast as the layers take them. Made once per dtype and kept
  // (remade only for a longer one, in steps of 256 positions; dropped by a device move), so that generation gathers
  // a row per position (vLLM's cos/sin cache) instead of computing and casting them at every step. The generation
  // engine sizes it for its slots before any graph is captured: the graphs read it where it is.
  std::pair<torch::Tensor, torch::Tensor> table(int64_t length, torch::ScalarType dtype);

  // Device moves only: the buffer keeps float32 under to(dtype).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  torch::Tensor inv_freq;  // [D / 2] float32

 private:
  std::map<torch::ScalarType, std::pair<torch::Tensor, torch::Tensor>> tables_;  // table(), by dtype
};
TORCH_MODULE(RotaryEmbedding);

// What every layer's attention reads, prepared once per forward (not in each layer): RoPE's cos and sin in the
// dtype the projections compute in, and the mask in the form the attention path takes.
struct AttentionInputs {
  torch::Tensor cos, sin;  // [B, 1, T, D]; sin's first half negated (rotate_half's sign, applied to sin once)
  // The additive mask: [B, 1, T, S] float32 for the eager products; for scaled_dot_product_attention in the compute
  // dtype, and [B, 1, G x T, S] when T > 1 (query heads folded: see AttentionImpl). Undefined: causal attention with
  // no padding mask (is_causal), rows right-padded or unpadded, no cache.
  torch::Tensor mask;
};

// What every layer's attention reads in a shared-prompt forward (Qwen2ModelImpl::forward_shared). The tokens are
// packed, real ones only: every prompt's, then every response row's. Attention sees them as they are where
// FlashAttention's variable-length call runs (CUDA, half precision: varlen_attention.hpp), and elsewhere padded:
// prompts as [Pn, P] and responses as [Rn, R], right-padded, through the packed index of each padded slot.
struct SharedAttentionInputs {
  torch::Tensor cos, sin;  // [tokens, 1, D], as AttentionInputs' (sin's first half negated)
  int64_t prompts = 0, prompt_positions = 0, responses = 0, response_positions = 0;  // Pn, P, Rn, R
  int64_t prompt_tokens = 0;  // the packed prompt tokens (the response rows' come after them)
  // Slot s of the padded [Pn x P] (or [Rn x R]) layout, for each packed prompt (response) token, on the device.
  torch::Tensor prompt_slots, response_slots;
  torch::Tensor row_prompt;  // [Rn] int64 on the device: each response row's prompt
  // The prompts' causal attention (undefined for SDPA's is_causal), and the responses' mask over [their prompt's P
  // keys, their own R keys] (padding of the prompt and the future masked), both as AttentionInputs::mask.
  torch::Tensor prompt_mask, response_mask;
  // Where defined, attention takes the packed tokens as they are instead (varlen_attention.hpp: no padding, no
  // mask; the masks and padded layouts above are not made): each prompt and each response row one sequence.
  VarlenInputs varlen;
  bool varlen_reference = false;  // varlen_attention_reference instead of the kernel (SharedAttention::kReference)
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const Config& config);
  // hidden [B, T, H]; cache may be null.
  torch::Tensor forward(const torch::Tensor& hidden, const AttentionInputs& inputs, AttentionCache* cache,
                        int64_t layer);
  // hidden [tokens, H] packed as SharedAttentionInputs says: the prompts attend causally to themselves, each response
  // row to its prompt's keys and values (gathered per row, so the gradient through them is the sum of the rows') and
  // to its own causal past. Returns [tokens, H].
  torch::Tensor forward_shared(const torch::Tensor& hidden, const SharedAttentionInputs& inputs);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  // query [B, N, T, D] against key, value [B, KV, S, D] with `mask` (AttentionInputs::mask) -> [B, T, N D]
  torch::Tensor attend(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                       const torch::Tensor& mask) const;
  int64_t heads_, kv_heads_, head_dim_;
  FusedLinears qkv_;  // q_proj, k_proj, v_proj as one product
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x)), gate and up as one product
  // The same with silu and the product as one operator (fused::silu_and_mul): generation only, no autograd.
  torch::Tensor forward_generating(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  FusedLinears gate_up_;
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& hidden, const AttentionInputs& inputs, AttentionCache* cache,
                        int64_t layer);
  torch::Tensor forward_shared(const torch::Tensor& hidden, const SharedAttentionInputs& inputs);
  // The generation path (a cache, no gradients), as vLLM runs a layer: it takes its input normed (normed) beside the
  // residual stream (residual) and returns the same pair for the next layer, next_norm (the next layer's input norm,
  // or the model's final norm) applied; each residual add is fused with the norm after it (fused::add_rms_norm).
  // The same arithmetic as forward, in other operators.
  std::pair<torch::Tensor, torch::Tensor> forward_generating(const torch::Tensor& normed, const torch::Tensor& residual,
                                                             const AttentionInputs& inputs, AttentionCache* cache,
                                                             int64_t layer, const RMSNormImpl& next_norm);
  // The training forward's form (fused_training.hpp: under autocast, and on CUDA): the norms and the residual add
  // before the MLP's norm as fused operators with their own backward, the norms' outputs in the products' dtype.
  // attention(normed) is the attention block's output.
  torch::Tensor forward_fused(const torch::Tensor& hidden,
                              const std::function<torch::Tensor(const torch::Tensor&)>& attention);
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// Positions from an attention mask, as Hugging Face generation does for left-padded batches: cumsum(mask) - 1, with 1
// at padded slots. attention_mask [B, S] (0/1) -> [B, S] int64.
torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask);

// Whether every row of attention_mask [B, S] (0/1) has its real tokens first: no 1 after a 0. Reads the values (a
// device synchronisation off the CPU: pass the host copy where there is one).
bool right_padded(const torch::Tensor& attention_mask);

// Rows that share prompts, for one forward with each prompt computed once (the training forward of a group's G
// responses: verl's PrefixGrouper). Every response row sits after its prompt: positions prompt length + k.
struct SharedPromptBatch {
  torch::Tensor prompt_ids;        // [Pn, P] int64, each prompt's real tokens first (right padding)
  torch::Tensor prompt_lengths;    // [Pn] int64: real tokens of each prompt, 1..P
  torch::Tensor response_ids;      // [Rn, R] int64, right-padded
  torch::Tensor response_lengths;  // [Rn] int64: real tokens of each response, 0..R
  torch::Tensor row_prompt;        // [Rn] int64: the prompt each response row continues, 0..Pn-1
};

class Qwen2ModelImpl : public torch::nn::Module {
 public:
  explicit Qwen2ModelImpl(const Config& config);
  // input_ids [B, T]; attention_mask [B, S] over cache + new positions (1 = real token); position_ids [B, T].
  // Returns the final-normed hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& position_ids, KVCache* cache = nullptr);
  // The same with the additive mask [B, 1, T, S] given (float32: 0 where query t may see key s, the lowest float
  // where not) and any cache, which this call does not advance: the generation engine's slot cache, where every
  // sequence has its own length. An undefined mask (no cache): causal attention alone, for rows whose real tokens
  // come first (right padding): their outputs are those of the padding mask; padded positions compute garbage.
  torch::Tensor forward_with_mask(const torch::Tensor& input_ids, const torch::Tensor& mask,
                                  const torch::Tensor& position_ids, AttentionCache* cache);
  // The final-normed hidden states of a SharedPromptBatch's real tokens, packed [sum of prompt lengths + sum of
  // response lengths, H]: every prompt's tokens in order, then every response row's. They are what each row's own
  // forward (prompt + response, right-padded) gives, within rounding. The per-token work (norms, products) runs on
  // these tokens only, no padding; attention on padded views of them. Gradient checkpointing as in forward.
  torch::Tensor forward_shared(const SharedPromptBatch& batch);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  RotaryEmbedding rotary_emb{nullptr};
  // Gradient checkpointing per decoder layer (gradient_checkpointing.hpp): with gradients and no KV cache, each layer
  // keeps only its input and is recomputed in the backward; the gradients are the same. Off by default.
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

 private:
  torch::Tensor forward_generating(const torch::Tensor& hidden, const AttentionInputs& inputs, AttentionCache* cache);
  Config config_;
  bool gradient_checkpointing_ = false;
};
TORCH_MODULE(Qwen2Model);

// The backend scaled_dot_product_attention picks for this model's attention call as a layer makes it
// (at::_fused_sdp_choice: PyTorch's SDPBackend, 0 math, 1 flash, 2 memory-efficient, 3 cuDNN), or -1 where the layers
// do not call it (LibTorch 1.x; the CPU before 2.14: eager products). masked false: the training forward's causal
// call without a mask, B rows of T positions; true: a call with a mask (prefill, decode: T new positions of B rows
// against S keys in a cache). Tensors of `options`' dtype and device.
int64_t attention_backend(const Config& config, int64_t batch, int64_t positions, int64_t keys, bool masked,
                          torch::TensorOptions options);

class Qwen2ForCausalLMImpl : public torch::nn::Module {
 public:
  explicit Qwen2ForCausalLMImpl(const Config& config);
  // Logits [B, T, V] in the weights' dtype; arguments as Qwen2Model::forward.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& position_ids, KVCache* cache = nullptr);
  // Logits [B, V] of the last position only: forward(...).select(1, -1) without the lm-head product over the other
  // positions (a prefill's T x V products, of which generation reads one row). The hidden states are the same bits;
  // the lm-head product has B rows instead of B x T, which BLAS may sum in another order (OpenBLAS's Haswell kernels
  // do), so the logits agree within float32 rounding, not always bit for bit.
  torch::Tensor last_logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                            const torch::Tensor& position_ids, KVCache* cache = nullptr);
  // The last hidden states [B, T, H] (for chunked log-probs: dapo::linear_logprobs with lm_head_weight()).
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const torch::Tensor& position_ids, KVCache* cache = nullptr);
  // The same for rows whose real tokens come first (right padding: see right_padded; the caller's promise): causal
  // attention without a padding mask, which fused attention kernels take (FlashAttention takes no mask). Real
  // positions get hidden_states(...)'s values (bit for bit on the eager path, within rounding through
  // scaled_dot_product_attention); padded positions get garbage.
  torch::Tensor right_padded_hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                           const torch::Tensor& position_ids);
  // Logits [..., V] of hidden states [..., H]: the lm-head product, the one place it is written.
  torch::Tensor logits(const torch::Tensor& hidden) const;
  // [V, H]: lm_head.weight, or the embedding matrix when the embeddings are tied.
  torch::Tensor lm_head_weight() const;
  const Config& config() const { return config_; }

  Qwen2Model model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  Config config_;
};
TORCH_MODULE(Qwen2ForCausalLM);

}  // namespace qwen
