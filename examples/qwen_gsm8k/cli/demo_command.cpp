// `qwen_gsm8k demo`: the built-in run.
#include <torch/torch.h>

#include "qwen_gsm8k/cli/commands.hpp"

namespace qwen::cli {

void add_demo_command(CLI::App& app, DemoCommand& command) {
  DemoOptions& demo = command.options;
  CLI::App* sub = app.add_subcommand("demo", "The built-in run: tiny model, byte tokenizer, generated problems");
  sub->add_option("--output", command.output, "Output directory (summary.json, metrics, report.html)");
  sub->add_option("--algo", command.algorithm, "dapo or grpo (the baseline)")->check(CLI::IsMember({"dapo", "grpo"}));
  sub->add_option("--sft-steps", demo.sft_steps, "Most warm-start updates");
  sub->add_option("--sft-min-steps", demo.sft_min_steps, "Fewest warm-start updates");
  sub->add_option("--sft-target", demo.sft_target_accuracy,
                  "Warm-start until this greedy accuracy on training problems");
  sub->add_option("--sft-lr", demo.sft_lr, "Warm-start learning rate");
  sub->add_option("--rl-steps", demo.rl_steps, "DAPO / GRPO steps");
  sub->add_option("--rl-lr", demo.rl_lr, "DAPO / GRPO learning rate");
  sub->add_option("--rl-groups", demo.rl_groups, "Prompts per step (train_batch_size)");
  sub->add_option("--rl-mini-groups", demo.rl_mini_groups, "Prompts per update (ppo_mini_batch_size)");
  add_run_options(*sub, {.seed = &demo.seed,
                         .rollout_n = &demo.rollout_n,
                         .ppo_epochs = &demo.ppo_epochs,
                         .cosine_schedule = &demo.cosine_schedule,
                         .eval_every = &demo.eval_every,
                         .eval_problems = &demo.eval_problems,
                         .quiet = &demo.quiet});
  add_launch_options(*sub, command.launch, "Start this many data-parallel ranks on this machine (Gloo on CPU)");
  command.app = sub;
}

int run_demo_command(const DemoCommand& command, const DistributedConfig& distributed) {
  DemoOptions demo = command.options;
  demo.output_dir = command.output;
  demo.algorithm = command.algorithm == "grpo" ? Algorithm::kGrpo : Algorithm::kDapo;
  const auto communicator = Communicator::create(distributed, torch::kCPU);
  run_demo(demo, communicator);
  communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
  return 0;
}

}  // namespace qwen::cli
