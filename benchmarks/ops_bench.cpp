// ATen operators per decode step and per training forward, counted with a RecordFunction callback: what a GPU pays
// per operator (a kernel launch, or a host-side view or dispatch) counted on a CPU, at a model's layer graph. The
// model has the named shape's layers and heads (--shape, default Qwen2.5-1.5B's: 28 layers, 12 query heads, 2 key /
// value heads) with a tiny head dimension, width and vocabulary (--head-dim, --intermediate, --vocab), so that the
// run is quick and its host time per step is the launch-bound floor. The counts do not depend on those sizes.
//
// Decode step: the generation engine (the trainer's rollout path) with --rows sequences, sampling with log-probs as
// the trainer asks, every row running to max_new_tokens; the ops of a run of 2m tokens minus those of a run of m
// tokens, over m: exactly the ops of one decode step (the prefill and the final check cancel). Training forward: the
// trainer's target_logprobs (the model's forward and the chunked lm-head log-probs) on --rows right-padded rows of
// --length tokens, with gradients; then its backward; counted on a micro-batch after an optimizer step's first, whose
// weight casts it reads (--weight-casts step, the trainer's WeightCastScope; autocast: each forward casts its own) and
// whose gradients it adds to, through the training forward's fused operators (model/fused_training.hpp;
// --fused-training off: the unfused calls).
// Counted: every operator call (nested ones too: what one op dispatches to), the top-level ones, and those a CUDA run
// calls (all, less the calls inside a fused operator: on CUDA it is one kernel, on the CPU a composite). Which
// attention runs depends on LibTorch (model.hpp): before 2.14 the CPU has the eager products, from 2.14
// scaled_dot_product_attention as on CUDA.
// Usage: ops_bench [--shape NAME] [--autocast none|bfloat16] [--weight-casts step|autocast] [--fused-training on|off]
//                  [--rows N] [--tokens M] [--length L] [--threads N] [--json PATH]
#include <ATen/record_function.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/fused_training.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/shapes.hpp"

namespace {

// Counts operator calls on every thread while an instance lives: all of them and those at depth 0 (not called from
// inside another counted op on the same thread), with each operator's count by name; and the casts a CUDA run
// launches: aten::_to_copy calls outside aten::_fused_rms_norm and the driver's fused operators (qwen::*, one kernel
// each on CUDA where the build has their kernels, computing in float32 in registers; composites that cast on the CPU).
class OpCounter {
 public:
  struct Counts {
    int64_t all = 0, top_level = 0, casts = 0;
    int64_t on_cuda = 0;  // all, less the calls inside a fused operator (one kernel on CUDA; a composite on the CPU)
    std::map<std::string, int64_t> by_name, top_level_by_name;  // all calls and the top-level ones, by name
    Counts operator-(const Counts& other) const {
      Counts out{all - other.all,  top_level - other.top_level, casts - other.casts, on_cuda - other.on_cuda, by_name,
                 top_level_by_name};
      for (const auto& [name, count] : other.by_name) out.by_name[name] -= count;
      for (const auto& [name, count] : other.top_level_by_name) out.top_level_by_name[name] -= count;
      return out;
    }
  };

  OpCounter() {
    at::enableRecordFunction(true);
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&OpCounter::start, &OpCounter::end)
                                        .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE})
                                        .needsInputs(false));
  }
  ~OpCounter() { at::removeCallback(handle_); }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  // The calls in order, as "depth name", while tracing.
  static void trace(bool on) {
    const std::lock_guard<std::mutex> lock(mutex());
    tracing() = on;
    if (on) calls().clear();
  }
  static std::vector<std::string> traced() {
    const std::lock_guard<std::mutex> lock(mutex());
    return calls();
  }

  static Counts snapshot() {
    const std::lock_guard<std::mutex> lock(mutex());
    return counts();
  }

 private:
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& call) {
    if (call.scope() == at::RecordScope::USER_SCOPE) {  // the engine's scopes: marks in the trace, not operators
      const std::lock_guard<std::mutex> lock(mutex());
      if (tracing()) calls().push_back(std::string("scope ") + call.name());
      return nullptr;
    }
    const bool top = depth()++ == 0;
    const std::string_view name = call.name();
    const bool inside_fused = fused_depth() > 0;
    if (one_kernel_on_cuda(name)) ++fused_depth();
    const std::lock_guard<std::mutex> lock(mutex());
    ++counts().all;
    if (!inside_fused) ++counts().on_cuda;
    if (top) {
      ++counts().top_level;
      ++counts().top_level_by_name[call.name()];
    }
    if (name == "aten::_to_copy" && fused_depth() == 0) ++counts().casts;
    ++counts().by_name[call.name()];
    if (tracing()) calls().push_back(std::string(static_cast<std::size_t>(2 * (depth() - 1)), ' ') + call.name());
    return nullptr;
  }
  static void end(const at::RecordFunction& call, at::ObserverContext* /*context*/) {
    if (call.scope() == at::RecordScope::USER_SCOPE) return;
    --depth();
    if (one_kernel_on_cuda(call.name())) --fused_depth();
  }
  static bool one_kernel_on_cuda(std::string_view name) {
    return name == "aten::_fused_rms_norm" || name.substr(0, 6) == "qwen::";
  }
  static int& depth() {
    thread_local int value = 0;
    return value;
  }
  static int& fused_depth() {
    thread_local int value = 0;
    return value;
  }
  static std::mutex& mutex() {
    static std::mutex value;
    return value;
  }
  static bool& tracing() {
    static bool value = false;
    return value;
  }
  static std::vector<std::string>& calls() {
    static std::vector<std::string> value;
    return value;
  }
  static Counts& counts() {
    static Counts value;
    return value;
  }
  at::CallbackHandle handle_;
};

