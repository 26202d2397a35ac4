// The trainer's settings: one aggregate with the DAPO paper's defaults where the seed project has none, each field
// named after its verl knob; validation that names the option; the JSON a checkpoint records.
#pragma once

#include <dapo/core/advantage.hpp>
#include <dapo/core/advantage_estimator.hpp>
#include <dapo/core/kl_penalty.hpp>
#include <dapo/core/policy_loss_options.hpp>
#include <dapo/core/rollout_correction.hpp>

#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/lr_schedule.hpp"
#include "qwen_gsm8k/train/rollout.hpp"

namespace qwen {

enum class Algorithm { kDapo, kGrpo };

// What verl adds to the policy loss, by its names (all off by default), for `train` and `demo` alike.
struct LossExtras {
  // A KL loss against the frozen starting policy (verl actor.use_kl_loss, TRL beta): kl_loss_coef times the estimate
  // kl_loss_type (verl's names: low_var_kl, k1, k2, k3+, ...) aggregated as the policy loss is. 0: no KL loss and no
  // reference model.
  double kl_loss_coef = 0.0;                // actor.kl_loss_coef
  std::string kl_loss_type = "low_var_kl";  // actor.kl_loss_type
  double entropy_coeff = 0.0;  // actor.entropy_coeff: minus this times the aggregated entropy joins the loss
  // Rollout correction (verl algorithm.rollout_correction), from the trainer's old log-probs against the sampler's:
  // IS weights on the policy loss ("token" or "sequence"; threshold "U" truncates, "L_U" is IcePop's band) and
  // rejection of tokens or responses (e.g. "token_k1", "seq_mean_k3", comma separated). Empty: off.
  std::string rollout_is;                    // rollout_is
  std::string rollout_is_threshold = "2.0";  // rollout_is_threshold
  std::string rollout_rs;                    // rollout_rs
  std::string rollout_rs_threshold = "2.0";  // rollout_rs_threshold (one for all, or one per option)

