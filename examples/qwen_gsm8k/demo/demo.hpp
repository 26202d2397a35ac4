// The built-in demo (the README's main job): no files needed. A tiny Qwen2-architecture model, the byte-level
// tokenizer, and generated GSM8K-style arithmetic word problems; a short supervised warm start teaches the
// <think>/<answer> format, then DAPO (or the GRPO baseline) trains, and greedy accuracy on held-out problems is
// measured before and after. Everything is seeded: the same seed reproduces the numbers on the same machine.
#pragma once

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/train/trainer.hpp"

namespace qwen {

struct DemoOptions {
  std::filesystem::path output_dir = "demo-output";
  uint64_t seed = 1;
  Algorithm algorithm = Algorithm::kDapo;
  // Where the model trains (--device): cpu, or cuda / cuda:N. The weights are initialised on the CPU from the seed
  // either way, then moved: every device starts from the same model, and a CPU run draws what it always drew.
  torch::Device device = torch::kCPU;
  // Supervised warm start: at least sft_min_steps updates, then until greedy accuracy on sft_check_problems training
  // problems (never test ones) reaches sft_target_accuracy, at most sft_steps. The check runs every sft_check_every
  // updates, and every 5 once the accuracy is within 0.15 of the target. Stopping on accuracy, not a step count, puts
  // every seed at a similar start: the format and the copying of operands are learned abruptly, at a step that varies
  // with the seed (measured: between 350 and 475 of these updates).
  int64_t sft_steps = 600;
  int64_t sft_min_steps = 150;
  int64_t sft_check_every = 25;
  int64_t sft_check_problems = 100;
  double sft_target_accuracy = 0.6;
  int64_t sft_batch = 48;  // problems per warm-start update
  double sft_lr = 3e-3;
  int64_t rl_steps = 60;  // DAPO / GRPO steps
  double rl_lr = 6e-4;
  // Linear learning-rate warm-up over the first optimizer updates (4 per step: 2 mini-batches x 2 epochs), as DAPO's
  // recipe warms up: without it Adam's first updates, each about lr per weight whatever the gradient, moved the policy
  // 10-20x more than later ones (ppo_kl 0.015-0.042 at the first step against ~0.002).
  int64_t rl_warmup_steps = 16;
  bool shared_prompt = true;        // TrainOptions::shared_prompt: each group's prompt computed once in the update
  int64_t rl_groups = 32;           // prompts (groups) per step
  int64_t rl_mini_groups = 16;      // groups per update: rl_groups / rl_mini_groups updates per epoch
  int64_t rollout_n = 8;            // responses per prompt
  int64_t ppo_epochs = 2;           // passes over each step's batch: updates after the first are off-policy
  int64_t max_num_gen_batches = 8;  // dynamic sampling's generation rounds per step before it gives up
  bool cosine_schedule = true;      // decay the RL learning rate to 0 over the run
  int64_t eval_every = 5;
  int64_t eval_problems = 200;  // held-out problems
  bool quiet = false;
  // As TrainOptions' (verl trainer.logger; groups per step in rollouts/step-NNNNNN.jsonl).
  std::vector<std::string> loggers = {"console", "jsonl", "tensorboard"};
  int64_t log_rollouts = 2;
  // The loss and the advantage estimator by verl's names (--policy-loss, --adv-estimator), with the loss's options;
  // gspo and sapo aggregate with seq-mean-token-mean as in verl (dapo::verl_aggregation), the others keep the
  // algorithm's aggregation; gspo clips at 3e-4 / 4e-4 and cispo from above only (demo_train_options).
  dapo::PolicyLossMode policy_loss = dapo::PolicyLossMode::kVanilla;
  double tau_pos = 1.0, tau_neg = 1.05, dro_beta = 0.0;
  dapo::AdvantageEstimator adv_estimator = dapo::AdvantageEstimator::kGrpo;
  LossExtras extras;  // KL loss, entropy term, rollout correction: as TrainOptions' (all off)
  // Polled after each warm-start update and each RL step (see Trainer::set_stop_request); once true on any rank,
  // the demo ends there: during the warm start with nothing saved, during RL with a checkpoint. Empty: never stops.
  std::function<bool()> stop_request;
};

// The tiny model: hidden 64, 3 layers, 4 query / 2 key-value heads, intermediate 192, tied embeddings, the 259-token
// byte-level vocabulary.
Config demo_model_config();

// The trainer settings of the demo for `algorithm` (DAPO's or the GRPO baseline's), scaled to the tiny model.
TrainOptions demo_train_options(const DemoOptions& options);

// Throws std::invalid_argument naming --device unless `device` is the CPU or a CUDA device this process can use
// (torch::cuda::is_available(), index below torch::cuda::device_count()).
void check_demo_device(torch::Device device);

// Runs the demo on options.device; writes summary.json, metrics.jsonl, eval.jsonl, report.html and a final checkpoint
// to output_dir, prints a before/after table unless quiet, and returns the summary. A run ended by
// options.stop_request writes no summary.json and returns {"stopped": true, "step": RL steps done, "checkpoint": the
// checkpoint written at the stop, or ""}. With a communicator of several
// ranks, the warm start and DAPO run data parallel (see Trainer) and rank 0 alone prints and writes; the communicator's
// device must be options.device's type (Gloo for cpu, NCCL for cuda), each rank on its own GPU.
nlohmann::json run_demo(const DemoOptions& options, std::shared_ptr<Communicator> communicator = nullptr);

}  // namespace qwen