struct Args {
  std::string shape = "qwen2.5-1.5b", autocast = "bfloat16", weight_casts = "step", fused_training = "on", json;
  bool trace = false;
  int64_t head_dim = 16, intermediate = 256, vocab = 2048, rows = 8, tokens = 16, length = 96, threads = 2;
};

std::optional<torch::ScalarType> autocast_dtype(const std::string& name) {
  if (name == "none") return std::nullopt;
  if (name == "bfloat16") return torch::kBFloat16;
  throw std::invalid_argument("--autocast is '" + name + "', expected none or bfloat16");
}

// The shape's layer graph with the given head dimension, width and vocabulary.
qwen::Config graph_config(const Args& args) {
  const qwen::Config full = dapo::bench::model_shape(args.shape);
  return qwen::Config::from_json({{"model_type", "qwen2"},
                                  {"vocab_size", args.vocab},
                                  {"hidden_size", full.num_attention_heads * args.head_dim},
                                  {"intermediate_size", args.intermediate},
                                  {"num_hidden_layers", full.num_hidden_layers},
                                  {"num_attention_heads", full.num_attention_heads},
                                  {"num_key_value_heads", full.num_key_value_heads},
                                  {"max_position_embeddings", 4096},
                                  {"tie_word_embeddings", full.tie_word_embeddings}},
                                 args.shape + " layer graph");
}

struct Run {
  OpCounter::Counts counts;
  double seconds = 0;
  int64_t decode_calls = 0;
};

// One engine run: every row decodes `tokens` tokens (no stop ids; checks only at max_new_tokens).
Run engine_run(qwen::Qwen2ForCausalLM& model, const Args& args, int64_t tokens) {
  qwen::EngineOptions options;
  options.max_num_seqs = args.rows;
  options.max_new_tokens = tokens;
  options.check_every = tokens;
  options.return_logprobs = true;
  options.sampling.temperature = 1.0;
  std::vector<qwen::EngineRequest> requests(1);
  requests[0].prompt.resize(24);
  for (std::size_t i = 0; i < requests[0].prompt.size(); ++i) requests[0].prompt[i] = static_cast<int64_t>(3 + i);
  requests[0].n = args.rows;
  requests[0].seed = 7;
  const qwen::AutocastGuard guard(torch::kCPU, autocast_dtype(args.autocast));
  qwen::EngineStats stats;
  const OpCounter::Counts before = OpCounter::snapshot();
  const auto start = std::chrono::steady_clock::now();
  qwen::generate_requests(model, requests, options, &stats);
  Run run;
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.counts = OpCounter::snapshot() - before;
  run.decode_calls = stats.decode_calls;
  return run;
}

