// The update with each group's prompt computed once (TrainOptions::shared_prompt) against each row computed whole: one
// PolicyUpdate::run (one optimizer update over the batch, one group per forward/backward, the old log-probs from that
// forward) on a batch of --groups groups of G responses, for each G of --rollout-n, paired runs A B A B (the weights
// restored before each), the ratio per pair. Prompt lengths spread 0.8-1.2x around --prompt over the groups; response
// lengths 0.5-1.5x around --response over the rows (deterministic), so rows pad as sampled ones do. The default
// --prompt 98 is the seed's prompt on GSM8K's train split: system prompt and question in Qwen2.5's chat template, mean
// 98 tokens (median 94, 10th-90th percentile 74-127) with the Qwen2.5 tokenizer.
// Reported per G: update tokens/s both ways (real prompt + response tokens of the batch per second: the same count
// both ways), the speed-up (median of the pairs' ratios), the positions each forward computes, and the peak memory
// beyond the weights (CPU: the tracking allocator's tensor bytes, gradients and AdamW state included; CUDA: the caching
// allocator's peak allocated), and on the CPU the activations' peak (one group's forward and backward beyond the
// weights and their gradients). Before timing it checks that the two ways give the same loss (1e-4 relative).
// Usage: shared_prompt_bench [--shape NAME] [--groups N] [--rollout-n G,G,...] [--prompt P] [--response R]
//                            [--pairs K] [--device cpu|cuda[:N]] [--autocast bfloat16|float16|off] [--threads T]
//                            [--json PATH]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/model/memory_tracker.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/device.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/random_model.hpp"
#include "support/shapes.hpp"
#include "support/update_batch.hpp"

namespace {

using dapo::bench::median;

struct Args {
  std::string shape = "qwen2.5-1.5b-2-layers", json_path = "shared_prompt_bench.json", sizes = "4,8,16", autocast_name;
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> autocast;
  std::vector<int64_t> group_sizes;
  int64_t groups = 1, prompt = 98, response = 192, pairs = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

std::optional<Args> parse_args(int argc, char** argv) {
  Args args;
  std::string device = "cpu";
  dapo::bench::Flags flags("shared_prompt_bench");
  flags.text("--shape", args.shape, "NAME", dapo::bench::kShapeNames)
      .integer("--groups", args.groups, 1, "N", "groups (prompts) in the batch")
      .text("--rollout-n", args.sizes, "G,G,...", "responses per prompt, one run each")
      .integer("--prompt", args.prompt, 2, "P", "mean prompt tokens")
      .integer("--response", args.response, 2, "R", "mean response tokens")
      .integer("--pairs", args.pairs, 1, "K", "timed pairs (unshared, shared) per G")
      .text("--device", device, "DEVICE", "cpu, cuda or cuda:N")
      .text("--autocast", args.autocast_name, "TYPE", "bfloat16, float16 or off (default bfloat16 on cuda, off on cpu)")
      .integer("--threads", args.threads, 1, "T", "CPU threads")
      .text("--json", args.json_path, "PATH", "where the JSON record goes");
  if (!flags.parse(argc, argv)) return std::nullopt;
  args.device = dapo::bench::parse_device(device);
  dapo::bench::model_shape(args.shape);  // throws for an unknown shape
  std::stringstream list(args.sizes);
  for (std::string item; std::getline(list, item, ',');) {
    args.group_sizes.push_back(dapo::bench::parse_int("--rollout-n", item, 2, 1 << 20));
  }
  if (args.group_sizes.empty()) throw std::invalid_argument("--rollout-n is empty, expected G,G,... (each >= 2)");
  args.autocast = dapo::bench::parse_autocast(args.autocast_name, args.device);
  return args;
}

struct Run {
  double seconds = 0, loss = 0;
  int64_t peak_bytes = 0;
};

// One update from the saved weights: a fresh AdamW, the batch copied (the update writes its log-probs).
Run run_update(qwen::Qwen2ForCausalLM& model, const std::vector<torch::Tensor>& saved, const qwen::TrainBatch& batch,
               const qwen::TrainOptions& options, torch::Device device) {
  {
    const torch::NoGradGuard no_grad;
    const auto parameters = model->parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i].copy_(saved[i]);
  }
  qwen::ClippedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.lr));
  const auto communicator = qwen::Communicator::create({}, device);
  qwen::PolicyUpdate update{model, optimizer, *communicator, options};
  qwen::TrainBatch copy = batch;
  int64_t updates = 0;
  Run run;
  dapo::bench::synchronize(device);
  dapo::bench::reset_peak_memory(device);
  std::optional<qwen::CpuMemoryTracker> tracker;
  if (device.is_cpu()) tracker.emplace();
  const int64_t base = tracker ? tracker->current_bytes() : 0;
  const auto started = std::chrono::steady_clock::now();
  const qwen::UpdateMetrics metrics = update.run(copy, updates);
  dapo::bench::synchronize(device);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  run.loss = metrics.loss;
  if (tracker) {
    run.peak_bytes = tracker->peak_bytes() - base;
  } else if (const auto peak = dapo::bench::peak_memory(device)) {
    run.peak_bytes = peak->allocated_bytes;
  }
  return run;
}

