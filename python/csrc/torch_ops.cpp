// torch.ops.dapo: the library's fused policy loss and chunked lm-head log-probs registered with PyTorch's dispatcher,
// for Python (the dapo package in python/dapo) and TorchScript; with them the aggregations and the KL estimators.
// The algorithm's other pieces (advantages, dynamic sampling, rollout correction, rewards) are in algorithm_ops.cpp. A
// thin binding: each op fills the library's options and calls its LibTorch front end, which validates every argument
// (errors name it and its shape; Python sees a ValueError), computes on the CPU kernel or the CUDA one (linked in when
// LibTorch has CUDA: dapo::torch carries it) and builds its own autograd node. Registered as composite
// (CompositeImplicitAutograd): the front end records the graph itself, so the ops are differentiable like any PyTorch
// function.
//
// Shapes: B = rows (responses), T = response tokens, N = tokens, H = hidden size, V = vocabulary.
#include <torch/library.h>
#include <dapo/aggregation.hpp>
#include <dapo/core/trl_loss_type.hpp>
#include <dapo/kl_penalty.hpp>
#include <dapo/logprob.hpp>
#include <dapo/loss.hpp>

#include <string>
#include <tuple>

#include "value_errors.hpp"

namespace {

using Tensor = at::Tensor;

// The aggregation part of dapo::PolicyLossOptions, shared by policy_loss and aggregation_weights.
dapo::PolicyLossOptions aggregation_options(const std::string& loss_agg_mode, int64_t group_size, double norm_length,
                                            double global_token_count, double global_group_count,
                                            double global_row_count, double count_epsilon) {
  dapo::PolicyLossOptions options;
  options.aggregation = dapo::aggregation_from_name(loss_agg_mode);
  options.group_size = group_size;
  options.norm_length = norm_length;
  options.global_token_count = global_token_count;
  options.global_group_count = global_group_count;
  options.global_row_count = global_row_count;
  options.count_epsilon = count_epsilon;
  return options;
}

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
  dapo::PolicyLossOptions options = aggregation_options(loss_agg_mode, group_size, norm_length, global_token_count,
                                                        global_group_count, global_row_count, count_epsilon);
  options.mode = dapo::policy_loss_from_name(loss_mode);
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

// The weight of each token [B, T] in loss_agg_mode's aggregation (dapo::aggregation_weights), in `dtype` (default
// float32) on mask's device: sum(w * X) is any per-token term X aggregated as policy_loss aggregates (same counts).
Tensor aggregation_weights(const Tensor& mask, const std::string& loss_agg_mode, int64_t group_size, double norm_length,
                           double global_token_count, double global_group_count, double global_row_count,
                           double count_epsilon, c10::optional<at::ScalarType> dtype) {
  return dapo::aggregation_weights(mask,
                                   aggregation_options(loss_agg_mode, group_size, norm_length, global_token_count,
                                                       global_group_count, global_row_count, count_epsilon),
                                   dtype.value_or(at::kFloat));
}

// verl's agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size,
// loss_scale_factor): 0 for a keyword verl was not given. Differentiable in loss_mat.
Tensor agg_loss(const Tensor& loss_mat, const Tensor& loss_mask, const std::string& loss_agg_mode, int64_t dp_size,
                double batch_num_tokens, double global_batch_size, double loss_scale_factor) {
  dapo::AggLossOptions options;
  options.dp_size = dp_size;
  options.batch_num_tokens = batch_num_tokens;
  options.global_batch_size = global_batch_size;
  options.loss_scale_factor = loss_scale_factor;
  return dapo::agg_loss(loss_mat, loss_mask, dapo::aggregation_from_name(loss_agg_mode), options);
}

// verl's kl_penalty(logprob, ref_logprob, name) per element; differentiable (k3+, k1+: k2's gradient).
Tensor kl_penalty(const Tensor& logprob, const Tensor& ref_logprob, const std::string& name) {
  return dapo::kl_penalty(logprob, ref_logprob, name);
}

// TRL's GRPOConfig.loss_type and the call's counts as the library's loss options (dapo::trl_loss_type, the mapping
// the driver's --loss-type uses): (loss_mode, loss_agg_mode, the numbers by policy_loss's argument names and
// loss_scale). TRL's loss of the call = policy_loss with them, times loss_scale.
std::tuple<std::string, std::string, c10::Dict<std::string, double>> trl_loss_options(
    const std::string& loss_type, double epsilon, double epsilon_high, double delta, double sapo_temperature_pos,
    double sapo_temperature_neg, int64_t max_completion_length, int64_t gradient_accumulation_steps,
    int64_t steps_per_generation, int64_t num_processes, double num_items_in_batch, int64_t rows) {
  const dapo::TrlLossType trl =
      dapo::trl_loss_type(loss_type, {.epsilon = epsilon,
                                      .epsilon_high = epsilon_high,
                                      .delta = delta,
                                      .sapo_temperature_pos = sapo_temperature_pos,
                                      .sapo_temperature_neg = sapo_temperature_neg,
                                      .max_completion_length = max_completion_length,
                                      .gradient_accumulation_steps = gradient_accumulation_steps,
                                      .steps_per_generation = steps_per_generation,
                                      .num_processes = num_processes,
                                      .num_items_in_batch = num_items_in_batch,
                                      .rows = rows});
  const dapo::PolicyLossOptions& o = trl.options;
  c10::Dict<std::string, double> numbers;
  for (const auto& [name, value] : {std::pair<const char*, double>{"clip_low", o.clip_low},
                                    {"clip_high", o.clip_high},
                                    {"dual_clip", o.dual_clip},
                                    {"delta", o.delta},
                                    {"tau_pos", o.tau_pos},
                                    {"tau_neg", o.tau_neg},
                                    {"norm_length", o.norm_length},
                                    {"global_token_count", o.global_token_count},
                                    {"global_row_count", o.global_row_count},
                                    {"count_epsilon", o.count_epsilon},
                                    {"loss_scale", trl.loss_scale}}) {
    numbers.insert(name, value);
  }
  return {std::string(dapo::policy_loss_name(o.mode)), std::string(dapo::aggregation_name(o.aggregation)), numbers};
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
      dapo::python::value_errors<&policy_loss>);
  m.def(
      "linear_logprobs(Tensor hidden, Tensor weight, Tensor targets, int chunk_size, float temperature, "
      "bool with_entropy) -> (Tensor log_prob, Tensor entropy)",
      dapo::python::value_errors<&linear_logprobs>);
  m.def(
      "aggregation_weights(Tensor mask, str loss_agg_mode, int group_size, float norm_length, "
      "float global_token_count, float global_group_count, float global_row_count, float count_epsilon, "
      "ScalarType? dtype) -> Tensor",
      dapo::python::value_errors<&aggregation_weights>);
  m.def(
      "agg_loss(Tensor loss_mat, Tensor loss_mask, str loss_agg_mode, int dp_size, float batch_num_tokens, "
      "float global_batch_size, float loss_scale_factor) -> Tensor",
      dapo::python::value_errors<&agg_loss>);
  m.def("kl_penalty(Tensor logprob, Tensor ref_logprob, str name) -> Tensor", dapo::python::value_errors<&kl_penalty>);
  m.def(
      "trl_loss_options(str loss_type, float epsilon, float epsilon_high, float delta, float sapo_temperature_pos, "
      "float sapo_temperature_neg, int max_completion_length, int gradient_accumulation_steps, "
      "int steps_per_generation, int num_processes, float num_items_in_batch, int rows) -> (str loss_mode, "
      "str loss_agg_mode, Dict(str, float) options)",
      dapo::python::value_errors<&trl_loss_options>);
}