nlohmann::json top_ops(const std::map<std::string, int64_t>& by_name, double per, int limit) {
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (const auto& [name, count] : by_name) {
    if (count != 0) sorted.emplace_back(count, name);
  }
  std::sort(sorted.rbegin(), sorted.rend());
  nlohmann::json out = nlohmann::json::object();
  for (int i = 0; i < limit && i < static_cast<int>(sorted.size()); ++i) {
    out[sorted[static_cast<std::size_t>(i)].second] =
        static_cast<double>(sorted[static_cast<std::size_t>(i)].first) / per;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args;
    int64_t trace_steps = 0;
    dapo::bench::Flags flags("ops_bench");
    flags.text("--shape", args.shape, "NAME", std::string("whose layers and heads: ") + dapo::bench::kShapeNames)
        .text("--autocast", args.autocast, "DTYPE", "none or bfloat16 (as on CUDA)")
        .text("--weight-casts", args.weight_casts, "WHERE",
              "step (the trainer's: one cast per weight and optimizer step) or autocast (each forward's own)")
        .text("--fused-training", args.fused_training, "ON",
              "on: the training forward's fused operators (the trainer's); off: the unfused calls")
        .integer("--head-dim", args.head_dim, 2, "D", "head dimension (hidden = heads x D)")
        .integer("--intermediate", args.intermediate, 1, "N", "MLP width")
        .integer("--vocab", args.vocab, 64, "V", "vocabulary")
        .integer("--rows", args.rows, 1, "R", "decode rows; training rows")
        .integer("--tokens", args.tokens, 1, "M", "decode steps of the shorter run (the longer has 2M)")
        .integer("--length", args.length, 2, "L", "training row length")
        .integer("--threads", args.threads, 1, "N", "LibTorch threads")
        .text("--json", args.json, "PATH", "where the JSON record goes")
        .integer("--trace", trace_steps, 0, "K", "print the calls of one decode step (K > 0) instead of counting");
    if (!flags.parse(argc, argv)) return 0;
    args.trace = trace_steps > 0;
    at::set_num_threads(static_cast<int>(args.threads));
    torch::manual_seed(0);
    const qwen::Config config = graph_config(args);
    qwen::Qwen2ForCausalLM model(config);
    qwen::initialize_weights(model);
    const OpCounter counter;

    // Decode: warm up, then m and 2m tokens.
    engine_run(model, args, 2);
    if (args.trace) {  // the calls of the last decode step (the engine's decode-step scope) but one
      OpCounter::trace(true);
      engine_run(model, args, 4);  // a prefill's first token, then 3 decode steps
      OpCounter::trace(false);
      const std::vector<std::string> calls = OpCounter::traced();
      std::vector<std::size_t> steps;
      for (std::size_t i = 0; i < calls.size(); ++i) {
        if (calls[i] == std::string("scope ") + qwen::kDecodeStepScope) steps.push_back(i);
      }
      if (steps.size() < 3) throw std::runtime_error("--trace: fewer than 3 decode steps seen");
      for (std::size_t i = steps[steps.size() - 2] + 1; i < steps.back(); ++i) {
        if (calls[i].rfind("scope ", 0) != 0) std::printf("%s\n", calls[i].c_str());
      }
      return 0;
    }
    const Run short_run = engine_run(model, args, args.tokens), long_run = engine_run(model, args, 2 * args.tokens);
    const int64_t steps = long_run.decode_calls - short_run.decode_calls;
    const OpCounter::Counts decode = long_run.counts - short_run.counts;
    const double per_step = static_cast<double>(steps);
    const double step_ms = 1e3 * (long_run.seconds - short_run.seconds) / per_step;

    // Training: right-padded rows, a quarter of each row padding at most.
    torch::Tensor ids = torch::randint(3, config.vocab_size, {args.rows, args.length}, torch::kInt64);
    torch::Tensor mask = torch::ones({args.rows, args.length}, torch::kInt64);
    for (int64_t r = 0; r < args.rows; ++r) {
      const int64_t padding = (r * args.length) / (4 * args.rows);
      if (padding > 0) mask[r].narrow(0, args.length - padding, padding).zero_();
    }
    const torch::Tensor loss_mask = mask.narrow(1, 1, args.length - 1).to(torch::kBool);
    qwen::LogprobOptions logprob_options;
    logprob_options.autocast = autocast_dtype(args.autocast);
    if (args.weight_casts != "step" && args.weight_casts != "autocast") {
      throw std::invalid_argument("--weight-casts is '" + args.weight_casts + "', expected step or autocast");
    }
    // The trainer casts each weight once per optimizer step (WeightCastScope): the counted micro-batch is one after
    // the step's first (the warm-up), which made the casts.
    std::optional<qwen::WeightCastScope> step_casts;
    if (args.weight_casts == "step") step_casts.emplace();
    if (args.fused_training != "on" && args.fused_training != "off") {
      throw std::invalid_argument("--fused-training is '" + args.fused_training + "', expected on or off");
    }
    std::optional<qwen::fused::UnfusedTraining> unfused;
    if (args.fused_training == "off") unfused.emplace();
    const OpCounter::Counts before_warm_up = OpCounter::snapshot();
    qwen::target_logprobs(model, ids, mask, loss_mask, logprob_options).logp.sum().backward();  // warm-up
    const OpCounter::Counts warm_up = OpCounter::snapshot() - before_warm_up;
    // The gradients stay: the counted backward adds to them, as a step's later micro-batches do.
    const OpCounter::Counts before_forward = OpCounter::snapshot();
    const torch::Tensor logp = qwen::target_logprobs(model, ids, mask, loss_mask, logprob_options).logp;
    const OpCounter::Counts forward = OpCounter::snapshot() - before_forward;
    logp.sum().backward();
    const OpCounter::Counts backward = OpCounter::snapshot() - before_forward - forward;

    std::printf("ops_bench: %s layer graph (%lld layers, %lld / %lld heads, head dim %lld), LibTorch %s, autocast %s\n",
                args.shape.c_str(), static_cast<long long>(config.num_hidden_layers),
                static_cast<long long>(config.num_attention_heads), static_cast<long long>(config.num_key_value_heads),
                static_cast<long long>(args.head_dim), TORCH_VERSION, args.autocast.c_str());
    std::printf(
        "  decode step (%lld rows): %.1f ops (%.1f top-level), %.1f casts a CUDA run launches, %.3f ms host time\n",
        static_cast<long long>(args.rows), static_cast<double>(decode.all) / per_step,
        static_cast<double>(decode.top_level) / per_step, static_cast<double>(decode.casts) / per_step, step_ms);
    std::printf(
        "  training forward (%lld x %lld, weight casts: %s, fused training operators: %s): %lld ops (%lld top-level, "
        "%lld a CUDA run calls), %lld casts a CUDA run launches; its backward %lld ops (%lld a CUDA run calls), %lld "
        "casts; the step's first micro-batch %lld ops, %lld casts\n",
        static_cast<long long>(args.rows), static_cast<long long>(args.length), args.weight_casts.c_str(),
        args.fused_training.c_str(), static_cast<long long>(forward.all), static_cast<long long>(forward.top_level),
        static_cast<long long>(forward.on_cuda), static_cast<long long>(forward.casts),
        static_cast<long long>(backward.all), static_cast<long long>(backward.on_cuda),
        static_cast<long long>(backward.casts), static_cast<long long>(warm_up.all),
        static_cast<long long>(warm_up.casts));
    const nlohmann::json decode_top = top_ops(decode.by_name, per_step, 40);
    std::printf("  decode step's ops by name:");
    for (const auto& [name, count] : decode_top.items()) std::printf(" %s %.0f,", name.c_str(), count.get<double>());
    std::printf("\n");
    if (!args.json.empty()) {
      nlohmann::json record = {{"benchmark", "ops_bench"},
                               {"machine", dapo::bench::machine()},
                               {"libtorch", TORCH_VERSION},
                               {"shape", args.shape},
                               {"layers", config.num_hidden_layers},
                               {"heads", config.num_attention_heads},
                               {"kv_heads", config.num_key_value_heads},
                               {"head_dim", args.head_dim},
                               {"autocast", args.autocast},
                               {"decode",
                                {{"rows", args.rows},
                                 {"steps", steps},
                                 {"ops_per_step", static_cast<double>(decode.all) / per_step},
                                 {"top_level_ops_per_step", static_cast<double>(decode.top_level) / per_step},
                                 {"casts_per_step", static_cast<double>(decode.casts) / per_step},
                                 {"host_ms_per_step", step_ms},
                                 {"ops_by_name", decode_top}}},
                               {"training",
                                {{"rows", args.rows},
                                 {"length", args.length},
                                 {"forward_ops", forward.all},
                                 {"forward_top_level_ops", forward.top_level},
                                 {"forward_ops_on_cuda", forward.on_cuda},
                                 {"weight_casts", args.weight_casts},
                                 {"fused_training", args.fused_training},
                                 {"forward_casts", forward.casts},
                                 {"backward_ops", backward.all},
                                 {"backward_ops_on_cuda", backward.on_cuda},
                                 {"backward_casts", backward.casts},
                                 {"first_micro_batch_ops", warm_up.all},
                                 {"first_micro_batch_casts", warm_up.casts},
                                 {"forward_ops_by_name", top_ops(forward.by_name, 1.0, 400)},
                                 {"forward_top_level_ops_by_name", top_ops(forward.top_level_by_name, 1.0, 400)},
                                 {"backward_ops_by_name", top_ops(backward.by_name, 1.0, 400)}}}};
      dapo::bench::write_json(record, args.json);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ops_bench: %s\n", e.what());
    return 1;
  }
}
