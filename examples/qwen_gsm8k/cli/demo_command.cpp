// `qwen_gsm8k demo`: the built-in run.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/cli/commands.hpp"

namespace qwen::cli {
namespace {

// --device's text as a device the demo can use; CLI11 reports the error under the option's name, at parse time (before
// a launcher starts any rank).
torch::Device parse_demo_device(const std::string& text) {
  std::optional<torch::Device> device;
  try {
    device.emplace(text);
  } catch (const c10::Error&) {
    throw CLI::ValidationError("--device", "\"" + text + "\" is not a device, expected cpu or cuda[:N]");
  }
  try {
    check_demo_device(*device);
  } catch (const std::invalid_argument& error) {
    throw CLI::ValidationError(error.what());
  }
  return *device;
}

}  // namespace

void add_demo_command(CLI::App& app, DemoCommand& command) {
  DemoOptions& demo = command.options;
  CLI::App* sub = app.add_subcommand("demo", "The built-in run: tiny model, byte tokenizer, generated problems");
  sub->add_option("--output", command.output, "Output directory (summary.json, metrics, report.html)");
  sub->add_option("--algo", command.algorithm, "dapo or grpo (the baseline)")->check(CLI::IsMember({"dapo", "grpo"}));
  sub->add_option_function<std::string>(
         "--device", [&demo](const std::string& text) { demo.device = parse_demo_device(text); },
         "cpu or cuda[:N]; with --nproc, cuda means cuda:LOCAL_RANK (one GPU per rank)")
      ->default_str("cpu");
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
  add_launch_options(*sub, command.launch,
                     "Start this many data-parallel ranks on this machine (Gloo on CPU, NCCL with --device cuda)");
  command.app = sub;
}

int run_demo_command(const DemoCommand& command, const DistributedConfig& distributed) {
  DemoOptions demo = command.options;
  demo.output_dir = command.output;
  demo.algorithm = command.algorithm == "grpo" ? Algorithm::kGrpo : Algorithm::kDapo;
  check_demo_device(demo.device);  // before any CUDA call below
  // As `train` does: one GPU per rank, cuda meaning cuda:LOCAL_RANK under a launcher, made the current GPU (streams,
  // NCCL and allocations without an explicit device then stay on it instead of GPU 0).
  if (demo.device.is_cuda() && !demo.device.has_index() && distributed.world_size > 1) {
    demo.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(distributed.local_rank));
    check_demo_device(demo.device);  // LOCAL_RANK past the GPUs this rank sees
  }
  if (demo.device.is_cuda() && demo.device.has_index()) {
    c10::impl::getDeviceGuardImpl(demo.device.type())->setDevice(demo.device);
  }
  const auto communicator = Communicator::create(distributed, demo.device);
  run_demo(demo, communicator);
  communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
  return 0;
}

}  // namespace qwen::cli
