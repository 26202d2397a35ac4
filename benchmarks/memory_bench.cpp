// The update's activation memory at a model shape, counted exactly by the tracking CPU allocator: the tensor bytes one
// forward of the trainer's log-prob path (qwen::target_logprobs: the decoder, then the chunked lm-head log-probs)
// leaves for its backward, and the peak through forward and backward beyond the weights and their gradients, with and
// without gradient checkpointing, in float32 and under bfloat16 autocast, and the seconds each takes. Two layer counts
// separate the per-layer part (bytes per token per decoder layer) from the rest (embeddings, final norm, lm-head).
// Under autocast each layer's weights' bfloat16 casts stay for the backward, as the trainer's WeightCastScope keeps
// them (a fixed number of bytes per layer, not per token): they are taken out of the per-token figure and shown on
// their own. Then, at the second layer count, the memory plan (train/memory_plan.hpp) against the update's whole
// measured peak: the weights, then two rounds of forward, backward and AdamW step, as the trainer's update runs them.
// A random model of the named shape with fewer layers: the layers are the shape's own.
// Usage: memory_bench [--shape qwen2.5-1.5b|qwen2.5-0.5b|small|demo] [--layers A] [--more-layers B] [--rows R]
//                     [--tokens T] [--response R] [--threads N] [--json PATH]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/device_memory.hpp"
#include "qwen_gsm8k/model/host_door.hpp"
#include "qwen_gsm8k/model/memory_tracker.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/memory_plan.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/shapes.hpp"

namespace {

struct Args {
  std::string shape = "qwen2.5-1.5b", json_path = "memory_bench.json";
  int64_t layers = 1, more_layers = 2, rows = 2, tokens = 256, response = 128;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

struct Measure {
  int64_t held = 0;  // bytes the forward left for the backward (the graph's saved tensors and the log-probs)
  int64_t peak = 0;  // the most bytes at once through forward and backward beyond the weights and the gradients
  double seconds = 0;
};

// One forward and backward of -sum(log-probs of the response tokens), the update's shape of work.
Measure measure(qwen::Qwen2ForCausalLM& model, const Args& args, bool checkpointing,
                std::optional<torch::ScalarType> autocast) {
  model->model->set_gradient_checkpointing(checkpointing);
  qwen::release_gradients(model->parameters());
  torch::manual_seed(1);
  const torch::Tensor ids = torch::randint(0, model->config().vocab_size, {args.rows, args.tokens}, torch::kInt64);
  const torch::Tensor attention = torch::ones({args.rows, args.tokens}, torch::kInt64);
  torch::Tensor loss_mask = torch::zeros({args.rows, args.tokens - 1}, torch::kBool);
  loss_mask.narrow(1, args.tokens - 1 - args.response, args.response).fill_(true);
  const qwen::CpuMemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  const auto started = std::chrono::steady_clock::now();
  std::optional<qwen::WeightCastScope> casts(std::in_place);  // the trainer's: one cast per weight and optimizer step
  const torch::Tensor logp = qwen::target_logprobs(model, ids, attention, loss_mask, {.autocast = autocast}).logp;
  Measure out;
  out.held = tracker.current_bytes() - base;
  (-logp.sum()).backward();
  casts.reset();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::vector<torch::Tensor> gradients;
  for (const auto& parameter : model->parameters()) {
    if (parameter.grad().defined()) gradients.push_back(parameter.grad());
  }
  out.peak = tracker.peak_bytes() - base - qwen::tensor_bytes(gradients);
  qwen::release_gradients(model->parameters());
  return out;
}

// The update's whole peak of tensor bytes: the weights, then two rounds of forward, backward and an AdamW step (the
// second with AdamW's state already there), gradients released after each, as the trainer does.
int64_t measure_update_peak(qwen::Qwen2ForCausalLM& model, const Args& args, bool checkpointing,
                            std::optional<torch::ScalarType> autocast) {
  model->model->set_gradient_checkpointing(checkpointing);
  qwen::release_gradients(model->parameters());
  const int64_t weights = qwen::tensor_bytes(model->parameters());
  torch::manual_seed(1);
  const torch::Tensor ids = torch::randint(0, model->config().vocab_size, {args.rows, args.tokens}, torch::kInt64);
  const torch::Tensor attention = torch::ones({args.rows, args.tokens}, torch::kInt64);
  torch::Tensor loss_mask = torch::zeros({args.rows, args.tokens - 1}, torch::kBool);
  loss_mask.narrow(1, args.tokens - 1 - args.response, args.response).fill_(true);
  const qwen::CpuMemoryTracker tracker;  // counts from here: the weights are added by hand
  {
    qwen::ClippedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-6));
    for (int round = 0; round < 2; ++round) {
      {
        const qwen::WeightCastScope casts;  // the update's, gone before AdamW's step
        const torch::Tensor logp = qwen::target_logprobs(model, ids, attention, loss_mask, {.autocast = autocast}).logp;
        (-logp.sum()).backward();
      }
      optimizer.applied(std::isfinite(qwen::host_door::read(optimizer.clip_and_step(1.0)).item<double>()));
      qwen::release_gradients(model->parameters());
    }
  }
  return weights + tracker.peak_bytes();
}