// Positions the forward's per-token work (norms, products) covers: each row whole, G x the longest row of its group's
// micro-batch (padding included); shared, each prompt's tokens once and each response's own (no padding: attention
// alone sees padded views).
std::pair<int64_t, int64_t> computed_positions(const qwen::TrainBatch& batch) {
  int64_t whole = 0, shared = 0;
  const int64_t size = batch.group_size;
  for (int64_t g = 0; g < batch.groups; ++g) {
    int64_t longest = 0;
    const int64_t prompt = batch.padded.prompt_lengths[static_cast<std::size_t>(g * size)];
    shared += prompt;
    for (int64_t r = g * size; r < (g + 1) * size; ++r) {
      const int64_t length = batch.padded.attention_mask[r].sum().item<int64_t>();
      longest = std::max(longest, length);
      shared += length - prompt;
    }
    whole += size * longest;
  }
  return {whole, shared};
}

// On the CPU, the tracking allocator's peak through one forward and backward of the first group (the update's
// micro-batch) beyond what was held before, the gradients already allocated by an earlier backward: the activations
// and the backward's temporaries. 0 elsewhere.
int64_t activation_peak(qwen::Qwen2ForCausalLM& model, const qwen::TrainBatch& batch, const Args& args, bool shared) {
  if (!args.device.is_cpu()) return 0;
  qwen::MicroBatch micro;
  for (int64_t r = 0; r < batch.group_size; ++r) {
    micro.rows.push_back(r);
    micro.length = std::max(micro.length, batch.padded.attention_mask[r].sum().item<int64_t>());
  }
  const qwen::LogprobOptions options{.autocast = args.autocast};
  const auto pass = [&] {
    qwen::micro_batch_logprobs(model, batch.padded, micro, options, shared).logp.sum().backward();
  };
  pass();  // allocates the gradients
  const qwen::CpuMemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  pass();
  model->zero_grad();
  return tracker.peak_bytes() - base;
}

