// The DAPO trainer: the only part that knows both the dapo library and the model. One step = rollouts with dynamic
// sampling on accuracy -> rewards with overlong shaping -> group advantages -> old log-probs from the training forward
// -> ppo_epochs passes over mini-batches of whole groups (so updates after the first are off-policy and the decoupled
// clip acts), token-mean over each mini-batch -> AdamW with warm-up and grad-norm clipping. No reference model, no KL.
// Also: evaluation, the metrics (verl's names; metrics.jsonl, TensorBoard, rollouts/ samples: logging/), checkpoints
// and resume, the report (rewritten at every evaluation). The pieces: train_options.hpp
// (settings), trainer_rollouts.cpp (the step's rollouts), batch.hpp (tensors), update.hpp (the policy update),
// trainer_state.cpp (checkpoints; trainer_state_file.hpp reads and writes trainer_state.json), lr_schedule.hpp.
#pragma once

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
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/logging/metric_log.hpp"
#include "qwen_gsm8k/model/device_memory.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/optimizer.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "qwen_gsm8k/train/step_metrics.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen {

struct EvalResult {
  int64_t step = 0;
  int64_t problems = 0;
  double accuracy = 0.0;  // greedy
  double pass_at_k = 0.0;
  int64_t k = 0;
  nlohmann::json to_json() const;
};

// How Trainer::run ended.
struct RunResult {
  bool stopped = false;  // on the stop request (set_stop_request), before total_steps
  int64_t step = 0;      // steps completed
  // The checkpoint written at the stop; empty when the run was not stopped, has no output_dir, or on ranks but 0.
  std::filesystem::path checkpoint;
};

// The reference policy of a KL loss: a frozen copy of `model` (same device, no grad, eval mode). Under autocast the
// decoder layers' linear weights and biases are stored in the autocast dtype: autocast rounds them to it for every
// product anyway, so the reference computes with the same rounded weights in about half the memory (1.5B: 3.6
// instead of 6.2 GB); its log-probs are as close to float32's as autocast's over float32 weights (the last bits may
// differ: LibTorch 1.13's CPU autocast takes another kernel for a linear layer whose weights are already bfloat16).
// Embeddings (the tied lm-head with them), norms and an untied lm-head keep the model's dtype: the residual stream and
// the log-prob statistics read them outside autocast's casts.
Qwen2ForCausalLM reference_policy(const Qwen2ForCausalLM& model, std::optional<torch::ScalarType> autocast);

// Data parallel (a communicator of more than one rank; see docs/distributed.md): every rank holds the whole model and
// the same data order. Each generation round, rank r samples its contiguous share of the round's prompts; the groups
// are then all-gathered, so every rank holds the same global round and makes the same dynamic-sampling decision
// (the single-process decision over the same rollouts). Each mini-batch of the global batch is split into contiguous
// shares of groups; a rank's loss is its exact share of the mini-batch loss (dapo::micro_batch_options, see
// update.hpp), so the all-reduced (summed) gradient is the single-process gradient of the global batch. Evaluation
// splits its problems. Rank 0 alone writes files (metrics, evaluations, checkpoints, the report).
class Trainer {
 public:
  // communicator: null or one rank for a single process.
  Trainer(Qwen2ForCausalLM model, Tokenizer tokenizer, std::vector<Problem> train, std::vector<Problem> test,
          TrainOptions options, std::shared_ptr<Communicator> communicator = nullptr);

  // One DAPO step; returns its metrics row (also logged: metrics.jsonl, TensorBoard; a rollouts/ sample).
  nlohmann::json step();
  // Greedy accuracy on the first eval_problems test problems (and pass@k); appended to eval.jsonl.
  EvalResult evaluate();
  // Runs to total_steps: evaluations (each rewrites the report), checkpoints, progress lines, the report at the end.
  // Or, on the stop request, stops after a step: see set_stop_request.
  RunResult run();

