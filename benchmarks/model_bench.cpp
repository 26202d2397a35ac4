// The Qwen2 model on this machine, at the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 / 2 heads, intermediate 4864,
// vocab 151936) with random weights: load time and peak resident memory when loading from safetensors (in a fresh
// process, so nothing else is resident), and decode speed of the engine (generate()) vs the reference decoder, which
// recomputes the prefix (batch 8, 32-token prompts, 64 new tokens, greedy). Both must produce (nearly) the same tokens.
// Then generate's peak tensor memory (a tracking CPU allocator) and speed on long prompts (batch 8, 128-token prompts,
// 16 new tokens), against the decode loop as it was before issues 14 and 15 (the prefill's logits at every prompt
// position, a log-softmax over the vocabulary per step, the sequence and mask grown by concatenation), same run, same
// tokens.
// Usage: model_bench [--dir DIR] [--threads N] [--json PATH] [--new-tokens N]
//        (internal: model_bench --create DIR, model_bench --load DIR)
#include <sys/resource.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/memory_tracker.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/shapes.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // kilobytes on Linux
}

double current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Runs `command`, returns its standard output.
std::string run(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  std::string output;
  char buffer[4096];
  while (const size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  if (pclose(pipe) != 0) throw std::runtime_error(command + " failed:\n" + output);
  return output;
}

// The child processes: --create writes the model; --load loads it and prints its load time and peak memory as JSON
// (in a fresh process, so that the peak is the load's alone).
int run_child(const std::string& mode, const std::string& dir) {
  if (mode == "--create") {
    torch::manual_seed(0);
    qwen::Qwen2ForCausalLM model(dapo::bench::model_shape("qwen2.5-0.5b"));
    qwen::initialize_weights(model);
    qwen::save_model(model, dir);
    return 0;
  }
  at::set_num_threads(2);
  const double before = current_rss_bytes();
  const auto start = std::chrono::steady_clock::now();
  auto model = qwen::load_model(dir);
  const double seconds = seconds_since(start);
  int64_t bytes = 0;
  for (const auto& item : model->named_parameters()) bytes += item.value().numel() * item.value().element_size();
  std::printf(
      "{\"load_seconds\": %.3f, \"peak_rss_bytes\": %.0f, \"rss_before_bytes\": %.0f, \"weight_bytes\": %lld}\n",
      seconds, peak_rss_bytes(), before, static_cast<long long>(bytes));
  return 0;
}

struct DecodeTimes {
  double cache_seconds = 0, recompute_seconds = 0, agreement = 0, generated = 0;
  dapo::bench::Usage cache_usage, recompute_usage;  // getrusage over each timed decode
};

// Greedy decoding of 8 random prompts with and without the KV cache; the two must agree on (nearly) every token.
DecodeTimes time_decode(qwen::Qwen2ForCausalLM& model, int64_t new_tokens) {
  torch::manual_seed(1);
  std::vector<std::vector<int64_t>> prompts(8);
  for (auto& prompt : prompts) {
    const auto ids = torch::randint(151643, {32}, torch::kInt64);
    prompt.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 32);
  }
  qwen::GenerationOptions options;
  options.max_new_tokens = new_tokens;
  options.sampling.temperature = 0.0;
  // The engine (generate()), or the reference decoder (the prefix recomputed every step, no cache).
  auto timed = [&](bool use_cache, qwen::GenerationOutput& out, dapo::bench::Usage& usage) {
    const auto before = dapo::bench::Usage::now();
    const auto start = std::chrono::steady_clock::now();
    out = use_cache ? qwen::generate(model, prompts, options) : qwen::reference_generate(model, prompts, options);
    const double seconds = seconds_since(start);
    usage = dapo::bench::Usage::now() - before;
    return seconds;
  };
  qwen::GenerationOutput cached, recomputed;
  DecodeTimes times;
  timed(true, cached, times.cache_usage);  // warm-up
  times.cache_seconds = timed(true, cached, times.cache_usage);
  times.recompute_seconds = timed(false, recomputed, times.recompute_usage);
  times.agreement = cached.tokens.eq(recomputed.tokens).to(torch::kFloat64).mean().item<double>();
  if (times.agreement < 0.95) {
    throw std::runtime_error("cached and recomputed decoding disagree on " +
                             std::to_string(100 * (1 - times.agreement)) + "% of tokens");
  }
  times.generated = static_cast<double>(prompts.size() * new_tokens);
  return times;
}

