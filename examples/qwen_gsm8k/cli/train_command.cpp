// `qwen_gsm8k train`: DAPO (or the GRPO baseline) on GSM8K JSON lines with a Hugging Face Qwen2.5 model directory.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <cstdio>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/trainer.hpp"

namespace qwen::cli {
namespace {

void add_io_options(CLI::App& sub, TrainCommand& c) {
  sub.add_option("--model", c.model_dir, "Model directory: config.json, safetensors, tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub.add_option("--train", c.train_file, "Training JSON lines")->required()->check(CLI::ExistingFile);
  sub.add_option("--test", c.test_file, "Evaluation JSON lines")->check(CLI::ExistingFile);
  sub.add_option("--output", c.output, "Output directory");
  sub.add_option("--device", c.device, "cpu or cuda[:N]");
  sub.add_option("--dtype", c.dtype, "Weights: float32 or bfloat16")->check(CLI::IsMember({"float32", "bfloat16"}));
  sub.add_option("--autocast", c.autocast,
                 "Mixed precision: forward passes in bfloat16 or float16 over float32 weights and optimizer state "
                 "(torch.autocast), or off")
      ->check(CLI::IsMember({"off", "bfloat16", "float16"}));
  sub.add_option("--resume", c.resume, "Continue from a checkpoint (a checkpoint directory, or the checkpoints root)");
}

void add_data_options(CLI::App& sub, TrainCommand& c) {
  sub.add_option("--system-prompt", c.options.system_prompt, "System prompt (default: the seed's)");
  sub.add_option("--question-field", c.fields.question, "JSON field of the question");
  sub.add_option("--answer-field", c.fields.answer, "JSON field of the answer");
  sub.add_option("--answer-format", c.answer_format, "gsm8k (\"... #### N\") or number")
      ->check(CLI::IsMember({"gsm8k", "number"}));
  sub.add_flag("--skip-bad-lines", c.skip_bad_lines, "Skip (and count) malformed data lines instead of stopping");
  sub.add_flag("--lenient-answers", c.lenient_answers,
               "Read answers leniently (-7, 1,080); default: the seed's parser");
}

// The settings that come from flags other than TrainOptions' own fields.
TrainOptions resolved_options(const TrainCommand& c) {
  TrainOptions options = c.options;
  if (c.algorithm == "grpo") options.use_grpo_baseline();
  if (!c.aggregation.empty() && c.algorithm != "grpo") {
    options.loss.aggregation = dapo::aggregation_from_name(c.aggregation);
  }
  if (c.lenient_answers) options.rewards.answer_mode = dapo::gsm8k::AnswerMode::kLenient;
  if (c.autocast != "off") options.autocast = c.autocast == "bfloat16" ? torch::kBFloat16 : torch::kHalf;
  options.output_dir = c.output;
  options.tokenizer_dir = c.model_dir;
  return options;
}

}  // namespace

void add_train_command(CLI::App& app, TrainCommand& command) {
  CLI::App* sub = app.add_subcommand("train", "DAPO on GSM8K JSON lines with a Hugging Face Qwen2.5 model");
  add_io_options(*sub, command);
  sub->add_option("--algo", command.algorithm,
                  "dapo, or grpo (the baseline: clip 0.2/0.2, seq-mean-token-mean, no dynamic sampling, no shaping)")
      ->check(CLI::IsMember({"dapo", "grpo"}));
  add_data_options(*sub, command);
  TrainOptions& o = command.options;
  add_run_options(*sub, {.seed = &o.seed,
                         .rollout_n = &o.rollout_n,
                         .ppo_epochs = &o.ppo_epochs,
                         .cosine_schedule = &o.cosine_schedule,
                         .eval_every = &o.eval_every,
                         .eval_problems = &o.eval_problems,
                         .quiet = &o.quiet});
  add_train_options(*sub, o, command.aggregation);
  add_launch_options(*sub, command.launch,
                     "Start this many data-parallel ranks on this machine (or use torchrun-style RANK, WORLD_SIZE, "
                     "LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
  command.app = sub;
}

int run_train_command(TrainCommand command, const DistributedConfig& distributed) {
  command.fields.format = command.answer_format == "number" ? AnswerFormat::kNumber : AnswerFormat::kGsm8k;
  const TrainOptions options = resolved_options(command);
  torch::Device device(command.device);
  // One GPU per rank: cuda means cuda:LOCAL_RANK under a launcher.
  if (device.is_cuda() && !device.has_index() && distributed.world_size > 1) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(distributed.local_rank));
  }
  // This rank's GPU becomes the current one, as torchrun scripts call torch.cuda.set_device(local_rank): streams,
  // NCCL and any allocation without an explicit device then stay on it instead of GPU 0.
  if (device.is_cuda() && device.has_index()) c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
  const auto communicator = Communicator::create(distributed, device);
  const auto dtype = command.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  const auto bad = command.skip_bad_lines ? BadLines::kSkip : BadLines::kError;
  auto train = load_problems(command.train_file, command.fields, bad);
  std::vector<Problem> test;
  if (!command.test_file.empty()) test = load_problems(command.test_file, command.fields, bad).problems;
  if (communicator->is_root()) {
    std::printf("data: %zu training problems (%lld lines skipped), %zu test problems\n", train.problems.size(),
                static_cast<long long>(train.skipped_lines), test.size());
  }
  auto model = load_model(command.model_dir, dtype, device);
  auto tokenizer = Tokenizer::from_directory(command.model_dir);
  Trainer trainer(model, tokenizer, train.problems, test, options, communicator);
  if (!command.resume.empty()) {
    trainer.resume(command.resume);
    if (communicator->is_root()) {
      std::printf("resumed at step %lld from %s\n", static_cast<long long>(trainer.step_index()),
                  command.resume.c_str());
    }
  }
  trainer.run();
  communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
  return 0;
}

}  // namespace qwen::cli
