// The driver's training throughput: whole DAPO steps (Trainer::step) of a random Qwen2 model, with the split between
// rollout (KV-cache generation of G responses per prompt) and update (old log-probs + ppo_epochs x mini-batches of
// forward/backward/AdamW). Random weights rarely emit a stop token, so responses run to --new-tokens and the token
// counts are those of the settings. Before timing it checks the step itself: the first update is on-policy (clip
// fraction 0 in the first mini-batch) and the loss is finite.
// Usage: step_bench [--shape demo|small|qwen2.5-0.5b|qwen2.5-1.5b] [--prompts P] [--rollout-n G] [--new-tokens N]
//                   [--mini P] [--micro P] [--epochs E] [--steps S] [--device cpu|cuda[:N]]
//                   [--autocast bfloat16|float16|off] [--gradient-checkpointing 0|1] [--threads T] [--json PATH]
//                   [--tokenizer DIR]
//   demo:  the built-in demo model (hidden 64, 3 layers, byte vocabulary of 259) and its byte-level tokenizer
//   small: hidden 256, 4 layers, 4 / 2 heads, intermediate 1024, Qwen2.5's vocabulary (151936) with tied embeddings
//          (the lm-head dominates, as in the 0.5B-1.5B models) and the Qwen2.5 tokenizer from --tokenizer DIR
//   qwen2.5-0.5b, qwen2.5-1.5b: those models' shapes (support/shapes.hpp), with the tokenizer from --tokenizer DIR
//   --micro: prompts (groups) per forward/backward (TrainOptions::ppo_micro_batch_size); 0 = the mini-batch (default)
//   --device: where the model lives (the trainer follows its weights); float32 weights and AdamW state everywhere
//   --autocast: the forward passes' dtype (TrainOptions::autocast); default off on cpu, bfloat16 on cuda
//   --gradient-checkpointing 1: the update recomputes each decoder layer in the backward (TrainOptions)
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/memory_plan.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "support/device.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/random_model.hpp"
#include "support/shapes.hpp"