  // Lets run() end early at a safe point (a preempted job: the train and demo commands pass a SIGTERM / SIGINT flag,
  // common/stop_request.hpp). `requested` is polled after each step but the last; once it is true on any rank, every
  // rank stops after that same step (the flags are summed over the ranks, so no rank waits alone in a collective):
  // no evaluation, rank 0 writes a checkpoint (when there is an output_dir) and the report, and run() returns with
  // stopped set. A step under way always finishes. Without it (the default), run() always reaches total_steps.
  // Every rank must call it, or none.
  void set_stop_request(std::function<bool()> requested) { stop_requested_ = std::move(requested); }

  // Checkpoint of everything a resume needs, in output_dir/checkpoints/step-NNNNNN (atomic); returns its path.
  std::filesystem::path save_checkpoint();
  // Continues from a checkpoint directory written by save_checkpoint (same options and data), or from the one
  // `checkpoint`/latest names. Everything is read and checked before anything changes: a damaged or truncated file
  // throws std::runtime_error naming it, and the output directory is left as it was (the model's weights may then be
  // partly loaded). Only then are metrics.jsonl and eval.jsonl cut back to the checkpoint's rows.
  // The run's settings must be the checkpointed run's, except those that change no update's arithmetic beyond float32
  // rounding (micro-batch sizes, token budgets, gradient checkpointing, the shared prompt, CUDA graphs) or only when
  // things happen (steps, intervals, evaluations): each such change is reported as taken.
  void resume(const std::filesystem::path& checkpoint);

  int64_t step_index() const { return step_; }
  Qwen2ForCausalLM& model() { return model_; }
  const TrainOptions& options() const { return options_; }
  const std::vector<nlohmann::json>& metrics() const { return metrics_; }
  const std::vector<nlohmann::json>& evals() const { return evals_; }

 private:
  // The step's rollouts (trainer_rollouts.cpp): generation rounds with dynamic sampling; their metrics into `metrics`.
  std::vector<Group> collect_groups(nlohmann::json& metrics);
  // This rank's rollouts for its share of `problems`, all-gathered: every rank returns the round's groups in order.
  std::vector<Group> round_groups(const std::vector<Problem>& problems, uint64_t seed, RolloutStats& stats);
  // Streaming dynamic sampling on one rank (trainer_rollouts.cpp, scheduled by GroupStream): groups decided in
  // prompt order as they complete, the run stopped when the batch is full, the rest dropped.
  std::vector<Group> stream_groups(int64_t per_round, RolloutStats& stats, SampledResponses& sampled,
                                   nlohmann::json& metrics);
  // The longest chat prompt of the training problems, in tokens (computed once): the engine's slot capacity.
  int64_t max_train_prompt_tokens();
  // The generation engine of the rollouts and evaluations, made at the first of them for a round's rows on this rank
  // and kept (its CUDA graphs with it) until the run ends, or until the step's rollouts end with free_cache_engine.
  GenerationEngine& rollout_engine();
  bool is_root() const { return communicator_ == nullptr || communicator_->is_root(); }
  int world_size() const { return communicator_ == nullptr ? 1 : communicator_->world_size(); }
  void write_report() const;
  // A progress line (rank 0, unless quiet).
  void progress(const std::string& line) const;
  // evaluate(), then its progress line (with the number of problems when with_count).
  void evaluate_and_report(bool with_count);

  Qwen2ForCausalLM model_;
  std::unique_ptr<GenerationEngine> rollout_engine_;  // rollout_engine()
  // The frozen starting policy of a KL loss (options.kl_loss_coef > 0): a copy of the model as the trainer received it
  // (after a resume, still the starting weights: resume loads the checkpoint into model_ only). Empty otherwise.
  Qwen2ForCausalLM reference_{nullptr};
  Tokenizer tokenizer_;
  std::vector<Problem> train_, test_;
  TrainOptions options_;
  RolloutOptions rollout_options_;
  ProblemSampler sampler_;
  std::unique_ptr<ClippedAdamW> optimizer_;
  int64_t step_ = 0, updates_ = 0;
  std::vector<nlohmann::json> metrics_, evals_;
  std::shared_ptr<Communicator> communicator_;
  MetricLog metric_log_;
  std::function<bool()> stop_requested_;
  std::unique_ptr<MemoryMonitor> memory_;  // each step's peak: perf/max_memory_allocated_gb, _reserved_gb
  int64_t max_train_prompt_tokens_ = 0;    // 0: not computed yet
};

}  // namespace qwen
