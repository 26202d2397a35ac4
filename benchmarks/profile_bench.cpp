// Where a DAPO step's GPU time goes: LibTorch's profiler (Kineto, support/kernel_profile.hpp) over the generation
// engine's decode steps and admissions (eager steps and, on CUDA, each step a CUDA-graph replay) and over one update's
// micro-batch (forward, loss, backward) and optimizer step, at the seed's settings on a random model of a named shape
// whose weights are float32 under autocast, as the trainer holds them. Each part runs once unprofiled (warm-up: cuBLAS
// handles, autocast's weight casts, AdamW's state), then once under the profiler. Per scope (engine.hpp's and
// update.hpp's RECORD_USER_SCOPE names): kernels per instance (copies and memsets included), their device time per
// instance, the GPU's busy time over the scope's window against that window's wall time (the rest is the GPU waiting
// for the host), and the kernels that take the most device time. On the CPU there are no kernels: the operators per
// instance (top level and all) and those that take the most host time instead, which is what a dry run shows.
// Usage: profile_bench [--shape NAME] [--device cpu|cuda[:N]] [--autocast bfloat16|float16|off] [--batch B]
//                      [--prompt P] [--new-tokens N] [--groups N] [--rollout-n G] [--response R] [--top K]
//                      [--threads T] [--json PATH] [--markdown PATH]
//   defaults: qwen2.5-1.5b on cuda with bfloat16 autocast; the engine with 64 prompts of 256 tokens, 32 new tokens
//   each (all in slots at once, EOS ignored); the update over 4 groups of 4 responses (prompts ~98 tokens, responses
//   ~128), one micro-batch (the seed's mini-batch of 4 prompts); the 15 top kernels.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/device.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/kernel_profile.hpp"
#include "support/random_model.hpp"
#include "support/shapes.hpp"
#include "support/update_batch.hpp"

