// The shared command-line options and the --nproc launcher's entry.
#include "qwen_gsm8k/cli/options.hpp"

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace qwen::cli {
namespace {

// argv without the launcher's own option (--nproc N or --nproc=N): what each rank runs.
std::vector<std::string> rank_arguments(int argc, char** argv) {
  std::vector<std::string> arguments;
  for (int i = 0; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--nproc") {
      ++i;
      continue;
    }
    if (argument.rfind("--nproc=", 0) == 0) continue;
    arguments.push_back(argument);
  }
  return arguments;
}

}  // namespace

void add_run_options(CLI::App& command, const RunSettings& s) {
  command.add_option("--seed", *s.seed, "Seed of every draw (data order, sampling); the same seed repeats the run");
  command.add_option("--rollout-n", *s.rollout_n, "Responses per prompt, G (verl actor_rollout_ref.rollout.n)");
  command.add_option("--ppo-epochs", *s.ppo_epochs,
                     "Passes over each step's batch; updates after the first are off-policy (verl actor.ppo_epochs)");
  command.add_flag("--cosine,!--constant-lr", *s.cosine_schedule,
                   "Cosine decay of the learning rate after warm-up, or a constant one "
                   "(verl actor.optim.lr_scheduler_type)");
  command.add_option("--eval-every", *s.eval_every,
                     "Evaluate every K steps, and at the start and end (verl trainer.test_freq)");
  command.add_option("--eval-problems", *s.eval_problems, "Held-out problems per evaluation (greedy)");
  command.add_flag("--quiet", *s.quiet, "No progress lines");
}

void add_train_options(CLI::App& command, TrainOptions& o, std::string& aggregation) {
  command.add_option("--steps", o.total_steps, "Training steps (verl trainer.total_training_steps)");
  command.add_option("--train-batch-size", o.train_batch_size,
                     "Prompts (groups) trained on per step (verl data.train_batch_size)");
  command.add_option("--gen-batch-size", o.gen_batch_size,
                     "Prompts per generation round (verl data.gen_batch_size); 0 = train batch size");
  command.add_option("--ppo-mini-batch-size", o.ppo_mini_batch_size,
                     "Groups per optimizer update (verl actor.ppo_mini_batch_size)");
  command.add_option("--ppo-micro-batch-size", o.ppo_micro_batch_size,
                     "Groups per forward/backward (verl actor.ppo_micro_batch_size_per_gpu); 0 = mini-batch");
  command.add_option(
      "--max-num-gen-batches", o.max_num_gen_batches,
      "Generation rounds allowed per step (verl algorithm.filter_groups.max_num_gen_batches); 0 = unlimited");
  command.add_flag("!--no-dynamic-sampling", o.dynamic_sampling,
                   "Keep groups whose responses all agree (verl algorithm.filter_groups.enable=false)");
  command.add_flag("--mask-truncated", o.mask_truncated, "Overlong filtering: truncated responses out of the loss");
  command.add_option("--clip-ratio-low", o.loss.clip_low, "epsilon_low (verl actor.clip_ratio_low)");
  command.add_option("--clip-ratio-high", o.loss.clip_high, "epsilon_high, Clip-Higher (verl actor.clip_ratio_high)");
  command.add_option("--clip-ratio-c", o.loss.dual_clip,
                     "Dual-clip bound for A < 0; 0 disables (verl actor.clip_ratio_c)");
  command.add_option("--loss-agg-mode", aggregation,
                     "token-mean, group-token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm "
                     "(verl actor.loss_agg_mode)");
  command.add_option("--max-new-tokens", o.max_new_tokens, "Response budget, L_max (verl data.max_response_length)");
  command.add_option("--overlong-buffer-len", o.rewards.overlong_cache,
                     "Soft overlong zone, L_cache; 0 disables (verl reward_model.overlong_buffer.len)");
  command.add_option("--overlong-penalty-factor", o.rewards.overlong_factor,
                     "(verl reward_model.overlong_buffer.penalty_factor)");
  command.add_option("--temperature", o.sampling.temperature,
                     "Rollout temperature (verl actor_rollout_ref.rollout.temperature)");
  command.add_option("--top-p", o.sampling.top_p, "(verl actor_rollout_ref.rollout.top_p)");
  command.add_option("--top-k", o.sampling.top_k, "0 = off (verl actor_rollout_ref.rollout.top_k)");
  command.add_option("--lr", o.lr, "AdamW learning rate (verl actor.optim.lr)");
  command.add_option("--weight-decay", o.weight_decay, "(verl actor.optim.weight_decay)");
  command.add_option("--warmup-steps", o.warmup_steps,
                     "Linear warm-up, optimizer updates (verl actor.optim.lr_warmup_steps)");
  command.add_option("--min-lr-ratio", o.min_lr_ratio,
                     "Cosine floor as a fraction of lr (verl actor.optim.min_lr_ratio)");
  command.add_option("--grad-clip", o.grad_clip, "Gradient-norm clip (verl actor.grad_clip)");
  command.add_option("--pass-k", o.eval_pass_k, "Also report pass@k with sampling; 0 = off");
  command.add_option("--save-every", o.save_every, "Checkpoint every K steps, and at the end (verl trainer.save_freq)");
  command.add_option("--correctness-weight", o.rewards.correctness_weight,
                     "Weight of the correctness reward (2.0 when right)");
  command.add_option("--digit-weight", o.rewards.digit_weight, "Weight of the digit reward (0.5)");
  command.add_option("--format-weight", o.rewards.format_weight, "Weight of the strict format reward (0.5)");
  command.add_option("--mark-weight", o.rewards.mark_weight, "Weight of the tag reward (0.125 per tag)");
  command.add_option("--logprob-chunk", o.logprob_chunk, "Rows of lm-head logits alive at once (memory vs speed)");
  command.add_option("--max-rollout-rows", o.max_rollout_rows, "Sequences per generation call; 0 = all");
}

void add_launch_options(CLI::App& command, LaunchSettings& settings, const std::string& nproc_help) {
  command.add_option("--nproc", settings.nproc, nproc_help);
  command.add_option("--dist-timeout", settings.dist_timeout,
                     "Seconds a collective may wait for the other ranks before failing with the lost ranks named");
}

std::optional<int> launch_or_join(const LaunchSettings& settings, int argc, char** argv,
                                  DistributedConfig& distributed) {
  if (settings.nproc > 1) {
    if (std::getenv("RANK") != nullptr) {
      throw std::invalid_argument("--nproc " + std::to_string(settings.nproc) +
                                  " inside a rank (RANK is set): use one or the other");
    }
    return launch_local_ranks(settings.nproc, rank_arguments(argc, argv), std::chrono::seconds(30));
  }
  distributed = DistributedConfig::from_environment();
  if (!(settings.dist_timeout > 0)) throw std::invalid_argument("--dist-timeout must be > 0 seconds");
  distributed.timeout = std::chrono::milliseconds(static_cast<int64_t>(settings.dist_timeout * 1000));
  return std::nullopt;
}

}  // namespace qwen::cli