// The decode loop before issues 14 and 15, greedy, with the same model calls: the prefill computes the lm-head over
// every prompt position ([B, P, V] logits) and takes the last; each step computes log-probs over the vocabulary and
// grows the sequence and mask with torch::cat.
torch::Tensor legacy_generate(qwen::Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                              int64_t new_tokens) {
  torch::NoGradGuard no_grad;
  const auto [ids, mask] = qwen::left_pad(prompts, 0, torch::kCPU);
  const int64_t batch = ids.size(0), width = ids.size(1);
  qwen::KVCache cache(model->config(), batch, width + new_tokens, model->lm_head_weight().options());
  torch::Tensor logits = model->forward(ids, mask, qwen::position_ids_from_mask(mask), &cache).select(1, -1);
  torch::Tensor sequence = ids, attention = mask, tokens = torch::empty({batch, 0}, torch::kInt64);
  torch::Tensor logprobs = torch::empty({batch, 0});
  for (int64_t step = 0; step < new_tokens; ++step) {
    const torch::Tensor next = logits.argmax(-1);
    logprobs = torch::cat({logprobs, logits.log_softmax(-1).gather(1, next.unsqueeze(1))}, 1);
    tokens = torch::cat({tokens, next.unsqueeze(1)}, 1);
    if (step + 1 == new_tokens) break;
    sequence = torch::cat({sequence, next.unsqueeze(1)}, 1);
    attention = torch::cat({attention, torch::ones({batch, 1}, attention.options())}, 1);
    const torch::Tensor positions = qwen::position_ids_from_mask(attention).narrow(1, width + step, 1);
    logits = model->forward(next.unsqueeze(1), attention, positions, &cache).select(1, -1);
  }
  return tokens;
}

struct PeakMemory {
  double before_bytes = 0, after_bytes = 0, before_seconds = 0, after_seconds = 0, generated = 0;
};

// Peak tensor memory allocated during generate (above what was held before it), old loop against today's.
PeakMemory measure_peak_memory(qwen::Qwen2ForCausalLM& model) {
  constexpr int64_t kBatch = 8, kPrompt = 128, kNew = 16;
  torch::manual_seed(2);
  std::vector<std::vector<int64_t>> prompts(kBatch);
  for (auto& prompt : prompts) {
    const auto ids = torch::randint(151643, {kPrompt}, torch::kInt64);
    prompt.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + kPrompt);
  }
  qwen::GenerationOptions options;
  options.max_new_tokens = kNew;
  options.sampling.temperature = 0.0;
  PeakMemory peak;
  peak.generated = static_cast<double>(kBatch * kNew);
  qwen::CpuMemoryTracker tracker;
  auto start = std::chrono::steady_clock::now();
  const torch::Tensor before = legacy_generate(model, prompts, kNew);
  peak.before_seconds = seconds_since(start);
  peak.before_bytes = static_cast<double>(tracker.peak_bytes());
  tracker.reset_peak();
  const double held = static_cast<double>(tracker.current_bytes());
  start = std::chrono::steady_clock::now();
  const qwen::GenerationOutput after = qwen::generate(model, prompts, options);
  peak.after_seconds = seconds_since(start);
  peak.after_bytes = static_cast<double>(tracker.peak_bytes()) - held;
  // The engine's products have other shapes than the old loop's (a slot pool, a window), which BLAS may round
  // otherwise: random weights' near-ties may then go either way.
  const double agreement = before.eq(after.tokens).to(torch::kFloat64).mean().item<double>();
  if (agreement < 0.95) {
    throw std::runtime_error("the old decode loop and the engine disagree on " + std::to_string(100 * (1 - agreement)) +
                             "% of tokens");
  }
  return peak;
}

}  // namespace

