// Rollouts the old way and the engine's way, on a GSM8K-like long tail of response lengths: the static batch
// (every prompt repeated n times, finished rows computed until the longest ends: one static batch of the engine with
// every request's budget the longest length), the engine with
// static batches, and the engine's continuous batching, each with one prefill per sequence or per prompt; then
// dynamic sampling, sequential rounds of static batches (the trainer before the engine) against the engine's streaming
// as the trainer runs it (qwen::GroupStream: admission control, groups decided in prompt order, the run stopped when
// enough are kept). Random weights never stop, so each group gets a length drawn from a log-normal (median
// --median-fraction x max_new_tokens, sigma --sigma, cut at max_new_tokens), its request's token budget (max_tokens:
// noticed at a check, as a stop token is), and a group is kept with probability --keep rates by a seeded hash (as if
// its rewards disagreed).
//
// Reported per mode: decode calls (model forwards of one token per row), rows computed (their rows summed), rows
// computed per useful token, prefill rows and tokens, finished-flag checks (host synchronisations), the engine's reads
// of device data by the host (waits, and fetches taken a step later) and copies to the device (model/host_door.hpp),
// useful tokens/s, and the peak of tensor memory (the tracking allocator). Every mode's sequences have the same
// lengths; the tokens of the engine's greedy run are checked against the reference decoder's before timing.
//
// Usage: rollout_bench [--shape small|demo|...] [--prompts P] [--n N] [--max-new-tokens T] [--prompt-tokens L]
//                      [--median-fraction F] [--sigma S] [--max-num-seqs S] [--check-every K] [--keep-rates a,b,c]
//                      [--repeats R] [--threads T] [--json PATH]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/common/seed.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/group_stream.hpp"
#include "qwen_gsm8k/model/generation.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/shapes.hpp"
#include "support/tracking_allocator.hpp"

namespace {

struct Args {
  std::string shape = "small", json_path = "rollout_bench.json", keep_rates = "0.3,0.5,0.8";
  int64_t prompts = 8, n = 8, max_new_tokens = 256, prompt_tokens = 160, max_num_seqs = 0, check_every = 8;
  int64_t repeats = 3;  // each mode timed this many times; the run of median time is reported
  double median_fraction = 0.3, sigma = 0.6;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

// The workload: group g's prompt (length uniform in [prompt_tokens / 2, prompt_tokens]) and its responses' length.
struct Workload {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> lengths;  // [group]: each of its n samples ends there
};

Workload make_workload(const Args& args, int64_t groups, int64_t vocab) {
  std::mt19937_64 random(12345);
  std::uniform_int_distribution<int64_t> token(0, std::min<int64_t>(vocab, 151643) - 1);
  std::uniform_int_distribution<int64_t> prompt_length(args.prompt_tokens / 2, args.prompt_tokens);
  std::lognormal_distribution<double> length(std::log(args.median_fraction * static_cast<double>(args.max_new_tokens)),
                                             args.sigma);
  Workload work;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> prompt(static_cast<std::size_t>(prompt_length(random)));
    for (auto& id : prompt) id = token(random);
    work.prompts.push_back(prompt);
    work.lengths.push_back(std::clamp<int64_t>(std::llround(length(random)), 1, args.max_new_tokens));
  }
  return work;
}

bool kept(int64_t group, double keep) {
  return static_cast<double>(qwen::splitmix64(static_cast<uint64_t>(group) * 7919u) >> 11) * 0x1.0p-53 < keep;
}

struct Result {
  std::string mode;
  qwen::EngineStats stats;
  double seconds = 0;
  int64_t peak_bytes = 0, groups_generated = 0, rounds = 0;
};

nlohmann::json to_json(const Result& r) {
  const auto& s = r.stats;
  return {{"mode", r.mode},
          {"decode_calls", s.decode_calls},
          {"rows_computed", s.rows_computed},
          {"useful_tokens", s.useful_tokens},
          {"rows_per_useful_token", static_cast<double>(s.rows_computed) / static_cast<double>(s.useful_tokens)},
          {"prefill_calls", s.prefill_calls},
          {"prefill_rows", s.prefill_rows},
          {"prefill_tokens", s.prefill_tokens},
          {"checks", s.checks},
          {"host_reads", s.host_reads},
          {"host_fetches", s.host_fetches},
          {"host_copies", s.host_copies},
          {"dropped_sequences", s.dropped},
          {"groups_generated", r.groups_generated},
          {"rounds", r.rounds},
          {"seconds", r.seconds},
          {"useful_tokens_per_second", static_cast<double>(s.useful_tokens) / r.seconds},
          {"peak_bytes", r.peak_bytes}};
}

void print(const Result& r) {
  const auto& s = r.stats;
  const auto counted = [](int64_t value) { return value < 0 ? std::string("-") : std::to_string(value); };
  std::printf("  %-28s %7lld %9lld %6.2f %6lld %8lld %6lld %6s %7s %6s %8.2f %9.1f %8.1f\n", r.mode.c_str(),
              static_cast<long long>(s.decode_calls), static_cast<long long>(s.rows_computed),
              static_cast<double>(s.rows_computed) / static_cast<double>(s.useful_tokens),
              static_cast<long long>(s.prefill_rows), static_cast<long long>(s.prefill_tokens),
              static_cast<long long>(s.checks), counted(s.host_reads).c_str(), counted(s.host_fetches).c_str(),
              counted(s.host_copies).c_str(), r.seconds, static_cast<double>(s.useful_tokens) / r.seconds,
              static_cast<double>(r.peak_bytes) / 1e6);
  std::fflush(stdout);  // a line as each mode ends: the slow modes of a large shape take minutes
}

class Bench {
 public:
  Bench(qwen::Qwen2ForCausalLM& model, const Args& args, dapo::bench::TrackingAllocator& memory)
      : model_(model), args_(args), memory_(memory) {}

