// The DAPO trainer: the only part that knows both the dapo library and the model. One step = rollouts with dynamic
// sampling on accuracy -> rewards with overlong shaping -> group advantages -> old log-probs from the training forward
// -> ppo_epochs passes over mini-batches of whole groups (so updates after the first are off-policy and the decoupled
// clip acts), token-mean over each mini-batch -> AdamW with warm-up and grad-norm clipping. No reference model, no KL.
// Also: evaluation, metrics.jsonl / eval.jsonl, checkpoints and resume, the report.
#pragma once

#include <dapo/advantage.hpp>
#include <dapo/loss.hpp>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"

namespace qwen {

enum class Algorithm { kDapo, kGrpo };

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
  int64_t max_num_gen_batches = 10;  // algorithm.filter_groups.max_num_gen_batches: rounds per step; 0 = unlimited
  bool dynamic_sampling = true;      // algorithm.filter_groups.enable (metric: acc)
  bool mask_truncated = false;       // overlong filtering: truncated responses out of the loss
  dapo::PolicyLossOptions loss;      // actor.clip_ratio_low / _high / _c, actor.loss_agg_mode
  dapo::AdvantageOptions advantage;  // algorithm.norm_adv_by_std_in_grpo
  RewardOptions rewards;             // reward_model.overlong_buffer.len / .penalty_factor (max_length is set from max_new_tokens)
  int64_t max_new_tokens = 512;      // data.max_response_length
  SamplingOptions sampling;          // actor_rollout_ref.rollout.temperature / top_p / top_k (temperature 1.0)
  std::string system_prompt = kSeedSystemPrompt;
  double lr = 1e-6;                  // actor.optim.lr
  double weight_decay = 0.1;         // actor.optim.weight_decay
  double beta1 = 0.9, beta2 = 0.999;
  int64_t warmup_steps = 0;          // actor.optim.lr_warmup_steps (optimizer updates)
  bool cosine_schedule = false;      // actor.optim.lr_scheduler_type=cosine: after warm-up, decay to min_lr_ratio * lr
  double min_lr_ratio = 0.0;         // actor.optim.min_lr_ratio
  double grad_clip = 1.0;            // actor.grad_clip
  int64_t logprob_chunk = 1024;      // rows of lm-head logits alive at once (dapo::linear_logprobs)
  // Mixed precision (torch.autocast; verl's FSDP mixed precision): the forward passes (rollouts, log-probs, evaluation)
  // in this dtype, bfloat16 or float16, over float32 weights and optimizer state. Empty: the weights' dtype throughout.
  std::optional<torch::ScalarType> autocast;
  int64_t max_rollout_rows = 0;      // sequences per generate() call; 0: all
  int64_t eval_every = 0;            // trainer.test_freq; 0: only at the start and the end
  int64_t eval_problems = 100;
  int64_t eval_pass_k = 0;           // also pass@k with sampling when > 0
  int64_t save_every = 0;            // trainer.save_freq; 0: only at the end
  int64_t keep_checkpoints = 2;
  uint64_t seed = 0;
  std::filesystem::path output_dir;  // metrics.jsonl, eval.jsonl, checkpoints/, report.html; empty: write nothing
  std::filesystem::path tokenizer_dir;  // copied into checkpoints when set
  bool quiet = false;                // no progress lines
  // Tests only: replaces sampling from the policy. Must depend on the problems alone (not on the rank or the batch),
  // so that runs with different numbers of ranks see the same rollouts. Not saved, not in to_json.
  std::function<std::vector<Group>(const std::vector<Problem>&)> fixed_rollouts;

  // The GRPO baseline for ablations: symmetric clip 0.2, sequence-mean aggregation, no dynamic sampling, no shaping.
  void use_grpo_baseline();
  void validate() const;  // throws std::invalid_argument naming the option
  nlohmann::json to_json() const;
};

struct EvalResult {
  int64_t step = 0;
  int64_t problems = 0;
  double accuracy = 0.0;  // greedy
  double pass_at_k = 0.0;
  int64_t k = 0;
  nlohmann::json to_json() const;
};