namespace {

struct Args {
  std::string shape = "qwen2.5-1.5b", json_path = "profile_bench.json", markdown_path, autocast_name;
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> autocast;
  int64_t batch = 64, prompt = 256, new_tokens = 32, groups = 4, rollout_n = 4, response = 128, top = 15;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

std::optional<Args> parse_args(int argc, char** argv) {
  Args args;
  std::string device = "cuda";
  dapo::bench::Flags flags("profile_bench");
  flags.text("--shape", args.shape, "NAME", dapo::bench::kShapeNames)
      .text("--device", device, "DEVICE", "cpu, cuda or cuda:N")
      .text("--autocast", args.autocast_name, "TYPE", "bfloat16, float16 or off (default bfloat16 on cuda, off on cpu)")
      .integer("--batch", args.batch, 1, "B", "the engine's prompts, one sequence each, all in slots at once")
      .integer("--prompt", args.prompt, 1, "P", "tokens per engine prompt")
      // At least 2: one decode step or more after the prefill's first token.
      .integer("--new-tokens", args.new_tokens, 2, "N", "tokens each engine sequence generates")
      .integer("--groups", args.groups, 1, "N", "groups (prompts) of the update, all in one micro-batch")
      .integer("--rollout-n", args.rollout_n, 2, "G", "responses per group of the update")
      .integer("--response", args.response, 2, "R", "mean response tokens of the update")
      .integer("--top", args.top, 1, "K", "kernels (or operators) listed per scope")
      .integer("--threads", args.threads, 1, "T", "CPU threads")
      .text("--json", args.json_path, "PATH", "where the JSON record goes")
      .text("--markdown", args.markdown_path, "PATH", "where the Markdown tables go too (they are printed anyway)");
  if (!flags.parse(argc, argv)) return std::nullopt;
  args.device = dapo::bench::parse_device(device);
  const qwen::Config config = dapo::bench::model_shape(args.shape);  // throws for an unknown shape
  if (args.prompt + args.new_tokens > config.max_position_embeddings) {
    throw std::invalid_argument("--prompt + --new-tokens exceed the " + args.shape + " shape's context of " +
                                std::to_string(config.max_position_embeddings));
  }
  args.autocast = dapo::bench::parse_autocast(args.autocast_name, args.device);
  return args;
}

// Runs `work` once unprofiled, then once under the profiler; the events of the second run.
std::vector<dapo::bench::ProfiledEvent> profiled(const std::function<void()>& work, torch::Device device) {
  work();
  dapo::bench::synchronize(device);
  dapo::bench::KernelProfiler profiler(device.is_cuda());
  work();
  dapo::bench::synchronize(device);  // the device's work ends inside the profile
  return profiler.stop();
}

// The engine on --batch random prompts of --prompt tokens, every row to --new-tokens (greedy, no stop ids).
std::vector<dapo::bench::ProfiledEvent> profile_engine(qwen::Qwen2ForCausalLM& model, const Args& args,
                                                       bool cuda_graphs, qwen::EngineStats& stats) {
  torch::manual_seed(2);
  const int64_t vocab = std::min<int64_t>(model->config().vocab_size, 151643);  // below Qwen2.5's special tokens
  const torch::Tensor ids = torch::randint(vocab, {args.batch, args.prompt}, torch::kInt64);
  std::vector<qwen::EngineRequest> requests;
  for (int64_t b = 0; b < args.batch; ++b) {
    const int64_t* row = ids[b].data_ptr<int64_t>();
    requests.push_back({.prompt = std::vector<int64_t>(row, row + args.prompt), .n = 1});
  }
  qwen::EngineOptions options;
  options.max_num_seqs = args.batch;
  options.max_new_tokens = args.new_tokens;
  options.sampling.temperature = 0.0;
  options.stop_ids.clear();
  options.cuda_graphs = cuda_graphs;
  const qwen::AutocastGuard autocast(args.device, args.autocast);
  return profiled([&] { qwen::generate_requests(model, requests, options, &stats); }, args.device);
}

// One update (PolicyUpdate::run) over the synthetic batch, the weights put back after each run.
std::vector<dapo::bench::ProfiledEvent> profile_update(qwen::Qwen2ForCausalLM& model, const Args& args) {
  const dapo::bench::UpdateBatchShape shape{args.groups, args.rollout_n, 98, args.response};
  const qwen::TrainBatch batch = dapo::bench::synthetic_update_batch(shape, model->config().vocab_size);
  const qwen::TrainOptions options = dapo::bench::one_update_options(shape, args.groups, args.autocast, true);
  options.validate();
  std::vector<torch::Tensor> saved;
  for (const auto& p : model->parameters()) saved.push_back(p.detach().clone());
  qwen::ClippedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.lr));
  const auto communicator = qwen::Communicator::create({}, args.device);
  qwen::PolicyUpdate update{model, optimizer, *communicator, options};
  const auto run = [&] {
    qwen::TrainBatch copy = batch;  // the update writes its log-probs
    int64_t updates = 0;
    update.run(copy, updates);
    const torch::NoGradGuard no_grad;
    const auto parameters = model->parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i].copy_(saved[i]);
  };
  return profiled(run, args.device);
}

std::string shortened(const std::string& name, std::size_t most = 90) {
  std::string text = name.size() > most ? name.substr(0, most - 3) + "..." : name;
  std::replace(text.begin(), text.end(), '|', '/');  // Markdown's cell separator
  return text;
}

// One scope's tables in Markdown.
std::string markdown(const std::string& title, const dapo::bench::ScopeProfile& profile, bool device) {
  char line[512];
  std::string text =
      "### " + title + " (`" + profile.scope + "`, " + std::to_string(profile.instances) + " instances)\n\n";
  if (device) {
    text +=
        "| kernels per instance | device ms per instance | wall ms per instance | GPU busy in the window | "
        "operators per instance (top level) |\n|---:|---:|---:|---:|---:|\n";
    std::snprintf(line, sizeof line, "| %.0f | %.3f | %.3f | %.0f %% of %.1f ms | %.0f (%.0f) |\n\n",
                  profile.kernels_per_instance, profile.device_ms_per_instance, profile.wall_ms_per_instance,
                  100 * profile.busy_fraction(), profile.window_ms, profile.operators_per_instance,
                  profile.top_level_operators_per_instance);
    text += line;
    text += "| kernel | calls per instance | ms per instance | share of its device time |\n|---|---:|---:|---:|\n";
  } else {
    text += "| operators per instance (top level) | host ms per instance |\n|---:|---:|\n";
    std::snprintf(line, sizeof line, "| %.0f (%.0f) | %.3f |\n\n", profile.operators_per_instance,
                  profile.top_level_operators_per_instance, profile.wall_ms_per_instance);
    text += line;
    text += "| top-level operator | calls per instance | host ms per instance | share of the scope's host time |\n";
    text += "|---|---:|---:|---:|\n";
  }
  const double instances = std::max<double>(1.0, static_cast<double>(profile.instances));
  const double whole = device ? profile.device_ms_per_instance : profile.wall_ms_per_instance;
  for (const auto& total : profile.top) {
    std::snprintf(line, sizeof line, "| `%s` | %.1f | %.4f | %.1f %% |\n", shortened(total.name).c_str(),
                  static_cast<double>(total.calls) / instances, total.ms / instances,
                  whole > 0 ? 100 * total.ms / instances / whole : 0.0);
    text += line;
  }
  return text + "\n";
}