  // The static path (the trainer's rollouts before the engine): the groups' prompts repeated n times in one batch,
  // prefilled once per sequence, every row decoded until the longest length ends (random weights never stop; a
  // finished row of a static batch runs on as padding), run as one static batch of the engine.
  Result static_batch(const Workload& work, int64_t first, int64_t count, const std::string& mode) {
    std::vector<qwen::EngineRequest> requests;
    int64_t longest = 0, useful = 0;
    for (int64_t g = first; g < first + count; ++g) {
      const int64_t length = work.lengths[static_cast<std::size_t>(g)];
      longest = std::max(longest, length);
      useful += args_.n * length;
    }
    for (int64_t g = first; g < first + count; ++g) {
      requests.push_back({.prompt = work.prompts[static_cast<std::size_t>(g)],
                          .n = args_.n,
                          .seed = static_cast<uint64_t>(g),
                          .max_tokens = longest});
    }
    const qwen::EngineOptions options =
        engine_options(/*max_prompt=*/0, count * args_.n, /*shared=*/false, /*continuous=*/false);
    Result result;
    result.mode = mode;
    memory_.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    qwen::generate_requests(model_, requests, options, &result.stats);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.peak_bytes = memory_.peak_bytes();
    result.stats.useful_tokens = useful;  // the rows' own lengths, not the longest
    result.groups_generated = count;
    result.rounds = 1;
    return result;
  }

  qwen::EngineOptions engine_options(int64_t max_prompt, int64_t slots, bool shared, bool continuous,
                                     double temperature = 1.0) const {
    qwen::EngineOptions options;
    options.max_num_seqs = slots;
    options.max_prompt_tokens = max_prompt;
    options.max_new_tokens = args_.max_new_tokens;
    options.sampling.temperature = temperature;
    options.check_every = args_.check_every;
    options.shared_prefill = shared;
    options.continuous = continuous;
    return options;
  }