void run(const Args& args) {
  auto [config, model, blas_threads, parameters] = dapo::bench::random_model(args.shape, args.device, args.threads);
  std::vector<torch::Tensor> saved;
  for (const auto& p : model->parameters()) saved.push_back(p.detach().clone());
  std::printf(
      "update with and without the shared prompt, %s shape (%.1fM parameters), %s on %s; %d groups, prompts ~%d "
      "tokens, responses ~%d; %d threads (OpenBLAS %d), %s allocator\n",
      args.shape.c_str(), static_cast<double>(parameters) / 1e6,
      args.autocast ? ("autocast " + args.autocast_name).c_str() : "float32",
      dapo::bench::device_name(args.device).c_str(), static_cast<int>(args.groups), static_cast<int>(args.prompt),
      static_cast<int>(args.response), args.threads, blas_threads, dapo::bench::allocator().c_str());
  std::printf("%4s %9s %9s %10s %10s %8s %10s %10s %10s %10s\n", "G", "positions", "shared", "tokens/s", "shared",
              "speed-up", "peak MiB", "shared", "act. MiB", "shared");
  nlohmann::json results = nlohmann::json::array();
  for (const int64_t group_size : args.group_sizes) {
    const dapo::bench::UpdateBatchShape shape{args.groups, group_size, args.prompt, args.response};
    const qwen::TrainBatch batch = dapo::bench::synthetic_update_batch(shape, config.vocab_size);
    // One group per forward and backward.
    const qwen::TrainOptions whole_options = dapo::bench::one_update_options(shape, 1, args.autocast, false);
    const qwen::TrainOptions shared_options = dapo::bench::one_update_options(shape, 1, args.autocast, true);
    whole_options.validate();
    // The check, and the warm-up of both paths.
    const Run check_whole = run_update(model, saved, batch, whole_options, args.device);
    const Run check_shared = run_update(model, saved, batch, shared_options, args.device);
    dapo::bench::require_close(check_shared.loss, check_whole.loss, 1e-4, "the shared-prompt update's loss");
    std::vector<double> whole_s, shared_s, ratios;
    int64_t whole_peak = 0, shared_peak = 0;
    for (int64_t pair = 0; pair < args.pairs; ++pair) {
      const Run whole = run_update(model, saved, batch, whole_options, args.device);
      const Run shared = run_update(model, saved, batch, shared_options, args.device);
      whole_s.push_back(whole.seconds);
      shared_s.push_back(shared.seconds);
      ratios.push_back(whole.seconds / shared.seconds);
      whole_peak = std::max(whole_peak, whole.peak_bytes);
      shared_peak = std::max(shared_peak, shared.peak_bytes);
    }
    const int64_t whole_activations = activation_peak(model, batch, args, false);
    const int64_t shared_activations = activation_peak(model, batch, args, true);
    const double tokens = batch.padded.attention_mask.sum().item<double>();
    const auto [whole_positions, shared_positions] = computed_positions(batch);
    const double mib = 1 << 20;
    std::printf("%4d %9d %9d %10.1f %10.1f %7.2fx %10.1f %10.1f %10.1f %10.1f\n", static_cast<int>(group_size),
                static_cast<int>(whole_positions), static_cast<int>(shared_positions), tokens / median(whole_s),
                tokens / median(shared_s), median(ratios), static_cast<double>(whole_peak) / mib,
                static_cast<double>(shared_peak) / mib, static_cast<double>(whole_activations) / mib,
                static_cast<double>(shared_activations) / mib);
    results.push_back({{"rollout_n", group_size},
                       {"tokens", tokens},
                       {"positions", whole_positions},
                       {"shared_positions", shared_positions},
                       {"seconds", median(whole_s)},
                       {"shared_seconds", median(shared_s)},
                       {"tokens_per_second", tokens / median(whole_s)},
                       {"shared_tokens_per_second", tokens / median(shared_s)},
                       {"speedup", median(ratios)},
                       {"speedups", ratios},
                       {"peak_bytes", whole_peak},
                       {"shared_peak_bytes", shared_peak},
                       {"activation_bytes", whole_activations},
                       {"shared_activation_bytes", shared_activations}});
  }
  nlohmann::json record{{"benchmark", "the update with and without the shared-prompt forward"},
                        {"machine", dapo::bench::machine()},
                        {"shape", args.shape},
                        {"parameters", parameters},
                        {"groups", args.groups},
                        {"prompt", args.prompt},
                        {"response", args.response},
                        {"device", args.device.str()},
                        {"device_name", dapo::bench::device_name(args.device)},
                        {"autocast", args.autocast_name},
                        {"results", results}};
  dapo::bench::write_json(record, args.json_path);
  std::printf("wrote %s\n", args.json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  return dapo::bench::run_main<Args>(
      "shared_prompt_bench", [&] { return parse_args(argc, argv); }, run);
}
