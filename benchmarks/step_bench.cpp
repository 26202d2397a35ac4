// The driver's training throughput: whole DAPO steps (Trainer::step) of a random Qwen2 model, with the split between
// rollout (KV-cache generation of G responses per prompt) and update (old log-probs + ppo_epochs x mini-batches of
// forward/backward/AdamW). Random weights rarely emit a stop token, so responses run to --new-tokens and the token
// counts are those of the settings. Before timing it checks the step itself: the first update is on-policy (clip
// fraction 0 in the first mini-batch) and the loss is finite.
// Usage: step_bench [--shape demo|small] [--prompts P] [--rollout-n G] [--new-tokens N] [--mini P] [--epochs E]
//                   [--steps S] [--threads T] [--json PATH] [--tokenizer DIR]
//   demo:  the built-in demo model (hidden 64, 3 layers, byte vocabulary of 259) and its byte-level tokenizer
//   small: hidden 256, 4 layers, 4 / 2 heads, intermediate 1024, Qwen2.5's vocabulary (151936) with tied embeddings
//          (the lm-head dominates, as in the 0.5B-1.5B models) and the Qwen2.5 tokenizer from --tokenizer DIR
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "support/harness.hpp"

namespace {

qwen::Config small_shape() {
  return qwen::Config::from_json({{"model_type", "qwen2"},
                                  {"vocab_size", 151936},
                                  {"hidden_size", 256},
                                  {"intermediate_size", 1024},
                                  {"num_hidden_layers", 4},
                                  {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2},
                                  {"max_position_embeddings", 4096},
                                  {"tie_word_embeddings", true}},
                                 "step_bench small shape");
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Args {
  std::string shape = "small", json_path = "step_bench.json", tokenizer_dir;
  int64_t prompts = 8, rollout_n = 4, new_tokens = 64, mini = 4, epochs = 2, steps = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

// Throws std::invalid_argument naming a bad flag.
Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--shape")
      args.shape = value;
    else if (flag == "--prompts")
      args.prompts = std::stoll(value);
    else if (flag == "--rollout-n")
      args.rollout_n = std::stoll(value);
    else if (flag == "--new-tokens")
      args.new_tokens = std::stoll(value);
    else if (flag == "--mini")
      args.mini = std::stoll(value);
    else if (flag == "--epochs")
      args.epochs = std::stoll(value);
    else if (flag == "--steps")
      args.steps = std::stoll(value);
    else if (flag == "--threads")
      args.threads = std::stoi(value);
    else if (flag == "--json")
      args.json_path = value;
    else if (flag == "--tokenizer")
      args.tokenizer_dir = value;
    else
      throw std::invalid_argument("unknown option " + flag);
  }
  if (args.shape != "demo" && args.shape != "small") {
    throw std::invalid_argument("--shape is " + args.shape + ", expected demo or small");
  }
  if (args.shape == "small" && args.tokenizer_dir.empty()) {
    throw std::invalid_argument("the small shape needs --tokenizer DIR (the Qwen2.5 tokenizer.json)");
  }
  return args;
}

qwen::TrainOptions step_options(const Args& args) {
  qwen::TrainOptions options;
  options.total_steps = args.steps + 1;
  options.train_batch_size = args.prompts;
  options.rollout_n = args.rollout_n;
  options.ppo_mini_batch_size = args.mini;
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
  dapo::bench::Usage usage;  // per timed step: CPU seconds and page faults (getrusage)
};

StepTimes time_steps(qwen::Trainer& trainer, int64_t steps) {
  const nlohmann::json first = trainer.step();  // warm-up, and the check
  if (first.at("clip_fraction_by_minibatch").at(0).get<double>() != 0.0 ||
      !std::isfinite(first.at("loss").get<double>())) {
    throw std::runtime_error("step_bench: the first update is not on-policy or the loss is not finite: " +
                             first.dump());
  }
  StepTimes times;
  const auto before = dapo::bench::Usage::now();
  for (int64_t s = 0; s < steps; ++s) {
    const nlohmann::json row = trainer.step();
    times.rollout_tps.push_back(row.at("rollout_tokens_per_second"));
    times.update_tps.push_back(row.at("update_tokens_per_second"));
    times.rollout_s.push_back(row.at("rollout_seconds"));
    times.update_s.push_back(row.at("update_seconds"));
    times.step_s.push_back(row.at("step_seconds"));
    times.lengths.push_back(row.at("response_length_mean"));
  }
  times.usage = (dapo::bench::Usage::now() - before).per(static_cast<double>(steps));
  return times;
}

void report(const Args& args, const StepTimes& times, int64_t parameters, const qwen::TrainOptions& options) {
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
  const nlohmann::json record{{"benchmark", "DAPO step: rollout and update throughput"},
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
                              {"per_step_usage", times.usage.to_json()}};
  dapo::bench::write_json(record, args.json_path);
  std::printf("wrote %s\n", args.json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "step_bench: %s\n", error.what());
    return 2;
  }
  at::set_num_threads(args.threads);
  torch::manual_seed(0);
  const qwen::Config config = args.shape == "demo" ? qwen::demo_model_config() : small_shape();
  qwen::Qwen2ForCausalLM model(config);
  qwen::initialize_weights(model);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const qwen::Tokenizer tokenizer = args.shape == "demo"
                                        ? qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
                                        : qwen::Tokenizer::from_directory(args.tokenizer_dir);
  const qwen::DemoProblems problems = qwen::make_demo_problems({.test_count = 4, .seed = 3});
  const qwen::TrainOptions options = step_options(args);
  qwen::Trainer trainer(model, tokenizer, problems.train, problems.test, options);
  std::printf(
      "DAPO step, %s shape (%.1fM parameters), float32; %d prompts x %d responses, %d new tokens, %d x %d "
      "updates; %s, %d threads, %s allocator\n",
      args.shape.c_str(), static_cast<double>(parameters) / 1e6, static_cast<int>(args.prompts),
      static_cast<int>(args.rollout_n), static_cast<int>(args.new_tokens), static_cast<int>(args.epochs),
      static_cast<int>(args.prompts / args.mini), dapo::bench::cpu_model().c_str(), args.threads,
      dapo::bench::allocator().c_str());
  report(args, time_steps(trainer, args.steps), parameters, options);
  return 0;
}
