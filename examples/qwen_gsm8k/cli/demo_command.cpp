// `qwen_gsm8k demo`: the built-in run.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/common/stop_request.hpp"

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

// The demo's settings together, as run_demo will use them: what one flag's validator cannot see.
void check_demo_command(const DemoCommand& command) {
  DemoOptions demo = command.options;
  demo.algorithm = command.algorithm == "grpo" ? Algorithm::kGrpo : Algorithm::kDapo;
  if (demo.sft_min_steps > demo.sft_steps) {
    throw CLI::ValidationError("--sft-min-steps", std::to_string(demo.sft_min_steps) + " is more than --sft-steps " +
                                                      std::to_string(demo.sft_steps));
  }
  if (demo.eval_problems < 1) {
    throw CLI::ValidationError("--eval-problems", "0: the demo needs held-out problems (its result is their accuracy)");
  }
  try {
    demo_train_options(demo).validate();
  } catch (const std::invalid_argument& error) {
    throw settings_error(*command.app, error.what());
  }
}

}  // namespace

void add_demo_command(CLI::App& app, DemoCommand& command) {
  DemoOptions& demo = command.options;
  CLI::App* sub = app.add_subcommand("demo", "The built-in run: tiny model, byte tokenizer, generated problems");
  sub->option_defaults()->always_capture_default();
  add_config_options(*sub, command.print_config);  // first: see add_config_options
  add_setting(*sub, "--output", command.output, "Output directory (summary.json, metrics, report.html)");
  add_switch(*sub, "--overwrite", command.overwrite,
             "Replace the run already in --output (its metrics, evaluations, checkpoints, report); scripts/demo.sh "
             "passes it")
      ->configurable(false);
  // The GRPO preset (clip, aggregation, dynamic sampling, overlong shaping) touches no setting the demo has a flag
  // for; run_demo applies it (demo_train_options).
  add_setting(*sub, "--algo", command.algorithm,
              "dapo, or grpo (the baseline: clip 0.2/0.2, seq-mean-token-mean, no dynamic sampling, no shaping)")
      ->check(CLI::IsMember({"dapo", "grpo"}));
  sub->add_option_function<std::string>(
         "--device", [&demo](const std::string& text) { demo.device = parse_demo_device(text); },
         "cpu or cuda[:N]; with --nproc, cuda means cuda:LOCAL_RANK (one GPU per rank)")
      ->default_function([&demo] { return demo.device.str(); })
      ->capture_default_str();
  add_setting(*sub, "--sft-steps", demo.sft_steps, "Most warm-start updates")->check(non_negative());
  add_setting(*sub, "--sft-min-steps", demo.sft_min_steps, "Fewest warm-start updates")->check(non_negative());
  add_setting(*sub, "--sft-target", demo.sft_target_accuracy,
              "Warm-start until this greedy accuracy on training problems")
      ->check(in_range(0, 1));
  add_setting(*sub, "--sft-lr", demo.sft_lr, "Warm-start learning rate")->check(positive());
  add_run_options(*sub, {.total_steps = &demo.rl_steps,
                         .train_batch_size = &demo.rl_groups,
                         .ppo_mini_batch_size = &demo.rl_mini_groups,
                         .lr = &demo.rl_lr,
                         .seed = &demo.seed,
                         .rollout_n = &demo.rollout_n,
                         .ppo_epochs = &demo.ppo_epochs,
                         .cosine_schedule = &demo.cosine_schedule,
                         .warmup_steps = &demo.rl_warmup_steps,
                         .shared_prompt = &demo.shared_prompt,
                         .eval_every = &demo.eval_every,
                         .eval_problems = &demo.eval_problems,
                         .loggers = &demo.loggers,
                         .log_rollouts = &demo.log_rollouts,
                         .quiet = &demo.quiet});
  add_algorithm_options(*sub, {.mode = &demo.policy_loss,
                               .tau_pos = &demo.tau_pos,
                               .tau_neg = &demo.tau_neg,
                               .dro_beta = &demo.dro_beta,
                               .adv_estimator = &demo.adv_estimator,
                               .extras = &demo.extras});
  add_launch_options(*sub, command.launch,
                     "Start this many data-parallel ranks on this machine (Gloo on CPU, NCCL with --device cuda)");
  sub->callback([&command] { check_demo_command(command); });
  command.app = sub;
}

void prepare_demo_output(const DemoCommand& command) {
  RunDirectory{command.output}.prepare(
      command.overwrite ? OutputReuse::kOverwrite : OutputReuse::kRefuse,
      "pass --overwrite to replace it (scripts/demo.sh does), or choose another --output");
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
  // SIGTERM / SIGINT end the demo after the update or step under way (common/stop_request.hpp).
  install_stop_handlers(distributed.world_size > 1 ? RepeatedSignal::kAsksToStop : RepeatedSignal::kKills);
  demo.stop_request = [] { return stop_signal() != 0; };
  const nlohmann::json summary = run_demo(demo, communicator);
  communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
  if (!summary.value("stopped", false)) return 0;
  const RunResult result{.stopped = true,
                         .step = summary.at("step").get<int64_t>(),
                         .checkpoint = summary.at("checkpoint").get<std::string>()};
  return report_stop(communicator->is_root(), result, "the demo cannot resume: run it again");
}

}  // namespace qwen::cli
