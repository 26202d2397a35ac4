// qwen_gsm8k: the command-line driver. Subcommands: demo (the built-in tiny run), train (a Hugging Face Qwen2.5 model
// on GSM8K JSON lines), compare (charts of several runs), tokenize (JSON lines in, token ids out). Option names
// follow verl where it has one.
#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/report/report.hpp"
#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/text/tokenize_command.hpp"
#include "qwen_gsm8k/model/weights.hpp"

namespace {

void add_train_options(CLI::App& command, qwen::TrainOptions& o, std::string& aggregation) {
  command.add_option("--steps", o.total_steps, "Training steps (verl trainer.total_training_steps)");
  command.add_option("--train-batch-size", o.train_batch_size,
                     "Prompts (groups) trained on per step (verl data.train_batch_size)");
  command.add_option("--gen-batch-size", o.gen_batch_size,
                     "Prompts per generation round (verl data.gen_batch_size); 0 = train batch size");
  command.add_option("--rollout-n", o.rollout_n, "Responses per prompt, G (verl actor_rollout_ref.rollout.n)");
  command.add_option("--ppo-mini-batch-size", o.ppo_mini_batch_size,
                     "Groups per optimizer update (verl actor.ppo_mini_batch_size)");
  command.add_option("--ppo-micro-batch-size", o.ppo_micro_batch_size,
                     "Groups per forward/backward (verl actor.ppo_micro_batch_size_per_gpu); 0 = mini-batch");
  command.add_option("--ppo-epochs", o.ppo_epochs, "Passes over each step's batch (verl actor.ppo_epochs)");
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
  command.add_flag("--cosine", o.cosine_schedule,
                   "Cosine decay after warm-up (verl actor.optim.lr_scheduler_type=cosine)");
  command.add_option("--min-lr-ratio", o.min_lr_ratio,
                     "Cosine floor as a fraction of lr (verl actor.optim.min_lr_ratio)");
  command.add_option("--grad-clip", o.grad_clip, "Gradient-norm clip (verl actor.grad_clip)");
  command.add_option("--eval-every", o.eval_every,
                     "Evaluate every K steps, and at the start and end (verl trainer.test_freq)");
  command.add_option("--eval-problems", o.eval_problems, "Test problems per evaluation (greedy)");
  command.add_option("--pass-k", o.eval_pass_k, "Also report pass@k with sampling; 0 = off");
  command.add_option("--save-every", o.save_every, "Checkpoint every K steps, and at the end (verl trainer.save_freq)");
  command.add_option("--seed", o.seed, "Seed of every draw (data order, sampling)");
  command.add_option("--correctness-weight", o.rewards.correctness_weight,
                     "Weight of the correctness reward (2.0 when right)");
  command.add_option("--digit-weight", o.rewards.digit_weight, "Weight of the digit reward (0.5)");
  command.add_option("--format-weight", o.rewards.format_weight, "Weight of the strict format reward (0.5)");
  command.add_option("--mark-weight", o.rewards.mark_weight, "Weight of the tag reward (0.125 per tag)");
  command.add_option("--logprob-chunk", o.logprob_chunk, "Rows of lm-head logits alive at once (memory vs speed)");
  command.add_option("--max-rollout-rows", o.max_rollout_rows, "Sequences per generation call; 0 = all");
}

int run_train(const std::string& model_dir, const std::string& train_file, const std::string& test_file,
              const std::string& output, const std::string& device_name, const std::string& dtype_name,
              const std::string& resume, qwen::TrainOptions options, const std::string& aggregation,
              const std::string& algorithm, const qwen::DataFields& fields, bool skip_bad_lines, bool lenient,
              qwen::DistributedConfig distributed) {
  if (algorithm == "grpo") options.use_grpo_baseline();
  if (!aggregation.empty() && algorithm != "grpo") options.loss.aggregation = dapo::aggregation_from_name(aggregation);
  if (lenient) options.rewards.answer_mode = dapo::gsm8k::AnswerMode::kLenient;
  options.output_dir = output;
  options.tokenizer_dir = model_dir;
  torch::Device device(device_name);
  // One GPU per rank: cuda means cuda:LOCAL_RANK under a launcher.
  if (device.is_cuda() && !device.has_index() && distributed.world_size > 1) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(distributed.local_rank));
  }
  const auto communicator = qwen::Communicator::create(distributed, device);
  const auto dtype = dtype_name == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  const auto bad = skip_bad_lines ? qwen::BadLines::kSkip : qwen::BadLines::kError;
  auto train = qwen::load_problems(train_file, fields, bad);
  std::vector<qwen::Problem> test;
  if (!test_file.empty()) test = qwen::load_problems(test_file, fields, bad).problems;
  if (communicator->is_root()) {
    std::printf("data: %zu training problems (%lld lines skipped), %zu test problems\n", train.problems.size(),
                static_cast<long long>(train.skipped_lines), test.size());
  }
  auto model = qwen::load_model(model_dir, dtype, device);
  auto tokenizer = qwen::Tokenizer::from_directory(model_dir);
  qwen::Trainer trainer(model, tokenizer, train.problems, test, options, communicator);
  if (!resume.empty()) {
    trainer.resume(resume);
    if (communicator->is_root()) {
      std::printf("resumed at step %lld from %s\n", static_cast<long long>(trainer.step_index()), resume.c_str());
    }
  }
  trainer.run();
  communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
  return 0;
}