namespace {

using dapo::bench::median;

struct Args {
  std::string shape = "small", json_path = "step_bench.json", tokenizer_dir, autocast_name;
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> autocast;
  int64_t prompts = 8, rollout_n = 4, new_tokens = 64, mini = 4, micro = 0, epochs = 2, steps = 3;
  int64_t gradient_checkpointing = 0;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

// Throws std::invalid_argument naming a bad flag, before any work (the device's availability included); nullopt when
// --help printed the flags.
std::optional<Args> parse_args(int argc, char** argv) {
  Args args;
  std::string device = "cpu";
  dapo::bench::Flags flags("step_bench");
  flags.text("--shape", args.shape, "NAME", "demo, small, qwen2.5-0.5b or qwen2.5-1.5b")
      .integer("--prompts", args.prompts, 1, "P", "prompts per step")
      .integer("--rollout-n", args.rollout_n, 1, "G", "responses per prompt")
      .integer("--new-tokens", args.new_tokens, 1, "N", "most tokens per response")
      .integer("--mini", args.mini, 1, "P", "prompts per update (mini-batch)")
      .integer("--micro", args.micro, 0, "P", "prompts per forward/backward; 0 = the mini-batch")
      .text("--device", device, "DEVICE", "cpu, cuda or cuda:N")
      .text("--autocast", args.autocast_name, "TYPE", "bfloat16, float16 or off (default bfloat16 on cuda, off on cpu)")
      .integer("--gradient-checkpointing", args.gradient_checkpointing, 0, "0|1",
               "1: recompute each decoder layer in the backward (TrainOptions::gradient_checkpointing)")
      .integer("--epochs", args.epochs, 1, "E", "PPO epochs per step")
      .integer("--steps", args.steps, 1, "S", "timed steps")
      .integer("--threads", args.threads, 1, "T", "CPU threads")
      .text("--json", args.json_path, "PATH", "where the JSON record goes")
      .text("--tokenizer", args.tokenizer_dir, "DIR", "the Qwen2.5 tokenizer.json's folder (all shapes but demo)");
  if (!flags.parse(argc, argv)) return std::nullopt;
  args.device = dapo::bench::parse_device(device);
  dapo::bench::model_shape(args.shape);  // throws for an unknown shape
  if (args.shape != "demo" && args.tokenizer_dir.empty()) {
    throw std::invalid_argument("the " + args.shape + " shape needs --tokenizer DIR (the Qwen2.5 tokenizer.json)");
  }
  if (args.gradient_checkpointing > 1) {
    throw std::invalid_argument("--gradient-checkpointing is '" + std::to_string(args.gradient_checkpointing) +
                                "', expected 0 or 1");
  }
  args.autocast = dapo::bench::parse_autocast(args.autocast_name, args.device);
  return args;
}

qwen::TrainOptions step_options(const Args& args) {
  qwen::TrainOptions options;
  options.total_steps = args.steps + 1;
  options.train_batch_size = args.prompts;
  options.rollout_n = args.rollout_n;
  options.ppo_mini_batch_size = args.mini;
  options.ppo_micro_batch_size = args.micro;
  options.autocast = args.autocast;
  options.gradient_checkpointing = args.gradient_checkpointing == 1;
  options.ppo_epochs = args.epochs;
  options.dynamic_sampling = false;  // a random model is never right
  options.max_new_tokens = args.new_tokens;
  options.lr = 1e-5;
  options.quiet = true;
  options.system_prompt = "Answer with <think> then <answer>.";
  return options;
}

struct StepTimes {
  std::vector<double> rollout_tps, update_tps, rollout_s, update_s, step_s, lengths;
  dapo::bench::Usage usage;                     // per timed step: CPU seconds and page faults (getrusage)
  std::optional<dapo::bench::PeakMemory> peak;  // over the timed steps, on CUDA
};

StepTimes time_steps(qwen::Trainer& trainer, int64_t steps, torch::Device device) {
  const nlohmann::json first = trainer.step();  // warm-up, and the check
  if (first.at("actor/pg_clipfrac_by_update").at(0).get<double>() != 0.0 ||
      !std::isfinite(first.at("actor/pg_loss").get<double>())) {
    throw std::runtime_error("step_bench: the first update is not on-policy or the loss is not finite: " +
                             first.dump());
  }
  StepTimes times;
  dapo::bench::synchronize(device);
  dapo::bench::reset_peak_memory(device);
  const auto before = dapo::bench::Usage::now();
  for (int64_t s = 0; s < steps; ++s) {
    const nlohmann::json row = trainer.step();
    times.rollout_tps.push_back(row.at("perf/rollout_tokens_per_second"));
    times.update_tps.push_back(row.at("perf/update_tokens_per_second"));
    times.rollout_s.push_back(row.at("timing_s/gen"));
    times.update_s.push_back(row.at("timing_s/update_actor"));
    times.step_s.push_back(row.at("timing_s/step"));
    times.lengths.push_back(row.at("sampled/response_length/mean"));
  }
  times.usage = (dapo::bench::Usage::now() - before).per(static_cast<double>(steps));
  times.peak = dapo::bench::peak_memory(device);
  return times;
}

void report(const Args& args, const StepTimes& times, int64_t parameters, const qwen::TrainOptions& options,
            const qwen::MemoryPlan& plan) {
  const double step_median = median(times.step_s);
  std::printf("%-34s %12s\n", "median over steps", "value");
  std::printf("%-34s %12.1f\n", "response length (tokens)", median(times.lengths));
  std::printf("%-34s %12.1f\n", "rollout tokens/s (generated)", median(times.rollout_tps));
  std::printf("%-34s %12.1f\n", "update tokens/s (all, x passes)", median(times.update_tps));
  std::printf("%-34s %12.2f  (%.0f%%)\n", "rollout seconds", median(times.rollout_s),
              100 * median(times.rollout_s) / step_median);
  std::printf("%-34s %12.2f  (%.0f%%)\n", "update seconds", median(times.update_s),
              100 * median(times.update_s) / step_median);
  std::printf("%-34s %12.2f\n", "step seconds", step_median);
  std::printf("%-34s %12.0f\n", "page faults per step (mean)", times.usage.minor_faults + times.usage.major_faults);
  std::printf("%-34s %12.2f\n", "user CPU seconds per step (mean)", times.usage.user_seconds);
  std::printf("%-34s %12.2f\n", "system CPU seconds per step (mean)", times.usage.system_seconds);
  if (args.device.is_cuda()) {
    std::printf("%-34s %s\n", "peak device memory", dapo::bench::peak_memory_text(times.peak, args.device).c_str());
  }
  std::printf("%-34s %12.2f  GiB (%s)\n", "memory plan's peak", static_cast<double>(plan.peak_bytes()) / (1 << 30),
              plan.peak_phase().name.c_str());
  nlohmann::json record{{"benchmark", "DAPO step: rollout and update throughput"},
                        {"machine", dapo::bench::machine()},
                        {"shape", args.shape},
                        {"parameters", parameters},
                        {"settings", options.to_json()},
                        {"response_length", median(times.lengths)},
                        {"rollout_tokens_per_second", median(times.rollout_tps)},
                        {"update_tokens_per_second", median(times.update_tps)},
                        {"rollout_seconds", median(times.rollout_s)},
                        {"update_seconds", median(times.update_s)},
                        {"step_seconds", step_median},
                        {"per_step_usage", times.usage.to_json()},
                        {"device", args.device.str()},
                        {"device_name", dapo::bench::device_name(args.device)},
                        {"autocast", args.autocast_name},
                        {"memory_plan", plan.to_json()}};
  record.update(dapo::bench::peak_memory_json(times.peak));
  dapo::bench::write_json(record, args.json_path);
  std::printf("wrote %s\n", args.json_path.c_str());
}

void run(const Args& args) {
  auto [config, model, blas_threads, parameters] = dapo::bench::random_model(args.shape, args.device, args.threads);
  const qwen::Tokenizer tokenizer = args.shape == "demo"
                                        ? qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
                                        : qwen::Tokenizer::from_directory(args.tokenizer_dir);
  const qwen::DemoProblems problems = qwen::make_demo_problems({.test_count = 4, .seed = 3});
  const qwen::TrainOptions options = step_options(args);
  // The memory plan of these settings, for the device's measured peak beside it (train --memory-plan's arithmetic).
  qwen::MemoryPlanInput plan_input{.config = config, .options = options};
  for (const auto& problem : problems.train) {
    plan_input.max_prompt_tokens =
        std::max(plan_input.max_prompt_tokens,
                 static_cast<int64_t>(qwen::prompt_ids(tokenizer, options.system_prompt, problem.question).size()));
  }
  plan_input.cuda = args.device.is_cuda();
  plan_input.eager_attention = !qwen::uses_sdpa_on_cpu();
  const qwen::MemoryPlan plan = qwen::plan_memory(plan_input);
  qwen::Trainer trainer(model, tokenizer, problems.train, problems.test, options);
  // The CPU line reads as it always did; the device and autocast are named when they are not the CPU's defaults.
  const std::string precision = args.autocast ? "float32, autocast " + args.autocast_name : "float32";
  const std::string on_device = args.device.is_cpu() ? "" : " on " + dapo::bench::device_name(args.device);
  std::printf(
      "DAPO step, %s shape (%.1fM parameters), %s%s; %d prompts x %d responses, %d new tokens, %d x %d "
      "updates; %s, %d threads (OpenBLAS %d), %s allocator\n",
      args.shape.c_str(), static_cast<double>(parameters) / 1e6, precision.c_str(), on_device.c_str(),
      static_cast<int>(args.prompts), static_cast<int>(args.rollout_n), static_cast<int>(args.new_tokens),
      static_cast<int>(args.epochs), static_cast<int>(args.prompts / args.mini), dapo::bench::cpu_model().c_str(),
      args.threads, blas_threads, dapo::bench::allocator().c_str());
  report(args, time_steps(trainer, args.steps, args.device), parameters, options, plan);
}

}  // namespace

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  return dapo::bench::run_main<Args>(
      "step_bench",
      [&]() -> std::optional<Args> {
        std::optional<Args> args = parse_args(argc, argv);
        if (args) step_options(*args).validate();  // the trainer's own checks (--micro divides --mini, ...)
        return args;
      },
      run);
}