void run(const Args& args) {
  auto [config, model, blas_threads, parameters] = dapo::bench::random_model(args.shape, args.device, args.threads);
  const bool device = args.device.is_cuda();
  const std::string device_name = dapo::bench::device_name(args.device);
  std::string text = "## Kernel profile: " + args.shape + " on " + device_name + ", autocast " + args.autocast_name +
                     "\n\nThe engine: " + std::to_string(args.batch) + " prompts of " + std::to_string(args.prompt) +
                     " tokens, " + std::to_string(args.new_tokens) +
                     " new tokens each. The update: " + std::to_string(args.groups) + " groups of " +
                     std::to_string(args.rollout_n) + " responses (~98 + ~" + std::to_string(args.response) +
                     " tokens) in one micro-batch, AdamW. LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                     std::to_string(TORCH_VERSION_MINOR) + ", profiled by `benchmarks/profile_bench`.\n\n";
  nlohmann::json parts = nlohmann::json::object();
  const auto add = [&](const std::string& key, const std::string& title, const dapo::bench::ScopeProfile& profile,
                       nlohmann::json extra) {
    text += markdown(title, profile, device);
    nlohmann::json record = profile.to_json();
    if (extra.is_object()) record.update(extra);
    parts[key] = record;
  };
  for (const bool graphs : device ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    qwen::EngineStats stats;
    const auto events = profile_engine(model, args, graphs, stats);
    const std::string mode = graphs ? "CUDA graphs" : "eager steps";
    const nlohmann::json counts{{"decode_calls", stats.decode_calls},
                                {"graph_captures", stats.graph_captures},
                                {"graph_replays", stats.graph_replays}};
    add(graphs ? "decode_graphs" : "decode_eager", "Decode step, " + mode,
        dapo::bench::profile_scope(events, qwen::kDecodeStepScope, static_cast<std::size_t>(args.top)), counts);
    add(graphs ? "admit_graphs" : "admit_eager", "Admission (prefill, fork, first token), " + mode,
        dapo::bench::profile_scope(events, qwen::kAdmitScope, static_cast<std::size_t>(args.top)), counts);
  }
  const auto update_events = profile_update(model, args);
  add("update_micro_batch", "Update micro-batch (forward, loss, backward)",
      dapo::bench::profile_scope(update_events, qwen::kMicroBatchScope, static_cast<std::size_t>(args.top)), {});
  add("optimizer_step", "Optimizer step (clipping, AdamW)",
      dapo::bench::profile_scope(update_events, qwen::kOptimizerStepScope, static_cast<std::size_t>(args.top)), {});

  std::printf("%s", text.c_str());
  if (!args.markdown_path.empty()) {
    std::ofstream out(args.markdown_path);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + args.markdown_path);
  }
  nlohmann::json record{{"benchmark", "kernel profile of the engine's decode steps and the update"},
                        {"machine", dapo::bench::machine()},
                        {"shape", args.shape},
                        {"parameters", parameters},
                        {"device", args.device.str()},
                        {"device_name", device_name},
                        {"autocast", args.autocast_name},
                        {"batch", args.batch},
                        {"prompt", args.prompt},
                        {"new_tokens", args.new_tokens},
                        {"groups", args.groups},
                        {"rollout_n", args.rollout_n},
                        {"response", args.response},
                        {"threads", args.threads},
                        {"blas_threads", blas_threads},
                        {"kernels", device},
                        {"parts", parts}};
  dapo::bench::write_json(record, args.json_path);
  std::printf("wrote %s\n", args.json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  return dapo::bench::run_main<Args>(
      "profile_bench", [&] { return parse_args(argc, argv); }, run);
}