  // The engine over groups [0, limit): all of them, or (keep > 0) streaming dynamic sampling as the trainer runs it
  // (qwen::GroupStream: admission control, groups decided in prompt order) until `target` groups are kept.
  Result engine(const Workload& work, int64_t limit, const qwen::EngineOptions& options, const std::string& mode,
                double keep = 0, int64_t target = 0) {
    int64_t next = 0;
    qwen::GroupStream stream(args_.n, std::max<int64_t>(target, 1), limit);
    qwen::GenerationEngine engine(model_, options);
    Result result;
    result.mode = mode;
    memory_.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    result.stats = engine.run(
        [&]() -> std::optional<qwen::EngineRequest> {
          if (keep > 0 ? !stream.admit() : next == limit) return std::nullopt;
          const auto g = static_cast<std::size_t>(next);
          return qwen::EngineRequest{.prompt = work.prompts[g],
                                     .n = args_.n,
                                     .seed = static_cast<uint64_t>(next++),
                                     .max_tokens = work.lengths[g]};
        },
        [&](qwen::EngineSequence&& sequence) {
          if (keep <= 0 || !stream.response_done(sequence.request)) return true;
          return stream.decide([&](int64_t group) { return kept(group, keep); });
        });
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.peak_bytes = memory_.peak_bytes();
    result.groups_generated = result.stats.requests;
    result.rounds = 1;
    if (keep > 0 && !stream.done()) throw std::runtime_error(mode + ": the stream ended before the target was kept");
    return result;
  }

  // Dynamic sampling in rounds (the trainer before the engine): rounds of `per_round` groups, each a static batch,
  // until `target` groups are kept.
  Result rounds(const Workload& work, int64_t per_round, int64_t max_rounds, double keep, int64_t target) {
    Result total;
    total.mode = "rounds, keep " + fraction(keep);
    int64_t kept_groups = 0;
    for (int64_t round = 0; round < max_rounds && kept_groups < target; ++round) {
      const Result part = static_batch(work, round * per_round, per_round, "");
      for (int64_t g = round * per_round; g < (round + 1) * per_round; ++g) kept_groups += kept(g, keep) ? 1 : 0;
      auto& s = total.stats;
      s.decode_calls += part.stats.decode_calls;
      s.rows_computed += part.stats.rows_computed;
      s.prefill_calls += part.stats.prefill_calls;
      s.prefill_rows += part.stats.prefill_rows;
      s.prefill_tokens += part.stats.prefill_tokens;
      s.checks += part.stats.checks;
      s.host_reads += part.stats.host_reads;
      s.host_fetches += part.stats.host_fetches;
      s.host_copies += part.stats.host_copies;
      s.useful_tokens += part.stats.useful_tokens;
      total.seconds += part.seconds;
      total.peak_bytes = std::max(total.peak_bytes, part.peak_bytes);
      total.groups_generated += per_round;
      ++total.rounds;
    }
    return total;
  }

  static std::string fraction(double value) {
    char text[16];
    std::snprintf(text, sizeof text, "%.1f", value);
    return text;
  }

