// Decoding speed of the generation engine (the trainer's rollouts) on a random model of a named shape, against the
// memory-bandwidth bound of a decode step: every step reads all weights and the KV cache once, so at batch B a step
// cannot take less than (weight bytes + KV bytes) / bandwidth, the bandwidth measured on this device by a streaming
// copy unless --bandwidth-gbs gives it. EOS is ignored (no stop ids): every row decodes --new-tokens tokens. Not a
// serving benchmark: one batch of prompts, all in slots at once. --decoding sample draws at temperature 1 (seed 0).
// The engine runs with eager decode steps and, on CUDA, with each step a CUDA-graph replay (captures included: graphs
// live for one engine run, as in a rollout round), and the graphs' tokens are compared with the eager ones. Beside it,
// qwen::generate (the engine in one call: the engine made, its graphs captured, its run), timed the same way.
// --model DIR loads a Hugging Face model directory instead of a shape's random weights, and --prompts FILE takes the
// prompts from {"prompts": [[ids]]}: benchmarks/anchors_generate.py runs it so beside transformers' generate() on the
// same weights and prompts, and compares the tokens (the JSON record holds them).
//
// Before timing it checks that, with the same weights in float32 on the same device, the engine yields the tokens that
// the reference decoder (the prefix recomputed every step) yields (2 prompts x 16 tokens, 8 new tokens).
//
// Usage: generate_bench [--shape qwen2.5-1.5b|qwen2.5-0.5b|small|demo] [--device cpu|cuda[:N]]
//                       [--dtype float32|bfloat16] [--batch B] [--prompt P] [--new-tokens N] [--repeats R]
//                       [--bandwidth-gbs GB/s] [--json PATH] [--threads T] [--model DIR] [--prompts FILE]
//                       [--decoding greedy|sample]
//   defaults: qwen2.5-1.5b on cuda, bfloat16 on cuda / float32 on cpu, batch 64, prompt 256, 128 new tokens, 3 repeats,
//   the bandwidth of a device-to-device copy measured here (support/device.hpp: copy_bandwidth_gbs).
//
// Shapes: B = batch, P = prompt tokens, N = new tokens.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/device.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/shapes.hpp"

