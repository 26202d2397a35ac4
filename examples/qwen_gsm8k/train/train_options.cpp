// TrainOptions: the GRPO baseline, validation, the JSON record; the rollout settings they imply.
#include "qwen_gsm8k/train/train_options.hpp"

#include <cmath>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <utility>

#include "qwen_gsm8k/logging/metric_log.hpp"

namespace qwen {

void TrainOptions::use_grpo_baseline() {
  algorithm = Algorithm::kGrpo;
  loss.clip_low = 0.2;
  loss.clip_high = 0.2;
  loss.aggregation = dapo::LossAggregation::kSeqMeanTokenMean;
  dynamic_sampling = false;
  rewards.overlong_cache = 0;
}

void TrainOptions::validate() const {
  auto require = [](bool condition, const std::string& message) {
    if (!condition) throw std::invalid_argument("train options: " + message);
  };
  require(total_steps >= 0, "total_steps must be >= 0");
  require(train_batch_size >= 1, "train_batch_size must be >= 1 (groups per step)");
  require(gen_batch_size >= 0, "gen_batch_size must be >= 0");
  require(rollout_n >= 2,
          "rollout_n is " + std::to_string(rollout_n) + ", expected >= 2 (group advantages compare responses)");
  require(ppo_mini_batch_size >= 1 && train_batch_size % ppo_mini_batch_size == 0,
          "ppo_mini_batch_size " + std::to_string(ppo_mini_batch_size) + " must divide train_batch_size " +
              std::to_string(train_batch_size));
  const int64_t micro = ppo_micro_batch_size > 0 ? ppo_micro_batch_size : ppo_mini_batch_size;
  require(ppo_mini_batch_size % micro == 0, "ppo_micro_batch_size " + std::to_string(micro) +
                                                " must divide ppo_mini_batch_size " +
                                                std::to_string(ppo_mini_batch_size));
  require(ppo_epochs >= 1, "ppo_epochs must be >= 1");
  require(ppo_max_token_len_per_gpu >= 1, "ppo_max_token_len_per_gpu is " + std::to_string(ppo_max_token_len_per_gpu) +
                                              ", expected >= 1 (tokens per micro-batch)");
  require(log_prob_max_token_len_per_gpu >= 0, "log_prob_max_token_len_per_gpu is " +
                                                   std::to_string(log_prob_max_token_len_per_gpu) +
                                                   ", expected >= 0 (0: ppo_max_token_len_per_gpu)");
  require(max_num_gen_batches >= 0, "max_num_gen_batches must be >= 0 (0 = unlimited)");
  require(max_new_tokens >= 1, "max_new_tokens must be >= 1");
  require(rewards.overlong_cache >= 0 && rewards.overlong_cache <= max_new_tokens,
          "overlong_buffer_len " + std::to_string(rewards.overlong_cache) + " must lie in [0, max_new_tokens]");
  require(rewards.dummy_accuracy >= 0.0 && rewards.dummy_accuracy < 1.0,
          "dummy_accuracy must lie in [0, 1) (0: the seed's correctness)");
  require(std::isfinite(rewards.overlong_factor) && rewards.overlong_factor >= 0.0,
          "overlong_penalty_factor must be a finite value >= 0");
  for (const double weight :
       {rewards.correctness_weight, rewards.digit_weight, rewards.format_weight, rewards.mark_weight}) {
    require(std::isfinite(weight), "reward weights must be finite");
  }
  require(lr > 0.0 && std::isfinite(lr), "lr must be > 0");
  require(weight_decay >= 0.0 && std::isfinite(weight_decay), "weight_decay must be >= 0");
  require(grad_clip > 0.0 && std::isfinite(grad_clip), "grad_clip must be > 0");
  require(warmup_steps >= 0, "warmup_steps must be >= 0");
  require(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio must lie in [0, 1]");
  require(eval_problems >= 0 && eval_pass_k >= 0 && eval_every >= 0, "eval counts must be >= 0");
  require(save_every >= -1, "save_every must be >= 0, or -1 for no checkpoint at all");
  require(keep_checkpoints >= 0, "keep_checkpoints (save_total_limit) must be >= 0 (0 keeps all)");
  require(max_shard_bytes >= 0, "max_shard_bytes must be >= 0 (0: one model.safetensors)");
  require(log_rollouts >= 0, "log_rollouts must be >= 0 (0 writes none)");
  for (const auto& logger : loggers) {
    require(has_logger(kLoggerNames, logger), "logger \"" + logger + "\" is not one of console, jsonl, tensorboard");
  }
  require(logprob_chunk >= 1, "logprob_chunk must be >= 1");
  require(max_rollout_rows >= 0, "max_rollout_rows must be >= 0 (0 = all)");
  require(!autocast || *autocast == torch::kBFloat16 || *autocast == torch::kHalf,
          "autocast must be bfloat16 or float16 (or off)");
  sampling.validate();
  dapo::check_policy_loss_options(loss, ppo_mini_batch_size * rollout_n, "train options");
  extras.check();
  require(extras.rollout_rs.empty() || loss.aggregation != dapo::LossAggregation::kGroupTokenMean,
          "rollout_rs can reject every token of a group, and group-token-mean divides by a group's tokens: choose "
          "another loss_agg_mode");
  require(loss.mode != dapo::PolicyLossMode::kKlCov && loss.mode != dapo::PolicyLossMode::kClipCov,
          "policy loss " + std::string(dapo::policy_loss_name(loss.mode)) +
              " is not available in the driver: it chooses tokens among one call's own, and the trainer computes "
              "the loss per micro-batch");
}

nlohmann::json TrainOptions::to_json() const {
  nlohmann::json json{{"algorithm", algorithm == Algorithm::kDapo ? "dapo" : "grpo"},
                      {"total_steps", total_steps},
                      {"train_batch_size", train_batch_size},
                      {"gen_batch_size", gen_batch_size > 0 ? gen_batch_size : train_batch_size},
                      {"rollout_n", rollout_n},
                      {"ppo_mini_batch_size", ppo_mini_batch_size},
                      {"ppo_micro_batch_size", ppo_micro_batch_size > 0 ? ppo_micro_batch_size : ppo_mini_batch_size},
                      {"ppo_epochs", ppo_epochs},
                      {"use_dynamic_bsz", use_dynamic_bsz},
                      {"ppo_max_token_len_per_gpu", ppo_max_token_len_per_gpu},
                      {"log_prob_max_token_len_per_gpu",
                       log_prob_max_token_len_per_gpu > 0 ? log_prob_max_token_len_per_gpu : ppo_max_token_len_per_gpu},
                      {"max_num_gen_batches", max_num_gen_batches},
                      {"dynamic_sampling", dynamic_sampling},
                      {"mask_truncated", mask_truncated},
                      {"clip_ratio_low", loss.clip_low},
                      {"clip_ratio_high", loss.clip_high},
                      {"clip_ratio_c", loss.dual_clip},
                      {"loss_agg_mode", dapo::aggregation_name(loss.aggregation).data()},
                      {"policy_loss", dapo::policy_loss_name(loss.mode).data()},
                      {"tau_pos", loss.tau_pos},
                      {"tau_neg", loss.tau_neg},
                      {"dro_beta", loss.dro_beta},
                      {"kl_loss_coef", extras.kl_loss_coef},
                      {"kl_loss_type", extras.kl_loss_type},
                      {"entropy_coeff", extras.entropy_coeff},
                      {"rollout_is", extras.rollout_is},
                      {"rollout_is_threshold", extras.rollout_is_threshold},
                      {"rollout_rs", extras.rollout_rs},
                      {"rollout_rs_threshold", extras.rollout_rs_threshold},
                      {"norm_adv_by_std", advantage.scale_by_std},
                      {"adv_estimator", dapo::advantage_estimator_name(adv_estimator).data()},
                      {"max_new_tokens", max_new_tokens},
                      {"overlong_buffer_len", rewards.overlong_cache},
                      {"overlong_penalty_factor", rewards.overlong_factor},
                      {"reward_weights",
                       {rewards.correctness_weight, rewards.digit_weight, rewards.format_weight, rewards.mark_weight}},
                      {"answer_mode", rewards.answer_mode == dapo::gsm8k::AnswerMode::kSeed ? "seed" : "lenient"},
                      {"temperature", sampling.temperature},
                      {"top_p", sampling.top_p},
                      {"top_k", sampling.top_k},
                      {"lr", lr},
                      {"weight_decay", weight_decay},
                      {"betas", {beta1, beta2}},
                      {"warmup_steps", warmup_steps},
                      {"lr_schedule", cosine_schedule ? "cosine" : "constant"},
                      {"min_lr_ratio", min_lr_ratio},
                      {"grad_clip", grad_clip},
                      {"autocast", !autocast                       ? "off"
                                   : *autocast == torch::kBFloat16 ? "bfloat16"
                                                                   : "float16"},
                      {"gradient_checkpointing", gradient_checkpointing},
                      {"shared_prompt", shared_prompt},
                      {"cuda_graphs", cuda_graphs},
                      {"free_cache_engine", free_cache_engine},
                      {"eval_every", eval_every},
                      {"eval_problems", eval_problems},
                      {"eval_pass_k", eval_pass_k},
                      {"save_every", save_every},
                      {"seed", seed}};
  if (rewards.dummy_accuracy > 0.0) json["dummy_accuracy"] = rewards.dummy_accuracy;  // benchmarks only
  return json;
}

LrSchedule TrainOptions::lr_schedule() const {
  return {.lr = lr,
          .warmup_updates = warmup_steps,
          .cosine = cosine_schedule,
          .min_lr_ratio = min_lr_ratio,
          .total_updates = total_steps * (train_batch_size / ppo_mini_batch_size * ppo_epochs)};
}

void LossExtras::check() const {
  const auto require = [](bool condition, const std::string& message) {
    if (!condition) throw std::invalid_argument("train options: " + message);
  };
  require(std::isfinite(kl_loss_coef) && kl_loss_coef >= 0.0, "kl_loss_coef must be a finite value >= 0");
  require(std::isfinite(entropy_coeff), "entropy_coeff must be finite");
  for (const auto& [name, parse] : std::initializer_list<std::pair<const char*, std::function<void()>>>{
           {"kl_loss_type", [&] { dapo::parse_kl_penalty(kl_loss_type); }},
           {"rollout_is", [&] { rollout_is_options(); }},
           {"rollout_rs", [&] { rollout_rs_options(); }}}) {
    try {
      parse();
    } catch (const std::invalid_argument& error) {
      require(false, std::string(name) + ": " + error.what());
    }
  }
}

std::optional<dapo::RolloutIsOptions> LossExtras::rollout_is_options() const {
  if (rollout_is.empty()) return std::nullopt;
  return dapo::parse_rollout_is(rollout_is, rollout_is_threshold);
}

std::vector<dapo::RolloutRsOption> LossExtras::rollout_rs_options() const {
  if (rollout_rs.empty()) return {};
  return dapo::parse_rollout_rs(rollout_rs, rollout_rs_threshold);
}

RolloutOptions rollout_options(const TrainOptions& options, const Tokenizer& tokenizer) {
  RolloutOptions rollout;
  rollout.group_size = options.rollout_n;
  const ResponseBudget budget = response_budget(options);
  rollout.generation.max_new_tokens = budget.generation_tokens;
  rollout.generation.sampling = options.sampling;
  rollout.generation.pad_id = tokenizer.pad_token_id().value_or(0);
  rollout.generation.return_logprobs = true;  // the rollout's log-probs: rollout correction and its metrics
  for (const char* stop : {"<|im_end|>", "<|endoftext|>"}) {
    if (const auto id = tokenizer.token_to_id(stop)) rollout.generation.stop_ids.push_back(*id);
  }
  rollout.rewards = options.rewards;
  rollout.rewards.max_length = budget.overlong_max_length;
  rollout.system_prompt = options.system_prompt;
  rollout.max_batch_rows = options.max_rollout_rows;
  rollout.cuda_graphs = options.cuda_graphs;
  return rollout;
}

ResponseBudget response_budget(const TrainOptions& options) {
  const int64_t tokens = options.max_new_tokens;
  return {.generation_tokens = tokens,
          .overlong_max_length = tokens,
          .norm_length = options.loss.norm_length != 0.0 ? options.loss.norm_length : static_cast<double>(tokens),
          .truncated_at = tokens};
}

}  // namespace qwen