  // The parsed rollout correction (nullopt / empty when off); check() has checked them.
  std::optional<dapo::RolloutIsOptions> rollout_is_options() const;
  std::vector<dapo::RolloutRsOption> rollout_rs_options() const;
  bool rollout_correction() const { return !rollout_is.empty() || !rollout_rs.empty(); }
  void check() const;  // throws std::invalid_argument naming the option
};

// Defaults from the DAPO paper where the seed project has none; the verl name of each knob is in the CLI help.
struct TrainOptions {
  Algorithm algorithm = Algorithm::kDapo;
  int64_t total_steps = 100;         // trainer.total_training_steps
  int64_t train_batch_size = 16;     // data.train_batch_size: groups (prompts) trained on per step
  int64_t gen_batch_size = 0;        // data.gen_batch_size: prompts per generation round; 0 = train_batch_size
  int64_t rollout_n = 4;             // actor_rollout_ref.rollout.n: responses per prompt (the seed: 4)
  int64_t ppo_mini_batch_size = 4;   // actor.ppo_mini_batch_size: groups per optimizer update
  int64_t ppo_micro_batch_size = 0;  // actor.ppo_micro_batch_size_per_gpu: groups per forward/backward; 0 = mini-batch
  int64_t ppo_epochs = 1;            // actor.ppo_epochs: passes over the step's batch
  // actor.use_dynamic_bsz: micro-batches by a token budget instead of ppo_micro_batch_size groups. Rows (not whole
  // groups) of a rank's share, longest first, each micro-batch at most ppo_max_token_len_per_gpu padded tokens (its
  // rows x its longest prompt + response: what the padded forward computes and holds; verl, which packs rows without
  // padding, counts their sum). log_prob_max_token_len_per_gpu is the no-grad passes' budget (old and reference
  // log-probs; 0: the update's).
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 16384;
  int64_t log_prob_max_token_len_per_gpu = 0;
  int64_t max_num_gen_batches = 10;  // algorithm.filter_groups.max_num_gen_batches: rounds per step; 0 = unlimited
  bool dynamic_sampling = true;      // algorithm.filter_groups.enable (metric: acc)
  bool mask_truncated = false;       // overlong filtering: truncated responses out of the loss
  dapo::PolicyLossOptions loss;      // actor.clip_ratio_low / _high / _c, actor.loss_agg_mode, policy_loss.loss_mode
  dapo::AdvantageOptions advantage;  // algorithm.norm_adv_by_std_in_grpo
  // algorithm.adv_estimator: grpo is group_advantages (DAPO Eq. 9); the others dapo::core::estimate_advantages over
  // each step's groups (outcome rewards, no discount: every estimator gives one value per response).
  dapo::AdvantageEstimator adv_estimator = dapo::AdvantageEstimator::kGrpo;
  LossExtras extras;             // KL loss, entropy term, rollout correction
  RewardOptions rewards;         // reward_model.overlong_buffer.len / .penalty_factor (max_length: response_budget)
  int64_t max_new_tokens = 512;  // data.max_response_length
  SamplingOptions sampling;      // actor_rollout_ref.rollout.temperature / top_p / top_k (temperature 1.0)
  std::string system_prompt = kSeedSystemPrompt;
  double lr = 1e-6;           // actor.optim.lr
  double weight_decay = 0.1;  // actor.optim.weight_decay
  double beta1 = 0.9, beta2 = 0.999;
  int64_t warmup_steps = 0;      // actor.optim.lr_warmup_steps (optimizer updates)
  bool cosine_schedule = false;  // actor.optim.lr_scheduler_type=cosine: after warm-up, decay to min_lr_ratio * lr
  double min_lr_ratio = 0.0;     // actor.optim.min_lr_ratio
  double grad_clip = 1.0;        // actor.grad_clip
  int64_t logprob_chunk = 1024;  // rows of lm-head logits alive at once (dapo::linear_logprobs)
  // Mixed precision (torch.autocast; verl's FSDP mixed precision): the forward passes (rollouts, log-probs, evaluation)
  // in this dtype, bfloat16 or float16, over float32 weights and optimizer state. Empty: the weights' dtype throughout.
  std::optional<torch::ScalarType> autocast;
  // actor.model.enable_gradient_checkpointing (TRL gradient_checkpointing): the update's forward keeps each decoder
  // layer's input only and recomputes the layer in the backward (model/gradient_checkpointing.hpp). Same gradients,
  // activations of one layer instead of all, about one more forward per update.
  bool gradient_checkpointing = false;
  // The update's forward passes (old, reference and training log-probs) compute each distinct prompt of a
  // micro-batch once, its responses attending to it (verl's PrefixGrouper; Qwen2ModelImpl::forward_shared): prompt +
  // G x response tokens instead of G x (prompt + response). The same log-probs and gradients within rounding.
  bool shared_prompt = true;
  int64_t max_rollout_rows = 0;  // the generation engine's slots (vLLM's max_num_seqs); 0: every row of a round
  // On CUDA, decode steps as CUDA graphs (EngineOptions::cuda_graphs; vLLM's default, its enforce_eager = false).
  bool cuda_graphs = true;
  // Drop the generation engine after each step's rollouts (verl's rollout.free_cache_engine): its slot pool, the
  // compute copy and its CUDA graphs are freed for the update and made again (graphs captured again) next step.
  // Default: kept for the whole run, so every step's rollout replays the graphs the first one captured.
  bool free_cache_engine = false;
  int64_t eval_every = 0;  // trainer.test_freq; 0: only at the start and the end
  int64_t eval_problems = 100;
  int64_t eval_pass_k = 0;  // also pass@k with sampling when > 0
  // trainer.save_freq; 0: only at the end; -1: never (benchmarks, as verl's -1). By default every 50 steps: at the
  // seed's 12 s per step, 10 minutes of work at risk, for a 1.5B checkpoint (about 18.5 GB with AdamW's state) that
  // takes seconds to write; save_total_limit keeps the newest two.
  int64_t save_every = 50;
  int64_t keep_checkpoints = 2;  // TRL save_total_limit: newest checkpoints kept; 0 keeps all
  // transformers' max_shard_size ("5GB" = 5e9 bytes): model.safetensors above it is split into
  // model-0000k-of-0000n.safetensors with model.safetensors.index.json.
  int64_t max_shard_bytes = 5'000'000'000;
  // verl trainer.logger: where each step's metrics go: console (the progress line), jsonl (metrics.jsonl),
  // tensorboard (events.out.tfevents.* in output_dir).
  std::vector<std::string> loggers = {"console", "jsonl", "tensorboard"};
  // Groups (prompts, with all their responses) written per step to rollouts/step-NNNNNN.jsonl (verl
  // trainer.rollout_data_dir, TRL log_completions); 0 writes none.
  int64_t log_rollouts = 2;
  uint64_t seed = 0;
  std::filesystem::path output_dir;  // metrics.jsonl, eval.jsonl, checkpoints/, report.html; empty: write nothing
  // The input model directory (train --model): its config.json fields, generation_config.json and tokenizer files
  // go into every checkpoint, as save_pretrained would write them. Empty (the demo): config.json from the model.
  std::filesystem::path model_dir;
  bool quiet = false;  // no progress lines
  // Tests only: replaces sampling from the policy. Must depend on the problems alone (not on the rank or the batch),
  // so that runs with different numbers of ranks see the same rollouts. Not saved, not in to_json.
  std::function<std::vector<Group>(const std::vector<Problem>&)> fixed_rollouts;

  // The GRPO baseline for ablations: symmetric clip 0.2, sequence-mean aggregation, no dynamic sampling, no shaping.
  void use_grpo_baseline();
  // The learning rate of each optimizer update that these options imply.
  LrSchedule lr_schedule() const;
  void validate() const;  // throws std::invalid_argument naming the option
  nlohmann::json to_json() const;
};

// The rollout settings a TrainOptions implies for this tokenizer: stop ids <|im_end|> and <|endoftext|>, pad, budget.
RolloutOptions rollout_options(const TrainOptions& options, const Tokenizer& tokenizer);

// What --max-new-tokens (verl's data.max_response_length) sets, derived here only: the generation budget, the overlong
// shaping's max_length, Dr. GRPO's constant divisor (when the loss options leave it 0) and the length at which the step
// metrics count a response as truncated (verl's response_length/clip_ratio).
struct ResponseBudget {
  int64_t generation_tokens = 0;    // GenerationOptions::max_new_tokens
  int64_t overlong_max_length = 0;  // RewardOptions::max_length
  double norm_length = 0.0;         // PolicyLossOptions::norm_length (TRL: max_completion_length)
  int64_t truncated_at = 0;         // a response of this many tokens was cut off by the budget
};
ResponseBudget response_budget(const TrainOptions& options);

}  // namespace qwen
