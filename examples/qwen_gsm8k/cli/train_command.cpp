// `qwen_gsm8k train`: DAPO (or the GRPO baseline) on GSM8K JSON lines with a Hugging Face Qwen2.5 model directory.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/common/stop_request.hpp"
#include "qwen_gsm8k/model/device_check.hpp"
#include "qwen_gsm8k/model/device_memory.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/chat_template.hpp"
#include "qwen_gsm8k/train/trainer.hpp"

namespace qwen::cli {
namespace {

void add_io_options(CLI::App& sub, TrainCommand& c) {
  add_setting(sub, "--model", c.model_dir, "Model directory: config.json, safetensors, tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  add_setting(sub, "--train", c.train_file, "Training JSON lines")->required()->check(CLI::ExistingFile);
  add_setting(sub, "--test", c.test_file, "Evaluation JSON lines")->check(CLI::ExistingFile);
  add_setting(sub, "--output", c.output, "Output directory (verl trainer.default_local_dir, TRL output_dir)");
  add_setting(sub, "--device", c.device, "cpu or cuda[:N]");
  add_setting(sub, "--dtype", c.dtype,
              "Weights: float32, or bfloat16 (training them needs --allow-bf16-weights: AdamW's small updates are "
              "lost in bfloat16; --autocast bfloat16 keeps float32 weights)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  add_switch(sub, "--allow-bf16-weights", c.allow_bf16_weights,
             "Train with --dtype bfloat16 weights anyway (most updates of lr 1e-6 round away)");
  add_setting(sub, "--autocast", c.autocast,
              "Mixed precision: forward passes in bfloat16 or float16 over float32 weights and optimizer state "
              "(torch.autocast; TRL bf16), or off")
      ->check(CLI::IsMember({"off", "bfloat16", "float16"}));
  add_setting(sub, "--load-format", c.load_format,
              "auto: the weights of --model's safetensors; dummy: config.json's shape with seeded random weights, "
              "no weight read (vLLM's load_format dummy: for benchmarks and profiling)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  add_setting(sub, "--dummy-accuracy", c.options.rewards.dummy_accuracy,
              "With --load-format dummy, whose random weights never answer right: each response counts as correct "
              "with probability P (a hash of its text), so that dynamic sampling keeps and filters groups as for a "
              "policy of accuracy P; 0: GSM8K's correctness")
      ->check(in_range(0, 1));  // 1 is refused with the settings (TrainOptions::validate)
  CLI::Option* resume =
      add_setting(sub, "--resume", c.resume,
                  "Continue from a checkpoint (a checkpoint directory, or the checkpoints root); the run goes on "
                  "in --output (TRL resume_from_checkpoint, verl trainer.resume_mode)");
  add_setting(sub, "--memory-plan", c.memory_plan,
              "Print the run's predicted peak memory per phase (rollout, log-probs, update) and exit, without "
              "loading weights: table or json")
      ->expected(0, 1)
      ->default_str("table")  // the value of a bare --memory-plan
      ->configurable(false)
      ->check(CLI::IsMember({"table", "json"}));
  add_switch(sub, "--ignore-memory-plan", c.ignore_memory_plan,
             "On CUDA, train even where the memory plan exceeds the GPU's free memory");
  add_switch(sub, "--overwrite", c.overwrite,
             "Replace the run already in --output (its metrics, evaluations, checkpoints, report; TRL "
             "overwrite_output_dir)")
      ->configurable(false)
      ->excludes(resume);
}

void add_data_options(CLI::App& sub, TrainCommand& c) {
  // The seed's prompt has newlines: --help names it instead (--print-config still writes the value, or says why not).
  add_setting(sub, "--system-prompt", c.options.system_prompt, "System prompt")->default_str("the seed project's");
  add_setting(sub, "--data-preset", c.data_preset,
              "The data's layout: gsm8k (question, answer \"... #### N\"), gsm8k_chinese (question_zh-cn, "
              "answer_only), verl (prompt as chat messages, reward_model.ground_truth)")
      ->check(CLI::IsMember({"gsm8k", "gsm8k_chinese", "verl"}));
  add_setting(sub, "--question-field", c.fields.question, "JSON field of the question")->default_str("the preset's");
  add_setting(sub, "--answer-field", c.fields.answer, "JSON field of the answer")->default_str("the preset's");
  add_setting(sub, "--answer-format", c.answer_format, "gsm8k (\"... #### N\") or number")
      ->default_str("the preset's")
      ->check(CLI::IsMember({"gsm8k", "number"}));
  add_setting(sub, "--chat-template", c.chat_template,
              "check: refuse a model whose tokenizer_config.json chat template differs from the built-in Qwen2.5 "
              "one; builtin: use the built-in one regardless")
      ->check(CLI::IsMember({"check", "builtin"}));
  add_switch(sub, "--skip-bad-lines", c.skip_bad_lines, "Skip (and count) malformed data lines instead of stopping");
  add_switch(sub, "--lenient-answers", c.lenient_answers,
             "Read answers leniently (-7, 1,080); default: the seed's parser");
}

// The settings together, as the trainer will see them: what one flag's validator cannot see.
void check_train_command(const TrainCommand& c) {
  const TrainOptions options = resolved_options(c);
  if (c.dtype == "bfloat16" && !c.allow_bf16_weights && options.total_steps > 0) {
    throw CLI::ValidationError(
        "--dtype", "bfloat16 weights lose the updates: an AdamW step of lr " + exact_number_text(options.lr) +
                       " is below bfloat16's resolution for most weights. Use --autocast bfloat16 (float32 weights, "
                       "bfloat16 forward passes), or pass --allow-bf16-weights to train bfloat16 weights anyway");
  }
  if (options.rewards.dummy_accuracy > 0.0 && c.load_format != "dummy") {
    throw CLI::ValidationError("--dummy-accuracy",
                               "replaces GSM8K's correctness, which only random weights need: pass --load-format dummy "
                               "with it, or leave it at 0");
  }
  try {
    options.validate();
  } catch (const std::invalid_argument& error) {
    throw settings_error(*c.app, error.what());
  }
}

}  // namespace

int report_stop(bool root, const RunResult& result, const std::string& how_to_continue) {
  // A rank that stopped because another rank was signalled reports SIGTERM, what launchers send.
  const int signal = stop_signal() != 0 ? stop_signal() : SIGTERM;
  if (root) {
    std::fflush(stdout);
    std::fprintf(stderr, "qwen_gsm8k: stopped by %s after step %lld; %s; %s\n", signal_name(signal).c_str(),
                 static_cast<long long>(result.step),
                 result.checkpoint.empty() ? "nothing saved" : ("checkpoint " + result.checkpoint.string()).c_str(),
                 how_to_continue.c_str());
    std::fflush(stderr);
  }
  return 128 + signal;
}

TrainOptions resolved_options(const TrainCommand& c) {
  TrainOptions options = c.options;
  if (c.lenient_answers) options.rewards.answer_mode = dapo::gsm8k::AnswerMode::kLenient;
  if (c.autocast != "off") options.autocast = c.autocast == "bfloat16" ? torch::kBFloat16 : torch::kHalf;
  options.output_dir = c.output;
  options.model_dir = c.model_dir;
  return options;
}

void add_train_command(CLI::App& app, TrainCommand& command) {
  CLI::App* sub = app.add_subcommand("train", "DAPO on GSM8K JSON lines with a Hugging Face Qwen2.5 model");
  sub->option_defaults()->always_capture_default();
  add_config_options(*sub, command.print_config);  // first: see add_config_options
  TrainOptions& o = command.options;
  // --algo grpo sets the baseline's defaults: CLI11 processes options in registration order, so the preset lands before
  // the options registered after it, and a setting given on the command line or in --config then overrides it.
  add_setting(*sub, "--algo", command.algorithm,
              "dapo, or grpo: the baseline's defaults (clip 0.2/0.2, seq-mean-token-mean, no dynamic sampling, no "
              "overlong shaping) for the settings not given")
      ->check(CLI::IsMember({"dapo", "grpo"}))
      ->each([&o](const std::string& name) {
        if (name == "grpo") o.use_grpo_baseline();
      });
  add_io_options(*sub, command);
  add_data_options(*sub, command);
  add_run_options(*sub, {.total_steps = &o.total_steps,
                         .train_batch_size = &o.train_batch_size,
                         .ppo_mini_batch_size = &o.ppo_mini_batch_size,
                         .lr = &o.lr,
                         .seed = &o.seed,
                         .rollout_n = &o.rollout_n,
                         .ppo_epochs = &o.ppo_epochs,
                         .cosine_schedule = &o.cosine_schedule,
                         .warmup_steps = &o.warmup_steps,
                         .shared_prompt = &o.shared_prompt,
                         .eval_every = &o.eval_every,
                         .eval_problems = &o.eval_problems,
                         .loggers = &o.loggers,
                         .log_rollouts = &o.log_rollouts,
                         .quiet = &o.quiet});
  add_train_options(*sub, o);
  add_algorithm_options(*sub, {.mode = &o.loss.mode,
                               .tau_pos = &o.loss.tau_pos,
                               .tau_neg = &o.loss.tau_neg,
                               .dro_beta = &o.loss.dro_beta,
                               .adv_estimator = &o.adv_estimator,
                               .extras = &o.extras});
  add_launch_options(*sub, command.launch,
                     "Start this many data-parallel ranks on this machine (or use torchrun-style RANK, WORLD_SIZE, "
                     "LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
  sub->callback([&command] { check_train_command(command); });
  command.app = sub;
}

void prepare_train_output(const TrainCommand& command) {
  const OutputReuse reuse = !command.resume.empty() ? OutputReuse::kResume
                            : command.overwrite     ? OutputReuse::kOverwrite
                                                    : OutputReuse::kRefuse;
  RunDirectory{command.output}.prepare(
      reuse, "pass --resume DIR to continue it, --overwrite to replace it, or choose another --output");
}

namespace {

MemoryPlanInput memory_plan_input(const TrainCommand& command) {
  MemoryPlanInput input;
  input.config = Config::from_file(std::filesystem::path(command.model_dir) / "config.json");
  input.options = resolved_options(command);
  const Tokenizer tokenizer = Tokenizer::from_directory(command.model_dir);
  const DataFields fields = data_fields(command.data_preset, command.fields, command.answer_format);
  const auto data =
      load_problems(command.train_file, fields, command.skip_bad_lines ? BadLines::kSkip : BadLines::kError);
  input.max_prompt_tokens = longest_prompt_tokens(tokenizer, input.options.system_prompt, data.problems);
  if (input.max_prompt_tokens == 0) {
    throw std::invalid_argument("memory plan: " + command.train_file + " holds no problem to take prompt lengths from");
  }
  input.weight_bytes = command.dtype == "bfloat16" ? 2 : 4;
  const torch::Device device(command.device);
  input.cuda = device.is_cuda();
  if (!input.cuda) input.process_bytes = kCpuProcessBytes;
  input.eager_attention = !uses_sdpa_on_cpu();
  const char* world = std::getenv("WORLD_SIZE");
  input.world_size = command.launch.nproc > 1 ? command.launch.nproc : world != nullptr ? std::atoi(world) : 1;
  input.world_size = std::max(input.world_size, 1);
  return input;
}

}  // namespace

MemoryPlan train_memory_plan(const TrainCommand& command) {
  return plan_memory(memory_plan_input(command));
}

int run_memory_plan_command(const TrainCommand& command, std::ostream& out) {
  const MemoryPlanInput input = memory_plan_input(command);
  const MemoryPlan plan = plan_memory(input);
  if (command.memory_plan == "json") {
    out << plan.to_json().dump() << "\n";
    return 0;
  }
  out << "memory plan: " << command.model_dir << " (" << input.config.num_hidden_layers << " layers, hidden "
      << input.config.hidden_size << "), " << (input.cuda ? "CUDA" : "CPU") << ", "
      << (input.options.autocast ? "bfloat16/float16 autocast" : "no autocast")
      << (input.options.gradient_checkpointing ? ", gradient checkpointing" : "") << ", " << input.world_size
      << " rank(s); per rank, " << (input.cuda ? "tensors only" : "tensors and the process's own memory") << "\n"
      << plan.table();
  return 0;
}

namespace {

// What the forward computes in: autocast's dtype, or the weights'.
torch::ScalarType options_dtype(const TrainOptions& options, torch::ScalarType weights) {
  return options.autocast.value_or(weights);
}

// On CUDA, before any weight is loaded: the plan's peak against the GPU's free memory, with a margin for what the
// caching allocator reserves beyond its tensors. Refuses with the plan and the settings that would fit.
void check_memory_plan(const TrainCommand& command, torch::Device device) {
  if (!device.is_cuda() || command.ignore_memory_plan) return;
  const auto memory = device_memory_info(device);
  if (!memory) return;
  const MemoryPlanInput input = memory_plan_input(command);
  const MemoryPlan plan = plan_memory(input);
  const auto available = static_cast<int64_t>(static_cast<double>(memory->free_bytes) / kCudaReservedMargin);
  if (plan.peak_bytes() <= available) return;
  std::string message = "the memory plan's peak, " + gib_text(plan.peak_bytes()) + " in the " + plan.peak_phase().name +
                        " phase, exceeds what " + device.str() + "'s free " + gib_text(memory->free_bytes) +
                        " allows with the caching allocator's margin (" + gib_text(available) + "):\n" + plan.table();
  const std::vector<std::string> fitting = settings_that_fit(input, available);
  if (fitting.empty()) {
    message += "no setting the plan knows fits; a smaller model, fewer rows or a larger GPU is needed";
  } else {
    message += "settings that fit:";
    for (const auto& flags : fitting) message += "\n  " + flags;
  }
  throw std::runtime_error(message + "\n(--ignore-memory-plan trains anyway)");
}

}  // namespace

int run_train_command(TrainCommand command, const DistributedConfig& distributed) {
  command.fields = data_fields(command.data_preset, command.fields, command.answer_format);
  const TrainOptions options = resolved_options(command);
  // Before any work: a device this process cannot use is refused with a sentence that says why.
  torch::Device device = usable_device(command.device, "train");
  // One GPU per rank: cuda means cuda:LOCAL_RANK under a launcher.
  if (device.is_cuda() && !device.has_index() && distributed.world_size > 1) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(distributed.local_rank));
    check_device(device, "train");
  }
  // This rank's GPU becomes the current one, as torchrun scripts call torch.cuda.set_device(local_rank): streams,
  // NCCL and any allocation without an explicit device then stay on it instead of GPU 0.
  if (device.is_cuda() && device.has_index()) c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
  const auto communicator = Communicator::create(distributed, device);
  const auto dtype = command.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  check_memory_plan(command, device);
  if (device.is_cuda() &&
      !command.model_dir
           .empty()) {  // which attention kernel the layers' calls take here (the math fallback would be slow)
    const Config config = Config::from_file(std::filesystem::path(command.model_dir) / "config.json");
    const auto tensors = torch::TensorOptions().device(device).dtype(options_dtype(options, dtype));
    std::printf(
        "attention on %s: scaled_dot_product_attention backend %lld for the training forward, %lld for "
        "decoding (0 math, 1 flash, 2 memory-efficient, 3 cuDNN)\n",
        device.str().c_str(), static_cast<long long>(attention_backend(config, 8, 512, 512, /*masked=*/false, tensors)),
        static_cast<long long>(attention_backend(config, 64, 1, 512, /*masked=*/true, tensors)));
  }
  // Before anything slow: a model whose chat template is not the built-in ChatML renderer's would train on prompts
  // in a format it never saw.
  if (command.chat_template == "check") check_chat_template(command.model_dir);
  const auto bad = command.skip_bad_lines ? BadLines::kSkip : BadLines::kError;
  auto train = load_problems(command.train_file, command.fields, bad);
  std::vector<Problem> test;
  if (!command.test_file.empty()) test = load_problems(command.test_file, command.fields, bad).problems;
  if (communicator->is_root()) {
    std::printf("data: %zu training problems (%lld lines skipped), %zu test problems\n", train.problems.size(),
                static_cast<long long>(train.skipped_lines), test.size());
  }
  LoadOptions load;
  if (communicator->is_root() && !options.quiet) {
    load.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()), std::fflush(stdout); };
  }
  auto model = command.load_format == "dummy"
                   ? random_model(Config::from_file(std::filesystem::path(command.model_dir) / "config.json"),
                                  options.seed, device, dtype)
                   : load_model(command.model_dir, dtype, device, load);
  auto tokenizer = Tokenizer::from_directory(command.model_dir);
  Trainer trainer(model, tokenizer, train.problems, test, options, communicator);
  if (!command.resume.empty()) {
    trainer.resume(command.resume);
    if (communicator->is_root()) {
      std::printf("resumed at step %lld from %s\n", static_cast<long long>(trainer.step_index()),
                  command.resume.c_str());
    }
  }
  // From here on SIGTERM / SIGINT stop the run after the step under way, with a checkpoint (common/stop_request.hpp).
  install_stop_handlers(distributed.world_size > 1 ? RepeatedSignal::kAsksToStop : RepeatedSignal::kKills);
  trainer.set_stop_request([] { return stop_signal() != 0; });
  const RunResult result = trainer.run();
  communicator->barrier();  // rank 0 serves the rendezvous store: it leaves last
  if (!result.stopped) return 0;
  const std::string checkpoints = RunDirectory{command.output}.checkpoints().string();
  return report_stop(communicator->is_root(), result, "continue with the same command plus --resume " + checkpoints);
}

}  // namespace qwen::cli