namespace {

constexpr int64_t kFirstSpecialId = 151643;  // Qwen2.5's <|endoftext|>: prompts stay below it (and the vocabulary)
constexpr uint64_t kWeightSeed = 0, kCheckSeed = 1, kPromptSeed = 2;

struct Args {
  std::string shape = "qwen2.5-1.5b", json_path = "generate_bench.json", dtype_name, model_dir, prompts_path;
  std::string decoding = "greedy";
  std::vector<std::vector<int64_t>> prompts;  // from --prompts; else random ones of --batch x --prompt
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
  int64_t batch = 64, prompt = 256, new_tokens = 128, repeats = 3;
  std::optional<double> bandwidth_gbs;  // --bandwidth-gbs; else measured
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

// Throws std::invalid_argument naming the bad flag, before any work (the device's availability included); nullopt
// when --help printed the flags.
std::optional<Args> parse_args(int argc, char** argv) {
  Args args;
  std::string device = "cuda", bandwidth;
  dapo::bench::Flags flags("generate_bench");
  flags.text("--shape", args.shape, "NAME", "qwen2.5-1.5b, qwen2.5-0.5b, small or demo")
      .text("--device", device, "DEVICE", "cpu, cuda or cuda:N")
      .text("--dtype", args.dtype_name, "TYPE", "float32 or bfloat16 (default bfloat16 on cuda, float32 on cpu)")
      .integer("--batch", args.batch, 1, "B", "prompts decoded together")
      .integer("--prompt", args.prompt, 1, "P", "tokens per prompt")
      // At least 2: decode time per step = (t_N - t_1) / (N - 1).
      .integer("--new-tokens", args.new_tokens, 2, "N", "tokens generated per prompt")
      .integer("--repeats", args.repeats, 1, "R", "timed runs, of which the median counts")
      .text("--bandwidth-gbs", bandwidth, "GB/s", "memory bandwidth of the bound (default: a copy's, measured here)")
      .text("--json", args.json_path, "PATH", "where the JSON record goes")
      .integer("--threads", args.threads, 1, "T", "CPU threads")
      .text("--model", args.model_dir, "DIR", "a Hugging Face model directory instead of --shape's random weights")
      .text("--prompts", args.prompts_path, "FILE", "JSON {\"prompts\": [[ids]]}: replaces --batch and --prompt")
      .text("--decoding", args.decoding, "MODE", "greedy, or sample (temperature 1, seed 0)");
  if (!flags.parse(argc, argv)) return std::nullopt;
  if (!bandwidth.empty()) args.bandwidth_gbs = dapo::bench::parse_positive("--bandwidth-gbs", bandwidth);
  if (args.decoding != "greedy" && args.decoding != "sample") {
    throw std::invalid_argument("--decoding is '" + args.decoding + "', expected greedy or sample");
  }
  if (!args.prompts_path.empty()) {
    std::ifstream in(args.prompts_path);
    if (!in) throw std::invalid_argument("--prompts: cannot open " + args.prompts_path);
    nlohmann::json file;
    try {
      file = nlohmann::json::parse(in);
      args.prompts = file.at("prompts").get<std::vector<std::vector<int64_t>>>();
    } catch (const nlohmann::json::exception& error) {
      throw std::invalid_argument("--prompts " + args.prompts_path + ": expected {\"prompts\": [[ids]]} (" +
                                  error.what() + ")");
    }
    if (args.prompts.empty()) throw std::invalid_argument("--prompts " + args.prompts_path + " holds no prompt");
    args.batch = static_cast<int64_t>(args.prompts.size());
    args.prompt = 0;
    for (std::size_t i = 0; i < args.prompts.size(); ++i) {
      if (args.prompts[i].empty()) {
        throw std::invalid_argument("--prompts " + args.prompts_path + ": prompt " + std::to_string(i) + " is empty");
      }
      args.prompt = std::max<int64_t>(args.prompt, static_cast<int64_t>(args.prompts[i].size()));
    }
  }
  const qwen::Config config = args.model_dir.empty()
                                  ? dapo::bench::model_shape(args.shape)  // throws for an unknown
                                  : qwen::Config::from_file(std::filesystem::path(args.model_dir) / "config.json");
  if (!args.model_dir.empty()) args.shape = args.model_dir;
  for (std::size_t i = 0; i < args.prompts.size(); ++i) {
    for (const int64_t id : args.prompts[i]) {
      if (id < 0 || id >= config.vocab_size) {
        throw std::invalid_argument("--prompts " + args.prompts_path + ": prompt " + std::to_string(i) + " holds id " +
                                    std::to_string(id) + ", outside the vocabulary of " +
                                    std::to_string(config.vocab_size));
      }
    }
  }
  if (args.prompt + args.new_tokens > config.max_position_embeddings) {
    throw std::invalid_argument("--prompt " + std::to_string(args.prompt) + " + --new-tokens " +
                                std::to_string(args.new_tokens) + " exceed the " + args.shape +
                                " shape's max_position_embeddings " + std::to_string(config.max_position_embeddings));
  }
  args.device = dapo::bench::parse_device(device);
  if (args.dtype_name.empty()) args.dtype_name = args.device.is_cuda() ? "bfloat16" : "float32";
  if (args.dtype_name == "float32")
    args.dtype = torch::kFloat32;
  else if (args.dtype_name == "bfloat16")
    args.dtype = torch::kBFloat16;
  else
    throw std::invalid_argument("--dtype is '" + args.dtype_name + "', expected float32 or bfloat16");
  return args;
}

// `count` seeded random prompts of `length` ids below min(vocabulary, <|endoftext|>).
std::vector<std::vector<int64_t>> random_prompts(int64_t count, int64_t length, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor ids = torch::randint(std::min(vocab, kFirstSpecialId), {count, length}, torch::kInt64);  // [B, P]
  std::vector<std::vector<int64_t>> prompts(static_cast<std::size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    const int64_t* row = ids[b].data_ptr<int64_t>();
    prompts[static_cast<std::size_t>(b)].assign(row, row + length);
  }
  return prompts;
}

qwen::GenerationOptions greedy(int64_t new_tokens, bool sample = false) {
  qwen::GenerationOptions options;
  options.max_new_tokens = new_tokens;
  options.sampling.temperature = sample ? 1.0 : 0.0;  // 0: greedy; 1 without top-k / top-p: the full distribution
  options.stop_ids.clear();                           // EOS ignored: every row runs to new_tokens
  return options;
}

struct CheckResult {
  int64_t prompts = 2, prompt_tokens = 16, new_tokens = 8;
  double identical_fraction = 0;  // of the new tokens
  int64_t near_ties = 0;          // rows whose first difference is a near-tie of the two tokens' logits
};

// Cached greedy decoding against recomputing the whole prefix every step, in float32 (the model as initialised, before
// any cast to bfloat16: in bfloat16 the two paths' different matrix shapes round differently and random weights give
// near-ties, so exact agreement would not be a fair demand there). A row may differ only after a step where the two
// candidate tokens' float32 logits lie within 1e-3 of the logits' scale (a tie that summation order decides); anything
// else throws.
CheckResult check_cached_equals_recomputed(qwen::Qwen2ForCausalLM& model, torch::Device device) {
  CheckResult check;
  const auto prompts = random_prompts(check.prompts, check.prompt_tokens, model->config().vocab_size, kCheckSeed);
  const qwen::GenerationOutput cached = qwen::generate(model, prompts, greedy(check.new_tokens));
  const qwen::GenerationOutput recomputed = qwen::reference_generate(model, prompts, greedy(check.new_tokens));
  const torch::Tensor cached_tokens = cached.tokens.cpu(), recomputed_tokens = recomputed.tokens.cpu();  // [2, 8]
  check.identical_fraction = cached_tokens.eq(recomputed_tokens).to(torch::kFloat64).mean().item<double>();
  torch::NoGradGuard no_grad;
  for (int64_t b = 0; b < check.prompts; ++b) {
    const torch::Tensor differs = cached_tokens[b].ne(recomputed_tokens[b]).nonzero();
    if (differs.numel() == 0) continue;
    const int64_t step = differs[0][0].item<int64_t>();
    // The recomputed path's logits at that step: the prompt and the agreed tokens, whole, without a cache.
    const torch::Tensor prefix = torch::cat({torch::tensor(prompts[static_cast<std::size_t>(b)], torch::kInt64),
                                             cached_tokens[b].narrow(0, 0, step)})
                                     .unsqueeze(0)
                                     .to(device);  // [1, 16 + step]
    const torch::Tensor mask = torch::ones_like(prefix);
    const torch::Tensor logits =
        model->last_logits(prefix, mask, qwen::position_ids_from_mask(mask)).squeeze(0).to(torch::kFloat64).cpu();
    const int64_t a = cached_tokens[b][step].item<int64_t>(), r = recomputed_tokens[b][step].item<int64_t>();
    const double gap = std::abs(logits[a].item<double>() - logits[r].item<double>());
    const double scale = logits.abs().max().item<double>();
    if (!(gap <= 1e-3 * scale)) {
      throw std::runtime_error("cached and recomputed greedy decoding differ in row " + std::to_string(b) +
                               " at new token " + std::to_string(step) + " (" + std::to_string(a) + " vs " +
                               std::to_string(r) + ", logits " + std::to_string(gap) + " apart, scale " +
                               std::to_string(scale) + "): the KV-cache path is wrong on " + device.str());
    }
    ++check.near_ties;
  }
  return check;
}

struct Timings {
  std::vector<double> generate_ms, prefill_ms, decode_ms_per_step;  // one entry per repeat
  torch::Tensor tokens;                                             // [B, N] of the last full run
};

double timed_ms(const std::function<void()>& run, torch::Device device) {
  dapo::bench::synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  run();
  dapo::bench::synchronize(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The timed prompts: --prompts' when given, else --batch seeded random ones of --prompt tokens.
std::vector<std::vector<int64_t>> timed_prompts(qwen::Qwen2ForCausalLM& model, const Args& args) {
  return !args.prompts.empty() ? args.prompts
                               : random_prompts(args.batch, args.prompt, model->config().vocab_size, kPromptSeed);
}

// Per repeat: generate with N new tokens (t_N) and with 1 (t_1: prefill and the first token); one warm-up of both.
Timings time_generate(qwen::Qwen2ForCausalLM& model, const Args& args) {
  const auto prompts = timed_prompts(model, args);
  const bool sample = args.decoding == "sample";
  const auto full = greedy(args.new_tokens, sample), first = greedy(1, sample);
  qwen::GenerationOutput out;
  out = qwen::generate(model, prompts, full);  // warm-up, and a look at the result
  if (out.tokens.size(0) != args.batch || out.tokens.size(1) != args.new_tokens ||
      !out.lengths.eq(args.new_tokens).all().item<bool>()) {
    throw std::runtime_error("generate did not return " + std::to_string(args.new_tokens) + " tokens for each of " +
                             std::to_string(args.batch) + " rows");
  }
  qwen::generate(model, prompts, first);
  Timings timings;
  for (int64_t r = 0; r < args.repeats; ++r) {
    const double t_n = timed_ms([&] { out = qwen::generate(model, prompts, full); }, args.device);
    timings.tokens = out.tokens.cpu();
    const double t_1 = timed_ms([&] { out = qwen::generate(model, prompts, first); }, args.device);
    timings.generate_ms.push_back(t_n);
    timings.prefill_ms.push_back(t_1);
    timings.decode_ms_per_step.push_back((t_n - t_1) / static_cast<double>(args.new_tokens - 1));
  }
  return timings;
}

// The generation engine on the same prompts (one sequence each, every slot live, every row to --new-tokens, greedy
// or sampled at temperature 1), with eager decode steps or CUDA-graph replays: per repeat a whole engine run to N new
// tokens (t_N) and one to 1 (t_1: the prefill and the first token), the graphs' captures included (they live for one
// run, as in a rollout round); one warm-up of each first. Decode ms per step = (t_N - t_1) / (N - 1).
struct EngineTiming {
  std::vector<double> run_ms, prefill_ms, decode_ms_per_step;  // one entry per repeat
  qwen::EngineStats stats;                                     // of the last full run
  std::optional<dapo::bench::PeakMemory> peak;
  std::vector<std::vector<int64_t>> tokens;
};

EngineTiming time_engine(qwen::Qwen2ForCausalLM& model, const Args& args, bool cuda_graphs) {
  const auto prompts = timed_prompts(model, args);
  std::vector<qwen::EngineRequest> requests;
  for (const auto& prompt : prompts) requests.push_back({.prompt = prompt, .n = 1});
  qwen::EngineOptions full;
  full.max_num_seqs = static_cast<int64_t>(requests.size());
  full.max_new_tokens = args.new_tokens;
  full.sampling.temperature = args.decoding == "sample" ? 1.0 : 0.0;
  full.cuda_graphs = cuda_graphs;
  qwen::EngineOptions first = full;
  first.max_new_tokens = 1;
  EngineTiming timing;
  dapo::bench::synchronize(args.device);
  dapo::bench::reset_peak_memory(args.device);
  std::vector<std::vector<qwen::EngineSequence>> out = qwen::generate_requests(model, requests, full);
  qwen::generate_requests(model, requests, first);
  for (int64_t r = 0; r < args.repeats; ++r) {
    const double t_n =
        timed_ms([&] { out = qwen::generate_requests(model, requests, full, &timing.stats); }, args.device);
    const double t_1 = timed_ms([&] { qwen::generate_requests(model, requests, first); }, args.device);
    timing.run_ms.push_back(t_n);
    timing.prefill_ms.push_back(t_1);
    timing.decode_ms_per_step.push_back((t_n - t_1) / static_cast<double>(args.new_tokens - 1));
  }
  timing.peak = dapo::bench::peak_memory(args.device);
  for (const auto& sequences : out) timing.tokens.push_back(sequences.at(0).tokens);
  return timing;
}

// One engine mode's record: medians, the bound's fraction, the engine's counts, the peak memory.
nlohmann::json engine_json(const EngineTiming& timing, double useful_tokens, double bound_ms) {
  const double run_ms = dapo::bench::median(timing.run_ms);
  const double decode_ms = dapo::bench::median(timing.decode_ms_per_step);
  nlohmann::json record{{"run_ms_by_repeat", timing.run_ms},
                        {"prefill_ms_by_repeat", timing.prefill_ms},
                        {"tokens_per_second", useful_tokens / (run_ms / 1e3)},
                        {"decode_ms_per_step", decode_ms},
                        {"prefill_ms", dapo::bench::median(timing.prefill_ms)},
                        {"bound_over_measured", bound_ms / decode_ms},
                        {"decode_calls", timing.stats.decode_calls},
                        {"prefill_calls", timing.stats.prefill_calls},
                        {"checks", timing.stats.checks},
                        {"graph_captures", timing.stats.graph_captures},
                        {"graph_replays", timing.stats.graph_replays}};
  record.update(dapo::bench::peak_memory_json(timing.peak));
  return record;
}

struct ModelBytes {
  int64_t parameters = 0, weight_bytes = 0;  // tied tensors once
};

ModelBytes model_bytes(qwen::Qwen2ForCausalLM& model) {
  ModelBytes bytes;
  std::unordered_set<const void*> seen;
  for (const auto& p : model->parameters()) {
    if (!seen.insert(p.data_ptr()).second) continue;
    bytes.parameters += p.numel();
    bytes.weight_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return bytes;
}

int run(const Args& args) {
  at::set_num_threads(args.threads);
  qwen::Qwen2ForCausalLM model = args.model_dir.empty()
                                     ? qwen::Qwen2ForCausalLM(dapo::bench::model_shape(args.shape))
                                     : qwen::load_model(args.model_dir, torch::kFloat32, args.device);
  const qwen::Config config = model->config();
  if (args.model_dir.empty()) {
    // Built on the CPU (LibTorch modules allocate there), then moved, then initialised on the device: a 1.5B model's
    // random fill is quick on a GPU. Float32 first: the check runs on these weights, the timing on their cast.
    model->to(args.device, torch::kFloat32);
    torch::manual_seed(kWeightSeed);  // seeds the CPU's and every GPU's generator
    qwen::initialize_weights(model);
  }
  const CheckResult check = check_cached_equals_recomputed(model, args.device);
  if (args.dtype != torch::kFloat32) model->to(args.dtype);
  const ModelBytes bytes = model_bytes(model);

  const std::string device_name = dapo::bench::device_name(args.device);
  const double measured_gbs = dapo::bench::copy_bandwidth_gbs(args.device);
  const std::optional<double> datasheet_gbs = dapo::bench::datasheet_bandwidth_gbs(args.device);
  const double bandwidth_gbs = args.bandwidth_gbs.value_or(measured_gbs);
  std::printf("generate_bench: %s decoding with the KV cache, %s (%.1fM parameters), %s, %s, EOS ignored\n",
              args.decoding.c_str(), args.shape.c_str(), static_cast<double>(bytes.parameters) / 1e6,
              args.model_dir.empty() ? "random weights" : "weights from the directory", args.dtype_name.c_str());
  std::printf("machine: %s; device: %s; %d threads, %s allocator, LibTorch %d.%d.%d\n",
              dapo::bench::cpu_model().c_str(), device_name.c_str(), args.threads, dapo::bench::allocator().c_str(),
              TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  std::printf(
      "bandwidth: %.0f GB/s by a copy here%s; the bound uses %.0f GB/s\n", measured_gbs,
      datasheet_gbs ? (", " + std::to_string(static_cast<int64_t>(*datasheet_gbs)) + " by the data sheet").c_str() : "",
      bandwidth_gbs);
  std::printf(
      "check (float32): cached == recomputed greedy decoding, %lld prompts x %lld tokens, %lld new tokens: "
      "%.0f%% identical, %lld near-tie rows\n",
      static_cast<long long>(check.prompts), static_cast<long long>(check.prompt_tokens),
      static_cast<long long>(check.new_tokens), 100 * check.identical_fraction,
      static_cast<long long>(check.near_ties));

  const EngineTiming engine_eager = time_engine(model, args, false);
  std::optional<EngineTiming> engine_graphs;
  if (args.device.is_cuda()) engine_graphs = time_engine(model, args, true);
  dapo::bench::synchronize(args.device);
  dapo::bench::reset_peak_memory(args.device);
  const Timings timings = time_generate(model, args);
  const auto peak = dapo::bench::peak_memory(args.device);

  const double generate_ms = dapo::bench::median(timings.generate_ms);
  const double useful_tokens = static_cast<double>(args.batch * args.new_tokens);
  const double element_bytes = static_cast<double>(c10::elementSize(args.dtype));
  const double mean_context = static_cast<double>(args.prompt) + static_cast<double>(args.new_tokens) / 2.0;
  const double kv_bytes =
      2.0 *
      static_cast<double>(config.num_hidden_layers * config.num_key_value_heads * config.head_dim() * args.batch) *
      mean_context * element_bytes;
  const double weight_bytes = static_cast<double>(bytes.weight_bytes);
  const double bound_ms = (weight_bytes + kv_bytes) / (bandwidth_gbs * 1e9) * 1e3;
  const double gib = 1 << 30;

  nlohmann::json engine_record{{"eager", engine_json(engine_eager, useful_tokens, bound_ms)}};
  if (engine_graphs) {
    int64_t identical = 0;
    for (std::size_t b = 0; b < engine_graphs->tokens.size(); ++b) {
      identical += engine_graphs->tokens[b] == engine_eager.tokens.at(b) ? 1 : 0;
    }
    engine_record["cuda_graphs"] = engine_json(*engine_graphs, useful_tokens, bound_ms);
    engine_record["cuda_graphs"]["rows_identical_to_eager"] =
        static_cast<double>(identical) / static_cast<double>(args.batch);
    engine_record["graphs_over_eager"] =
        dapo::bench::median(engine_eager.run_ms) / dapo::bench::median(engine_graphs->run_ms);
  }
  // The headline: the engine as the trainer runs it here (graphs on CUDA, eager elsewhere).
  const nlohmann::json& headline = engine_graphs ? engine_record["cuda_graphs"] : engine_record["eager"];
  const nlohmann::json generate_call{
      {"tokens_per_second", useful_tokens / (generate_ms / 1e3)},
      {"decode_ms_per_step", dapo::bench::median(timings.decode_ms_per_step)},
      {"prefill_ms", dapo::bench::median(timings.prefill_ms)},
      {"generate_ms", generate_ms},
      {"generate_ms_by_repeat", timings.generate_ms},
      {"prefill_ms_by_repeat", timings.prefill_ms},
      {"bound_over_measured", bound_ms / dapo::bench::median(timings.decode_ms_per_step)},
      {"peak_device_memory_bytes", dapo::bench::peak_memory_json(peak)["peak_device_memory_bytes"]}};

  std::printf("\n%-48s %14s\n", ("median of " + std::to_string(args.repeats) + " repeats").c_str(), "value");
  const auto row = [](const std::string& name, int decimals, double value) {
    std::printf("%-48s %14.*f\n", name.c_str(), decimals, value);
  };
  std::printf(
      "%-48s %14s\n", "batch x prompt -> new tokens",
      (std::to_string(args.batch) + " x " + std::to_string(args.prompt) + " -> " + std::to_string(args.new_tokens))
          .c_str());
  row("weight GiB (tied once)", 3, weight_bytes / gib);
  row("KV-cache GiB read per step (mean context)", 3, kv_bytes / gib);
  row("bandwidth bound ms/step @ " + std::to_string(static_cast<int64_t>(bandwidth_gbs)) + " GB/s", 3, bound_ms);
  const auto engine_rows = [&](const std::string& mode, const nlohmann::json& record) {
    row("engine, " + mode + ": tokens/s", 1, record["tokens_per_second"].get<double>());
    row("engine, " + mode + ": decode ms/step", 3, record["decode_ms_per_step"].get<double>());
    row("engine, " + mode + ": prefill + first token ms", 2, record["prefill_ms"].get<double>());
    row("engine, " + mode + ": bound / measured", 3, record["bound_over_measured"].get<double>());
  };
  engine_rows("eager steps", engine_record["eager"]);
  std::printf("%-48s %s\n", "engine, eager steps: peak device memory",
              dapo::bench::peak_memory_text(engine_eager.peak, args.device).c_str());
  if (engine_graphs) {
    engine_rows("CUDA graphs", engine_record["cuda_graphs"]);
    row("engine, CUDA graphs over eager (speed)", 3, engine_record["graphs_over_eager"].get<double>());
    std::printf("%-48s %lld captured, %lld replayed of %lld steps; %.0f%% of rows identical to eager\n",
                "engine, CUDA graphs", static_cast<long long>(engine_graphs->stats.graph_captures),
                static_cast<long long>(engine_graphs->stats.graph_replays),
                static_cast<long long>(engine_graphs->stats.decode_calls),
                100 * engine_record["cuda_graphs"]["rows_identical_to_eager"].get<double>());
  }
  row("generate() call: tokens/s", 1, generate_call["tokens_per_second"].get<double>());
  row("generate() call: decode ms/step", 3, generate_call["decode_ms_per_step"].get<double>());
  std::printf("%-48s %s\n", "generate() call: peak device memory",
              dapo::bench::peak_memory_text(peak, args.device).c_str());
  // The backend scaled_dot_product_attention takes for the layers' calls on this device (-1: the eager products):
  // the training forward's causal call (rows of the prompt + new tokens), a decode step's and a prefill's.
  const auto attention_options =
      torch::TensorOptions().device(args.device).dtype(model->lm_head_weight().scalar_type());
  const nlohmann::json backends = {
      {"training_causal", qwen::attention_backend(config, args.batch, args.prompt + args.new_tokens,
                                                  args.prompt + args.new_tokens, false, attention_options)},
      {"decode",
       qwen::attention_backend(config, args.batch, 1, args.prompt + args.new_tokens, true, attention_options)},
      {"prefill", qwen::attention_backend(config, args.batch, args.prompt, args.prompt, true, attention_options)}};
  std::printf("%-48s %s (0 math, 1 flash, 2 memory-efficient, 3 cuDNN)\n", "attention backends",
              backends.dump().c_str());

  nlohmann::json record{{"benchmark", "the generation engine's decode speed against the bandwidth bound"},
                        {"machine", dapo::bench::machine()},
                        {"device", args.device.str()},
                        {"device_name", device_name},
                        {"shape", args.shape},
                        {"config", config.to_json()},
                        {"parameters", bytes.parameters},
                        {"dtype", args.dtype_name},
                        {"decoding", args.decoding},
                        {"model_dir", args.model_dir},
                        {"batch", args.batch},
                        {"prompt", args.prompt},
                        {"new_tokens", args.new_tokens},
                        {"repeats", args.repeats},
                        {"threads", args.threads},
                        {"bandwidth_gbs", bandwidth_gbs},
                        {"bandwidth_source", args.bandwidth_gbs ? "--bandwidth-gbs" : "copy measured here"},
                        {"copy_bandwidth_gbs", measured_gbs},
                        {"datasheet_bandwidth_gbs", datasheet_gbs ? nlohmann::json(*datasheet_gbs) : nullptr},
                        {"check",
                         {{"dtype", "float32"},
                          {"prompts", check.prompts},
                          {"prompt_tokens", check.prompt_tokens},
                          {"new_tokens", check.new_tokens},
                          {"identical_fraction", check.identical_fraction},
                          {"near_tie_rows", check.near_ties}}},
                        {"engine_mode", engine_graphs ? "cuda_graphs" : "eager"},
                        {"tokens_per_second", headline["tokens_per_second"]},
                        {"decode_ms_per_step", headline["decode_ms_per_step"]},
                        {"prefill_ms", headline["prefill_ms"]},
                        {"weight_bytes", bytes.weight_bytes},
                        {"kv_bytes_per_decode_step", kv_bytes},
                        {"bandwidth_bound_ms_per_step", bound_ms},
                        {"bound_over_measured", headline["bound_over_measured"]},
                        {"peak_device_memory_bytes", headline["peak_device_memory_bytes"]},
                        {"peak_device_reserved_bytes", headline["peak_device_reserved_bytes"]},
                        {"attention_backends", backends},
                        {"engine", engine_record},
                        {"generate_call", generate_call}};
  std::vector<std::vector<int64_t>> tokens(static_cast<std::size_t>(timings.tokens.size(0)));
  for (int64_t b = 0; b < timings.tokens.size(0); ++b) {
    const torch::Tensor row = timings.tokens[b].contiguous();
    tokens[static_cast<std::size_t>(b)].assign(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  record["tokens"] = tokens;
  dapo::bench::write_json(record, args.json_path);
  std::printf("wrote %s\n", args.json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  std::optional<Args> args;
  try {
    args = parse_args(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "generate_bench: %s\n", error.what());
    return 2;
  }
  if (!args) return 0;  // --help
  try {
    return run(*args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "generate_bench: %s\n", error.what());
    return 1;
  }
}