 private:
  qwen::Qwen2ForCausalLM& model_;
  const Args& args_;
  dapo::bench::TrackingAllocator& memory_;
};

// Greedy tokens of the engine (a pool of 3, shared prefill, checks every 4 steps) against the reference decoder's.
void check_engine_against_generate(qwen::Qwen2ForCausalLM& model) {
  const std::vector<std::vector<int64_t>> prompts{{11, 12, 13, 14}, {21, 22}, {31, 32, 33}};
  qwen::GenerationOptions generation;
  generation.max_new_tokens = 12;
  generation.sampling.temperature = 0.0;
  std::vector<std::vector<int64_t>> repeated;
  std::vector<qwen::EngineRequest> requests;
  for (const auto& prompt : prompts) {
    repeated.insert(repeated.end(), 2, prompt);
    requests.push_back({.prompt = prompt, .n = 2});
  }
  const auto reference = qwen::reference_generate(model, repeated, generation);
  qwen::EngineOptions options;
  options.max_num_seqs = 3;
  options.max_new_tokens = 12;
  options.sampling.temperature = 0.0;
  options.check_every = 4;
  const auto out = qwen::generate_requests(model, requests, options);
  for (int64_t row = 0; row < 6; ++row) {
    const auto& tokens = out[static_cast<std::size_t>(row / 2)][static_cast<std::size_t>(row % 2)].tokens;
    const torch::Tensor expected = reference.tokens[row].contiguous();
    if (!std::equal(tokens.begin(), tokens.end(), expected.data_ptr<int64_t>())) {
      throw std::runtime_error("the engine's greedy tokens differ from the reference decoder's in row " +
                               std::to_string(row));
    }
  }
}

int run(const Args& args) {
  at::set_num_threads(args.threads);
  auto& memory = dapo::bench::TrackingAllocator::install();
  qwen::Qwen2ForCausalLM model(dapo::bench::model_shape(args.shape));
  torch::manual_seed(0);
  qwen::initialize_weights(model);
  model->eval();
  torch::NoGradGuard no_grad;
  check_engine_against_generate(model);

  std::vector<double> keeps;
  {
    std::stringstream list(args.keep_rates);
    for (std::string item; std::getline(list, item, ',');) keeps.push_back(std::stod(item));
  }
  constexpr int64_t kMaxRounds = 10;  // verl's max_num_gen_batches bound: at most 10 rounds of groups
  const Workload work = make_workload(args, args.prompts * kMaxRounds, model->config().vocab_size);
  int64_t max_prompt = 0;
  for (const auto& prompt : work.prompts)
    max_prompt = std::max<int64_t>(max_prompt, static_cast<int64_t>(prompt.size()));
  const int64_t rows = args.prompts * args.n, slots = args.max_num_seqs > 0 ? args.max_num_seqs : rows;
  Bench bench(model, args, memory);

  std::printf(
      "rollout_bench: %s shape, %lld prompts x n %lld, max_new_tokens %lld, prompts of %lld-%lld tokens,"
      " lengths log-normal (median %.0f, sigma %.2f), %lld slots, checks every %lld steps, %d threads\n",
      args.shape.c_str(), static_cast<long long>(args.prompts), static_cast<long long>(args.n),
      static_cast<long long>(args.max_new_tokens), static_cast<long long>(args.prompt_tokens / 2),
      static_cast<long long>(args.prompt_tokens), args.median_fraction * static_cast<double>(args.max_new_tokens),
      args.sigma, static_cast<long long>(slots), static_cast<long long>(args.check_every), args.threads);
  std::printf("  %-28s %7s %9s %6s %6s %8s %6s %6s %7s %6s %8s %9s %8s\n", "mode", "decodes", "rows", "rows/t",
              "pf-rows", "pf-toks", "checks", "reads", "fetches", "copies", "seconds", "tokens/s", "peak MB");
  std::vector<Result> results;
  // Runs of a second or two vary by 2x between runs on a shared machine: each mode runs `repeats` times (the counts
  // are the same every time) and the run of median time stands for it.
  const auto add = [&](const std::function<Result()>& measure) {
    std::vector<Result> runs;
    for (int64_t r = 0; r < args.repeats; ++r) runs.push_back(measure());
    std::sort(runs.begin(), runs.end(), [](const Result& a, const Result& b) { return a.seconds < b.seconds; });
    Result median = std::move(runs[runs.size() / 2]);
    print(median);
    results.push_back(std::move(median));
  };
  add([&] { return bench.static_batch(work, 0, args.prompts, "static (one batch)"); });
  add([&] {
    return bench.engine(work, args.prompts, bench.engine_options(max_prompt, rows, true, false),
                        "static, shared prefill");
  });
  add([&] {
    return bench.engine(work, args.prompts, bench.engine_options(max_prompt, slots, false, true), "continuous");
  });
  add([&] {
    return bench.engine(work, args.prompts, bench.engine_options(max_prompt, slots, true, true),
                        "continuous, shared prefill");
  });
  for (const double keep : keeps) {
    add([&] { return bench.rounds(work, args.prompts, kMaxRounds, keep, args.prompts); });
    add([&] {
      return bench.engine(work, args.prompts * kMaxRounds, bench.engine_options(max_prompt, rows, true, true),
                          "streaming, keep " + Bench::fraction(keep), keep, args.prompts);
    });
  }

  // How often batch composition changes the bits: the same sampled run with a pool of all rows and of one row.
  const auto sampled = [&](int64_t pool) {
    qwen::EngineOptions options = bench.engine_options(max_prompt, pool, true, true);
    options.return_logprobs = true;
    std::vector<qwen::EngineRequest> requests;
    for (int64_t g = 0; g < args.prompts; ++g) {
      requests.push_back(
          {.prompt = work.prompts[static_cast<std::size_t>(g)], .n = args.n, .seed = static_cast<uint64_t>(g)});
    }
    return qwen::generate_requests(model, requests, options);
  };
  const auto together = sampled(rows), alone = sampled(1);
  int64_t same_sequences = 0, sequences = 0, tokens = 0, same_bits = 0;
  for (std::size_t g = 0; g < together.size(); ++g) {
    for (std::size_t i = 0; i < together[g].size(); ++i) {
      ++sequences;
      const auto &a = together[g][i], &b = alone[g][i];
      if (a.tokens == b.tokens) ++same_sequences;
      for (std::size_t t = 0; t < std::min(a.tokens.size(), b.tokens.size()) && a.tokens[t] == b.tokens[t]; ++t) {
        ++tokens;
        same_bits += a.logprobs[t] == b.logprobs[t] ? 1 : 0;
      }
    }
  }
  std::printf(
      "  batch composition (pool of %lld vs 1, sampled): %lld of %lld sequences identical; of %lld common"
      " tokens, %lld log-probs the same bits (%.1f %%)\n",
      static_cast<long long>(rows), static_cast<long long>(same_sequences), static_cast<long long>(sequences),
      static_cast<long long>(tokens), static_cast<long long>(same_bits),
      100.0 * static_cast<double>(same_bits) / static_cast<double>(std::max<int64_t>(tokens, 1)));

  nlohmann::json record{{"benchmark", "rollout_bench"},
                        {"machine", dapo::bench::machine()},
                        {"shape", args.shape},
                        {"prompts", args.prompts},
                        {"n", args.n},
                        {"max_new_tokens", args.max_new_tokens},
                        {"prompt_tokens", args.prompt_tokens},
                        {"median_fraction", args.median_fraction},
                        {"sigma", args.sigma},
                        {"max_num_seqs", slots},
                        {"check_every", args.check_every},
                        {"repeats", args.repeats},
                        {"modes", nlohmann::json::array()},
                        {"batch_composition",
                         {{"sequences", sequences},
                          {"identical_sequences", same_sequences},
                          {"common_tokens", tokens},
                          {"same_bits_logprobs", same_bits}}}};
  for (const auto& result : results) record["modes"].push_back(to_json(result));
  dapo::bench::write_json(record, args.json_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args;
    dapo::bench::Flags flags("rollout_bench");
    flags.text("--shape", args.shape, "NAME", dapo::bench::kShapeNames)
        .integer("--prompts", args.prompts, 1, "P", "groups per step (train_batch_size)")
        .integer("--n", args.n, 1, "N", "responses per prompt")
        .integer("--max-new-tokens", args.max_new_tokens, 2, "T", "the length budget")
        .integer("--prompt-tokens", args.prompt_tokens, 2, "L", "prompts of L / 2 to L tokens")
        .positive("--median-fraction", args.median_fraction, "F", "the lengths' median over max_new_tokens")
        .positive("--sigma", args.sigma, "S", "the log-normal's sigma")
        .integer("--max-num-seqs", args.max_num_seqs, 0, "S", "the engine's slots; 0: prompts x n")
        .integer("--check-every", args.check_every, 1, "K", "decode steps between finished checks")
        .text("--keep-rates", args.keep_rates, "A,B", "dynamic sampling's kept fractions")
        .integer("--repeats", args.repeats, 1, "R", "timed runs per mode; the median is reported")
        .integer("--threads", args.threads, 1, "T", "LibTorch threads")
        .text("--json", args.json_path, "PATH", "where the record goes");
    if (!flags.parse(argc, argv)) return 0;
    return run(args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rollout_bench: %s\n", error.what());
    return 1;
  }
}