int main(int argc, char** argv) try {
  qwen::use_passive_thread_pools(argv);
  const std::string self = argv[0];
  if (argc == 3 && (std::string(argv[1]) == "--create" || std::string(argv[1]) == "--load")) {
    return run_child(argv[1], argv[2]);
  }
  std::string dir = "/tmp/dapo-model-bench-qwen2.5-0.5b", json_path = "model_bench.json";
  int threads = 2;
  int64_t new_tokens = 64;
  dapo::bench::Flags flags("model_bench");
  flags.text("--dir", dir, "DIR", "where the random model is written once and loaded from")
      .integer("--threads", threads, 1, "N", "CPU threads")
      .text("--json", json_path, "PATH", "where the JSON record goes")
      .integer("--new-tokens", new_tokens, 1, "N", "tokens decoded per prompt");
  if (!flags.parse(argc, argv)) return 0;
  at::set_num_threads(threads);
  if (!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors")) {
    std::printf("writing a random Qwen2.5-0.5B-shaped model to %s ...\n", dir.c_str());
    run("'" + self + "' --create '" + dir + "'");
  }
  const auto load = nlohmann::json::parse(run("'" + self + "' --load '" + dir + "'"));
  const double weight_bytes = load.at("weight_bytes"), peak = load.at("peak_rss_bytes");
  const double before = load.at("rss_before_bytes");
  std::printf("Qwen2.5-0.5B shape, random weights, float32; %s, %d threads, %s allocator\n",
              dapo::bench::cpu_model().c_str(), threads, dapo::bench::allocator().c_str());
  std::printf("load: %.2f s, weights %.2f GiB, peak RSS %.2f GiB = %.2fx the weights (%.2f GiB resident before)\n",
              load.at("load_seconds").get<double>(), weight_bytes / (1 << 30), peak / (1 << 30), peak / weight_bytes,
              before / (1 << 30));
  auto model = qwen::load_model(dir);
  const DecodeTimes t = time_decode(model, new_tokens);
  std::printf(
      "decode, batch 8, prompt 32, %lld new tokens: KV cache %.1f tokens/s, recompute %.1f tokens/s, "
      "%.1fx (tokens identical: %.1f%%)\n",
      static_cast<long long>(new_tokens), t.generated / t.cache_seconds, t.generated / t.recompute_seconds,
      t.recompute_seconds / t.cache_seconds, 100 * t.agreement);
  for (const auto& [name, usage] : {std::pair{"KV cache", t.cache_usage}, std::pair{"recompute", t.recompute_usage}}) {
    std::printf("  %-9s decode: %.0f page faults, %.2f s user CPU, %.2f s system CPU\n", name,
                usage.minor_faults + usage.major_faults, usage.user_seconds, usage.system_seconds);
  }
  const PeakMemory memory = measure_peak_memory(model);
  std::printf(
      "generate, batch 8, prompt 128, 16 new tokens (same tokens): peak tensor memory %.0f MiB before issues 14/15 "
      "-> %.0f MiB now (%.1fx less); %.1f -> %.1f tokens/s\n",
      memory.before_bytes / (1 << 20), memory.after_bytes / (1 << 20), memory.before_bytes / memory.after_bytes,
      memory.generated / memory.before_seconds, memory.generated / memory.after_seconds);
  nlohmann::json record{{"benchmark", "Qwen2.5-0.5B-shaped model: load and decode"},
                        {"machine", dapo::bench::machine()},
                        {"load_seconds", load.at("load_seconds")},
                        {"weight_bytes", weight_bytes},
                        {"peak_rss_bytes", peak},
                        {"peak_rss_over_weights", peak / weight_bytes},
                        {"decode_tokens_per_second_cache", t.generated / t.cache_seconds},
                        {"decode_tokens_per_second_recompute", t.generated / t.recompute_seconds},
                        {"cache_speedup", t.recompute_seconds / t.cache_seconds},
                        {"token_agreement", t.agreement},
                        {"decode_usage_cache", t.cache_usage.to_json()},
                        {"decode_usage_recompute", t.recompute_usage.to_json()},
                        {"generate_peak_bytes_before", memory.before_bytes},
                        {"generate_peak_bytes_after", memory.after_bytes},
                        {"generate_tokens_per_second_before", memory.generated / memory.before_seconds},
                        {"generate_tokens_per_second_after", memory.generated / memory.after_seconds}};
  dapo::bench::write_json(record, json_path);
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "model_bench: %s\n", error.what());
  return 1;
}