// The mini-batch tensors of a step: every response as one right-padded row of prompt + response.
// Shapes: B = responses, L = longest prompt + response; targets and masks are [B, L - 1] (position t predicts t + 1).
struct TrainBatch {
  torch::Tensor input_ids;       // [B, L] int64
  torch::Tensor attention_mask;  // [B, L] int64
  torch::Tensor loss_mask;       // [B, L - 1] bool: the target is a response token (and counts in the loss)
  torch::Tensor advantages;      // [B] float32
  torch::Tensor old_logp;        // [B, L - 1] float32 (float64 for a float64 model), 0 outside loss_mask
  int64_t groups = 0, group_size = 0;
};

// The rollout settings a TrainOptions implies for this tokenizer: stop ids <|im_end|> and <|endoftext|>, pad, budget.
RolloutOptions rollout_options(const TrainOptions& options, const Tokenizer& tokenizer);

// Data parallel (a communicator of more than one rank; see docs/distributed.md): every rank holds the whole model and
// the same data order. Each generation round, rank r samples its contiguous share of the round's prompts; the groups
// are then all-gathered, so every rank holds the same global round and makes the same dynamic-sampling decision
// (the single-process decision over the same rollouts). Each mini-batch of the global batch is split into contiguous
// shares of groups; a rank's loss is its share of the mini-batch loss (token-mean over the mini-batch's global token
// count), so the all-reduced (summed) gradient is the single-process gradient of the global batch. Evaluation splits
// its problems. Rank 0 alone writes files (metrics, evaluations, checkpoints, the report).
class Trainer {
 public:
  // communicator: null or one rank for a single process.
  Trainer(Qwen2ForCausalLM model, Tokenizer tokenizer, std::vector<Problem> train, std::vector<Problem> test,
          TrainOptions options, std::shared_ptr<Communicator> communicator = nullptr);

  // One DAPO step; returns its metrics row (also appended to metrics.jsonl).
  nlohmann::json step();
  // Greedy accuracy on the first eval_problems test problems (and pass@k); appended to eval.jsonl.
  EvalResult evaluate();
  // Runs to total_steps: evaluations, checkpoints, progress lines, and the report at the end.
  void run();

  // Checkpoint of everything a resume needs, in output_dir/checkpoints/step-NNNNNN (atomic); returns its path.
  std::filesystem::path save_checkpoint();
  // Continues from a checkpoint directory written by save_checkpoint (same options and data).
  void resume(const std::filesystem::path& checkpoint);

  int64_t step_index() const { return step_; }
  Qwen2ForCausalLM& model() { return model_; }
  const TrainOptions& options() const { return options_; }
  const std::vector<nlohmann::json>& metrics() const { return metrics_; }
  const std::vector<nlohmann::json>& evals() const { return evals_; }

  // Log-probs of the response tokens under the current policy (softmax(logits / temperature)), [B, L - 1], 0 outside
  // the mask; with grad when grad mode is on. entropy_sum/tokens, when given, add up the entropy of the masked tokens.
  torch::Tensor response_logprobs(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                  const torch::Tensor& loss_mask, double* entropy_sum = nullptr);

 private:
  std::vector<Group> collect_groups(nlohmann::json& metrics);
  // This rank's rollouts for its share of `problems`, all-gathered: every rank returns the round's groups in order.
  std::vector<Group> round_groups(const std::vector<Problem>& problems, uint64_t seed, RolloutStats& stats);
  bool is_root() const { return communicator_ == nullptr || communicator_->is_root(); }
  int world_size() const { return communicator_ == nullptr ? 1 : communicator_->world_size(); }
  TrainBatch build_batch(const std::vector<Group>& groups) const;
  void append_jsonl(const char* file, const nlohmann::json& row) const;
  double learning_rate(int64_t update) const;  // warm-up, then constant or cosine
  int64_t updates_per_step() const;
  void write_report() const;

  Qwen2ForCausalLM model_;
  Tokenizer tokenizer_;
  std::vector<Problem> train_, test_;
  TrainOptions options_;
  RolloutOptions rollout_options_;
  ProblemSampler sampler_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t step_ = 0, updates_ = 0;
  std::vector<nlohmann::json> metrics_, evals_;
  std::shared_ptr<Communicator> communicator_;
};

}  // namespace qwen
