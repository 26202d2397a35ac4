// torch.ops.dapo: the library's fused policy loss and chunked lm-head log-probs registered with PyTorch's dispatcher,
// for Python (the dapo package in python/dapo) and TorchScript. A thin binding: each op fills the library's options
// and calls its LibTorch front end, which validates every argument (errors name it and its shape; Python sees a
// ValueError), computes on the CPU kernel or the CUDA one (linked in when LibTorch has CUDA: dapo::torch carries it)
// and builds its own autograd node. Registered as composite (CompositeImplicitAutograd): the front end records the
// graph itself, so the ops are differentiable like any PyTorch function.
//
// Shapes: B = rows (responses), T = response tokens, N = tokens, H = hidden size, V = vocabulary.
#include <torch/library.h>
#include <dapo/logprob.hpp>
#include <dapo/loss.hpp>

#include <string>
#include <tuple>

namespace {

using Tensor = at::Tensor;

// Argument names are those of dapo::PolicyLossOptions (docs/library.md); python/dapo/__init__.py maps verl's names
// (clip_ratio_low, clip_ratio_c, ...) onto them.
std::tuple<Tensor, Tensor, Tensor, Tensor> policy_loss(
    const Tensor& old_log_prob,   // [B, T]
    const Tensor& log_prob,       // [B, T], differentiable
    const Tensor& advantages,     // [B, T] or [B]
    const Tensor& response_mask,  // [B, T], bool or floating 0/1
    const std::string& loss_mode, const std::string& loss_agg_mode, double clip_low, double clip_high, double dual_clip,
    double delta, double ratio_cap, double tau_pos, double tau_neg, double dro_beta, double kl_cov_ratio,
    double ppo_kl_coef, double clip_cov_ratio, double clip_cov_lb, double clip_cov_ub, int64_t group_size,
    double norm_length, double global_token_count, double global_group_count, double global_row_count,
    double count_epsilon,
    const c10::optional<Tensor>& weights,  // [B, T] per-token loss weights (verl's rollout_is_weights) or None
    const c10::optional<at::Generator>& generator) {
  dapo::PolicyLossOptions options;
  options.mode = dapo::policy_loss_from_name(loss_mode);
  options.aggregation = dapo::aggregation_from_name(loss_agg_mode);
  options.clip_low = clip_low;
  options.clip_high = clip_high;
  options.dual_clip = dual_clip;
  options.delta = delta;
  options.ratio_cap = ratio_cap;
  options.tau_pos = tau_pos;
  options.tau_neg = tau_neg;
  options.dro_beta = dro_beta;
  options.kl_cov_ratio = kl_cov_ratio;
  options.ppo_kl_coef = ppo_kl_coef;
  options.clip_cov_ratio = clip_cov_ratio;
  options.clip_cov_lb = clip_cov_lb;
  options.clip_cov_ub = clip_cov_ub;
  options.group_size = group_size;
  options.norm_length = norm_length;
  options.global_token_count = global_token_count;
  options.global_group_count = global_group_count;
  options.global_row_count = global_row_count;
  options.count_epsilon = count_epsilon;
  const dapo::PolicyLossOutput out = dapo::policy_loss(log_prob, old_log_prob, advantages, response_mask, options,
                                                       weights.has_value() ? *weights : Tensor(),
                                                       generator.has_value() ? *generator : at::Generator());
  return {out.loss, out.clip_fraction, out.approx_kl, out.dual_clip_fraction};
}

// log p(targets | hidden @ weight.T / temperature) [N] and, with with_entropy, the entropy [N] (else an empty
// tensor), without the [N, V] logits.
std::tuple<Tensor, Tensor> linear_logprobs(const Tensor& hidden,   // [N, H], differentiable
                                           const Tensor& weight,   // [V, H], differentiable
                                           const Tensor& targets,  // [N] int64
                                           int64_t chunk_size, double temperature, bool with_entropy) {
  dapo::LinearLogprobOptions options;
  options.chunk_size = chunk_size;
  options.temperature = temperature;
  options.with_entropy = with_entropy;
  const dapo::LinearLogprobOutput out = dapo::linear_logprobs(hidden, weight, targets, options);
  return {out.logp, out.entropy.defined() ? out.entropy : at::empty({0}, out.logp.options())};
}

}  // namespace

TORCH_LIBRARY(dapo, m) {
  m.def(
      "policy_loss(Tensor old_log_prob, Tensor log_prob, Tensor advantages, Tensor response_mask, str loss_mode, "
      "str loss_agg_mode, float clip_low, float clip_high, float dual_clip, float delta, float ratio_cap, "
      "float tau_pos, float tau_neg, float dro_beta, float kl_cov_ratio, float ppo_kl_coef, float clip_cov_ratio, "
      "float clip_cov_lb, float clip_cov_ub, int group_size, float norm_length, float global_token_count, "
      "float global_group_count, float global_row_count, float count_epsilon, Tensor? weights, "
      "Generator? generator) -> (Tensor loss, Tensor pg_clipfrac, Tensor ppo_kl, Tensor pg_clipfrac_lower)",
      &policy_loss);
  m.def(
      "linear_logprobs(Tensor hidden, Tensor weight, Tensor targets, int chunk_size, float temperature, "
      "bool with_entropy) -> (Tensor log_prob, Tensor entropy)",
      &linear_logprobs);
}