// --nproc and --dist-timeout, on every subcommand that trains.
void add_distributed_options(CLI::App& command, int& nproc, double& dist_timeout, const std::string& nproc_help) {
  command.add_option("--nproc", nproc, nproc_help);
  command.add_option("--dist-timeout", dist_timeout,
                     "Seconds a collective may wait for the other ranks before failing with the lost ranks named");
}

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

int main(int argc, char** argv) {
  qwen::use_passive_openmp(argv);
  CLI::App app{"qwen_gsm8k: DAPO training of Qwen2.5 on GSM8K with the dapo library"};
  app.require_subcommand(1);
  // Under a launcher, the ranks on this machine share its cores.
  int local_ranks = 1;
  if (const char* local_world = std::getenv("LOCAL_WORLD_SIZE")) local_ranks = std::max(1, std::atoi(local_world));
  int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_ranks);
  app.add_option("--threads", threads, "CPU threads for LibTorch (default: the cores, shared among local ranks)");
  int nproc = 1;
  double dist_timeout = 300;

  // demo
  qwen::DemoOptions demo;
  std::string demo_output = "demo-output", demo_algorithm = "dapo";
  CLI::App* demo_command =
      app.add_subcommand("demo", "The built-in run: tiny model, byte tokenizer, generated problems");
  demo_command->add_option("--output", demo_output, "Output directory (summary.json, metrics, report.html)");
  demo_command->add_option("--seed", demo.seed, "Seed; the same seed reproduces the numbers");
  demo_command->add_option("--algo", demo_algorithm, "dapo or grpo (the baseline)")
      ->check(CLI::IsMember({"dapo", "grpo"}));
  demo_command->add_option("--sft-steps", demo.sft_steps, "Most warm-start updates");
  demo_command->add_option("--sft-min-steps", demo.sft_min_steps, "Fewest warm-start updates");
  demo_command->add_option("--sft-target", demo.sft_target_accuracy,
                           "Warm-start until this greedy accuracy on training problems");
  demo_command->add_option("--rl-steps", demo.rl_steps, "DAPO / GRPO steps");
  demo_command->add_option("--rl-lr", demo.rl_lr, "DAPO / GRPO learning rate");
  demo_command->add_option("--rl-groups", demo.rl_groups, "Prompts per step (train_batch_size)");
  demo_command->add_option("--rl-mini-groups", demo.rl_mini_groups, "Prompts per update (ppo_mini_batch_size)");
  demo_command->add_option("--rollout-n", demo.rollout_n, "Responses per prompt");
  demo_command->add_option("--ppo-epochs", demo.ppo_epochs, "Passes over each step's batch");
  demo_command->add_flag("--cosine,!--constant-lr", demo.cosine_schedule,
                         "Cosine decay of the RL learning rate (default) or a constant one");
  demo_command->add_option("--sft-lr", demo.sft_lr, "Warm-start learning rate");
  demo_command->add_option("--eval-every", demo.eval_every, "Evaluate every K steps");
  demo_command->add_option("--eval-problems", demo.eval_problems, "Held-out problems per evaluation");
  demo_command->add_flag("--quiet", demo.quiet, "No progress lines");
  add_distributed_options(*demo_command, nproc, dist_timeout,
                          "Start this many data-parallel ranks on this machine (Gloo on CPU)");

  // train
  qwen::TrainOptions train;
  std::string model_dir, train_file, test_file, output = "train-output", device = "cpu", dtype = "float32", resume;
  std::string aggregation, algorithm = "dapo", answer_format = "gsm8k";
  qwen::DataFields fields;
  bool skip_bad_lines = false, lenient = false;
  CLI::App* train_command = app.add_subcommand("train", "DAPO on GSM8K JSON lines with a Hugging Face Qwen2.5 model");
  train_command->add_option("--model", model_dir, "Model directory: config.json, safetensors, tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  train_command->add_option("--train", train_file, "Training JSON lines")->required()->check(CLI::ExistingFile);
  train_command->add_option("--test", test_file, "Evaluation JSON lines")->check(CLI::ExistingFile);
  train_command->add_option("--output", output, "Output directory");
  train_command->add_option("--device", device, "cpu or cuda[:N]");
  train_command->add_option("--dtype", dtype, "Weights: float32 or bfloat16")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  std::string autocast = "off";
  train_command
      ->add_option("--autocast", autocast,
                   "Mixed precision: forward passes in bfloat16 or float16 over float32 weights and optimizer state "
                   "(torch.autocast), or off")
      ->check(CLI::IsMember({"off", "bfloat16", "float16"}));
  train_command->add_option("--resume", resume,
                            "Continue from a checkpoint (a checkpoint directory, or the checkpoints root)");
  train_command
      ->add_option("--algo", algorithm,
                   "dapo, or grpo (the baseline: clip 0.2/0.2, seq-mean-token-mean, no dynamic sampling, no shaping)")
      ->check(CLI::IsMember({"dapo", "grpo"}));
  train_command->add_option("--system-prompt", train.system_prompt, "System prompt (default: the seed's)");
  train_command->add_option("--question-field", fields.question, "JSON field of the question");
  train_command->add_option("--answer-field", fields.answer, "JSON field of the answer");
  train_command->add_option("--answer-format", answer_format, "gsm8k (\"... #### N\") or number")
      ->check(CLI::IsMember({"gsm8k", "number"}));
  train_command->add_flag("--skip-bad-lines", skip_bad_lines,
                          "Skip (and count) malformed data lines instead of stopping");
  train_command->add_flag("--lenient-answers", lenient,
                          "Read answers leniently (-7, 1,080); default: the seed's parser");
  add_train_options(*train_command, train, aggregation);
  add_distributed_options(*train_command, nproc, dist_timeout,
                          "Start this many data-parallel ranks on this machine (or use torchrun-style RANK, "
                          "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");

  // compare
  std::string compare_output = "compare-output";
  std::vector<std::string> compare_runs;
  CLI::App* compare = app.add_subcommand("compare", "Charts of several runs side by side (accuracy against steps)");
  compare->add_option("--output", compare_output, "Directory for the SVG charts");
  compare->add_option("runs", compare_runs, "Run directories (with eval.jsonl / metrics.jsonl)")
      ->required()
      ->check(CLI::ExistingDirectory);

  // tokenize
  std::string tokenizer_dir;
  CLI::App* tokenize = app.add_subcommand(
      "tokenize",
      "Read JSON lines on stdin (a string, or {\"messages\": [...], \"add_generation_prompt\": bool}) and "
      "write one JSON array of token ids per line");
  tokenize->add_option("--tokenizer", tokenizer_dir, "Directory with tokenizer.json (and tokenizer_config.json)")
      ->required()
      ->check(CLI::ExistingDirectory);

  CLI11_PARSE(app, argc, argv);
  qwen::DistributedConfig distributed;
  try {
    if (nproc > 1) {
      if (std::getenv("RANK") != nullptr) {
        throw std::invalid_argument("--nproc " + std::to_string(nproc) +
                                    " inside a rank (RANK is set): use one or the other");
      }
      return qwen::launch_local_ranks(nproc, rank_arguments(argc, argv), std::chrono::seconds(30));
    }
    distributed = qwen::DistributedConfig::from_environment();
    if (!(dist_timeout > 0)) throw std::invalid_argument("--dist-timeout must be > 0 seconds");
    distributed.timeout = std::chrono::milliseconds(static_cast<int64_t>(dist_timeout * 1000));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "qwen_gsm8k: %s\n", error.what());
    return 2;
  }
  at::set_num_threads(threads);
  try {
    if (tokenize->parsed()) return qwen::run_tokenize(tokenizer_dir, std::cin, std::cout, std::cerr);
    if (compare->parsed()) {
      for (const auto& path : qwen::write_comparison(compare_output, {compare_runs.begin(), compare_runs.end()})) {
        std::printf("wrote %s\n", path.string().c_str());
      }
      return 0;
    }
    if (demo_command->parsed()) {
      demo.output_dir = demo_output;
      demo.algorithm = demo_algorithm == "grpo" ? qwen::Algorithm::kGrpo : qwen::Algorithm::kDapo;
      const auto communicator = qwen::Communicator::create(distributed, torch::kCPU);
      qwen::run_demo(demo, communicator);
      communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
      return 0;
    }
    if (train_command->parsed()) {
      fields.format = answer_format == "number" ? qwen::AnswerFormat::kNumber : qwen::AnswerFormat::kGsm8k;
      if (autocast != "off") train.autocast = autocast == "bfloat16" ? torch::kBFloat16 : torch::kHalf;
      return run_train(model_dir, train_file, test_file, output, device, dtype, resume, train, aggregation, algorithm,
                       fields, skip_bad_lines, lenient, distributed);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "qwen_gsm8k: %s\n", error.what());
    std::fflush(stderr);
    // With peers, leave at once: tearing down a process group whose peers are gone can block.
    if (distributed.world_size > 1) std::_Exit(1);
    return 1;
  }
  return 0;
}