// The memory plan's update peak (the largest of its update, tied-embedding and optimizer phases) for the same work:
// one micro-batch of `rows` rows of `tokens` tokens, `response` of them the response.
struct PlannedPeak {
  int64_t bytes = 0;
  std::string phase;
};
PlannedPeak planned_update_peak(const qwen::Config& config, const Args& args, bool checkpointing,
                                std::optional<torch::ScalarType> autocast) {
  qwen::MemoryPlanInput input;
  input.config = config;
  input.options.train_batch_size = 1;
  input.options.rollout_n = args.rows;
  input.options.ppo_mini_batch_size = 1;
  input.options.max_new_tokens = args.response;
  input.options.autocast = autocast;
  input.options.gradient_checkpointing = checkpointing;
  input.max_prompt_tokens = args.tokens - args.response;
  input.eager_attention = !qwen::uses_sdpa_on_cpu();
  input.options.free_cache_engine = true;  // no rollout engine here: the update alone
  PlannedPeak peak;
  for (const auto& phase : qwen::plan_memory(input).phases) {
    if (phase.name != "rollout" && phase.name != "log-probs" && phase.bytes() > peak.bytes) {
      peak = {phase.bytes(), phase.name};
    }
  }
  return peak;
}

}  // namespace

int main(int argc, char** argv) try {
  Args args;
  dapo::bench::Flags flags("memory_bench");
  flags.text("--shape", args.shape, "NAME", dapo::bench::kShapeNames)
      .integer("--layers", args.layers, 1, "A", "decoder layers of the first model")
      .integer("--more-layers", args.more_layers, 2, "B", "decoder layers of the second (B > A)")
      .integer("--rows", args.rows, 1, "R", "sequences per forward")
      .integer("--tokens", args.tokens, 2, "T", "tokens per sequence (prompt + response, no padding)")
      .integer("--response", args.response, 1, "N", "response tokens per sequence (the log-prob targets), < T")
      .integer("--threads", args.threads, 1, "N", "CPU threads")
      .text("--json", args.json_path, "PATH", "where the JSON record goes");
  if (!flags.parse(argc, argv)) return 0;
  if (args.more_layers <= args.layers) throw std::invalid_argument("--more-layers must be above --layers");
  if (args.response >= args.tokens) throw std::invalid_argument("--response must be below --tokens");
  at::set_num_threads(args.threads);
  qwen::Config config = dapo::bench::model_shape(args.shape);
  static_cast<void>(qwen::set_blas_threads(qwen::blas_threads_for(config.hidden_size, args.threads)));
  const int64_t tokens = args.rows * args.tokens;
  std::printf("memory_bench: %s shape, %lld x %lld tokens (%lld response tokens each), %d threads, LibTorch %s\n",
              args.shape.c_str(), static_cast<long long>(args.rows), static_cast<long long>(args.tokens),
              static_cast<long long>(args.response), args.threads, TORCH_VERSION);

  struct Case {
    const char* precision;
    std::optional<torch::ScalarType> autocast;
    bool checkpointing;
  };
  const std::vector<Case> cases{{"float32", std::nullopt, false},
                                {"float32", std::nullopt, true},
                                {"bfloat16 autocast", torch::kBFloat16, false},
                                {"bfloat16 autocast", torch::kBFloat16, true}};
  std::vector<std::vector<Measure>> by_layers;  // [layer count][case]
  struct PlanRow {
    const char* precision;
    bool checkpointing;
    PlannedPeak planned;
    int64_t measured;
  };
  std::vector<PlanRow> plan_rows;     // at B layers
  int64_t layer_linear_elements = 0;  // one decoder layer's linear weights and biases
  for (const int64_t layers : {args.layers, args.more_layers}) {
    config.num_hidden_layers = layers;
    torch::manual_seed(0);
    qwen::Qwen2ForCausalLM model(config);
    qwen::initialize_weights(model);
    model->train();
    layer_linear_elements = 0;
    for (const auto& module : model->model->layers[0]->modules()) {
      if (module->as<torch::nn::Linear>() == nullptr) continue;
      for (const auto& parameter : module->parameters(/*recurse=*/false)) layer_linear_elements += parameter.numel();
    }
    {
      // The fused q/k/v and gate/up blocks are laid out at the first forward (FusedLinears): before any measure, so
      // that no case counts the weights' new layout as its own.
      const torch::NoGradGuard no_grad;
      static_cast<void>(model->forward(torch::zeros({1, 2}, torch::kInt64), torch::ones({1, 2}, torch::kInt64),
                                       torch::arange(2, torch::kInt64).unsqueeze(0)));
    }
    std::vector<Measure> row;
    for (const Case& c : cases) row.push_back(measure(model, args, c.checkpointing, c.autocast));
    by_layers.push_back(row);
    if (layers == args.more_layers) {
      for (const Case& c : cases) {
        plan_rows.push_back({c.precision, c.checkpointing,
                             planned_update_peak(config, args, c.checkpointing, c.autocast),
                             measure_update_peak(model, args, c.checkpointing, c.autocast)});
      }
    }
  }

  std::printf("%-18s %-6s %14s %14s %12s %16s %14s %12s %10s\n", "precision", "ckpt", "held, A layers",
              "held, B layers", "casts/layer", "per token-layer", "rest", "peak, B", "seconds, B");
  nlohmann::json results = nlohmann::json::array();
  const auto span = static_cast<double>(args.more_layers - args.layers);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Measure &a = by_layers[0][i], &b = by_layers[1][i];
    // The weights' casts stay for the backward (WeightCastScope), with checkpointing too.
    const int64_t casts =
        cases[i].autocast ? layer_linear_elements * static_cast<int64_t>(c10::elementSize(*cases[i].autocast)) : 0;
    const double per_layer = static_cast<double>(b.held - a.held) / span;
    const double per_layer_token = (per_layer - static_cast<double>(casts)) / static_cast<double>(tokens);
    const double rest = static_cast<double>(a.held) - per_layer * static_cast<double>(args.layers);
    std::printf("%-18s %-6s %14lld %14lld %12lld %16.1f %14.0f %12lld %10.2f\n", cases[i].precision,
                cases[i].checkpointing ? "on" : "off", static_cast<long long>(a.held), static_cast<long long>(b.held),
                static_cast<long long>(casts), per_layer_token, rest, static_cast<long long>(b.peak), b.seconds);
    results.push_back({{"precision", cases[i].precision},
                       {"gradient_checkpointing", cases[i].checkpointing},
                       {"held_bytes", {a.held, b.held}},
                       {"peak_bytes", {a.peak, b.peak}},
                       {"seconds", {a.seconds, b.seconds}},
                       {"weight_cast_bytes_per_layer", casts},
                       {"bytes_per_token_per_layer", per_layer_token},
                       {"rest_bytes", rest}});
  }
  std::printf(
      "\nthe memory plan against the update's measured peak (weights, AdamW state, gradients, activations), "
      "%lld layers:\n%-18s %-6s %16s %16s %8s  %s\n",
      static_cast<long long>(args.more_layers), "precision", "ckpt", "planned bytes", "measured bytes", "ratio",
      "the plan's peak phase");
  nlohmann::json plan_json = nlohmann::json::array();
  for (const PlanRow& row : plan_rows) {
    const double ratio = static_cast<double>(row.planned.bytes) / static_cast<double>(row.measured);
    std::printf("%-18s %-6s %16lld %16lld %8.3f  %s\n", row.precision, row.checkpointing ? "on" : "off",
                static_cast<long long>(row.planned.bytes), static_cast<long long>(row.measured), ratio,
                row.planned.phase.c_str());
    plan_json.push_back({{"precision", row.precision},
                         {"gradient_checkpointing", row.checkpointing},
                         {"planned_peak_bytes", row.planned.bytes},
                         {"planned_peak_phase", row.planned.phase},
                         {"measured_peak_bytes", row.measured},
                         {"ratio", ratio}});
  }
  dapo::bench::write_json({{"benchmark", "update activation memory (tracking CPU allocator)"},
                           {"plan", plan_json},
                           {"machine", dapo::bench::machine()},
                           {"shape", args.shape},
                           {"layers", {args.layers, args.more_layers}},
                           {"rows", args.rows},
                           {"tokens", args.tokens},
                           {"response", args.response},
                           {"results", results}},
                          args.json_path);
  std::printf("wrote %s\n", args.json_path.c_str());
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "memory_bench: %s\n", error.what());
  return 1;
}
