// The generation engine (continuous batching over a slot pool): greedy output equal to the reference's for any pool
// size, with and without the shared prefill, checked every step or every few; each sequence's draws independent of the
// others and of its admission order; stops, the length budget, log-probs, the repetition penalty; the counts it
// reports (prefill rows divided by n, the rows a check interval can waste); the host's reads and copies through its one
// door (none inside a decode step); a sink that stops the run; bad requests. The scheduler alone, with no model:
// scheduler_test.cpp.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/engine/decode_graphs.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/group_stream.hpp"
#include "qwen_gsm8k/engine/model_runner.hpp"
#include "qwen_gsm8k/engine/scheduler.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/generation.hpp"
#include "qwen_gsm8k/model/host_door.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

// Prompts of different lengths (so the prefill pads), each asked for n samples.
std::vector<qwen::EngineRequest> requests(int64_t n) {
  const std::vector<std::vector<int64_t>> prompts{{5, 6, 7}, {8, 9}, {10, 11, 12, 13, 14}, {15}, {16, 17, 18, 19}};
  std::vector<qwen::EngineRequest> out;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    out.push_back({.prompt = prompts[i], .n = n, .seed = 100 + i});
  }
  return out;
}

// The reference decoder's greedy rows (no cache, the whole prefix recomputed): the prompt of each request repeated n
// times.
qwen::GenerationOutput greedy_reference(qwen::Qwen2ForCausalLM& model, const std::vector<qwen::EngineRequest>& reqs,
                                        const qwen::EngineOptions& options) {
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& request : reqs) {
    for (int64_t i = 0; i < request.n; ++i) prompts.push_back(request.prompt);
  }
  qwen::GenerationOptions generation;
  generation.max_new_tokens = options.max_new_tokens;
  generation.stop_ids = options.stop_ids;
  generation.sampling = options.sampling;
  generation.return_logprobs = true;
  return qwen::reference_generate(model, prompts, generation);
}

// A GraphRecorder on the CPU: "captures" the step function and calls it at each replay, as a CUDA graph reruns its
// kernels; what it counts is the engine's bookkeeping (which steps are captured, which replayed, across runs).
struct StepRecorder final : qwen::GraphRecorder {
  std::map<Shape, std::function<void()>> steps;
  int64_t captured = 0, replayed = 0;
  void capture(Shape shape, const std::function<void()>& step) override {
    steps[shape] = step;
    ++captured;
  }
  void replay(Shape shape) override {
    steps.at(shape)();
    ++replayed;
  }
  void clear() override { steps.clear(); }
};

std::vector<int64_t> row_of(const torch::Tensor& tokens, int64_t row, int64_t length) {
  const torch::Tensor values = tokens[row].narrow(0, 0, length).cpu().contiguous();
  return {values.data_ptr<int64_t>(), values.data_ptr<int64_t>() + length};
}

}  // namespace

TEST_CASE("engine: greedy sequences are the reference's for every pool size, prefill sharing and check interval") {
  for (const char* name : {"tiny-tied-f32", "tiny-untied-f32-sharded", "tiny-tied-bf16"}) {
    const auto dir = dapo::test::qwen_fixture(name);
    if (!dir) return;
    CAPTURE(name);
    auto model = qwen::load_model(*dir, torch::kFloat32);
    const auto reqs = requests(2);
    qwen::EngineOptions options;
    options.max_new_tokens = 10;
    options.sampling.temperature = 0.0;
    options.return_logprobs = true;
    // A stop id that ends some rows early: the third token greedy decoding gives the first prompt.
    options.stop_ids = {row_of(greedy_reference(model, reqs, options).tokens, 0, 3)[2]};
    const auto reference = greedy_reference(model, reqs, options);
    int64_t stopped = 0;
    for (const int64_t pool : {1, 3, 10}) {
      for (const bool shared : {true, false}) {
        for (const int64_t check_every : {1, 4}) {
          CAPTURE(pool);
          CAPTURE(shared);
          CAPTURE(check_every);
          options.max_num_seqs = pool;
          options.shared_prefill = shared;
          options.check_every = check_every;
          qwen::EngineStats stats;
          const auto out = qwen::generate_requests(model, reqs, options, &stats);
          int64_t row = 0;
          for (std::size_t r = 0; r < reqs.size(); ++r) {
            for (int64_t i = 0; i < reqs[r].n; ++i, ++row) {
              const auto& sequence = out[r][static_cast<std::size_t>(i)];
              const int64_t length = reference.lengths[row].item<int64_t>();
              CHECK(sequence.tokens == row_of(reference.tokens, row, length));
              CHECK((sequence.finish_reason == qwen::FinishReason::kLength) == reference.truncated[row].item<bool>());
              // Log-probs of the same tokens over the same prefix, computed in other batches: float32 rounding apart.
              const torch::Tensor ours = torch::tensor(sequence.logprobs);
              CHECK(torch::allclose(ours, reference.logprobs[row].narrow(0, 0, length), 1e-4, 1e-4));
              if (pool == 1 && shared && check_every == 1 && length < options.max_new_tokens) ++stopped;
            }
          }
          CHECK(stats.sequences == row);
          CHECK(stats.prefill_rows == (shared ? 5 : 10));
          CHECK(stats.dropped == 0);
        }
      }
    }
    CHECK(stopped > 0);
  }
}

TEST_CASE("engine: a sequence's draws are its own (seed, sample), whatever the order and company it runs in") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  auto reqs = requests(3);
  qwen::EngineOptions options;
  options.max_new_tokens = 12;
  options.sampling = {.temperature = 1.0, .top_k = 50, .top_p = 0.9};
  options.return_logprobs = true;
  options.max_num_seqs = 1;  // alone in every step: the logits are the same bits in any order
  const auto forward = qwen::generate_requests(model, reqs, options);
  std::reverse(reqs.begin(), reqs.end());
  const auto backward = qwen::generate_requests(model, reqs, options);
  bool samples_differ = false;
  for (std::size_t r = 0; r < reqs.size(); ++r) {
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& a = forward[r][i];
      const auto& b = backward[reqs.size() - 1 - r][i];
      CHECK(a.tokens == b.tokens);
      CHECK(a.logprobs == b.logprobs);
      if (i > 0 && a.tokens != forward[r][0].tokens) samples_differ = true;
    }
  }
  CHECK(samples_differ);  // the n samples of a prompt draw different streams
  // Another seed, other tokens.
  reqs[0].seed += 1;
  const auto reseeded = qwen::generate_requests(model, reqs, options);
  CHECK(reseeded[0][0].tokens != backward[0][0].tokens);
  // Any pool size runs the same program; where the logits agree the tokens do. The same settings twice: the same.
  options.max_num_seqs = 4;
  CHECK(qwen::generate_requests(model, reqs, options)[2][1].tokens ==
        qwen::generate_requests(model, reqs, options)[2][1].tokens);
}

TEST_CASE("engine: sampled log-probs are log softmax(logits / T) of the drawn tokens") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  qwen::EngineOptions options;
  options.max_new_tokens = 8;
  options.sampling = {.temperature = 0.7};
  options.return_logprobs = true;
  options.max_num_seqs = 3;
  const auto reqs = requests(2);
  const auto out = qwen::generate_requests(model, reqs, options);
  for (std::size_t r = 0; r < reqs.size(); ++r) {
    for (const auto& sequence : out[r]) {
      std::vector<int64_t> ids = reqs[r].prompt;
      ids.insert(ids.end(), sequence.tokens.begin(), sequence.tokens.end());
      const auto input = torch::tensor(ids, torch::kInt64).unsqueeze(0);
      const auto mask = torch::ones_like(input);
      const auto logits = model->forward(input, mask, qwen::position_ids_from_mask(mask))[0];
      const auto prompt = static_cast<int64_t>(reqs[r].prompt.size());
      const auto length = static_cast<int64_t>(sequence.tokens.size());
      const auto expected = (logits.narrow(0, prompt - 1, length) / 0.7)
                                .log_softmax(-1)
                                .gather(1, torch::tensor(sequence.tokens, torch::kInt64).unsqueeze(1))
                                .squeeze(1);
      CHECK(torch::allclose(torch::tensor(sequence.logprobs), expected, 1e-4, 1e-5));
    }
  }
}

TEST_CASE("engine: the repetition penalty sees each sequence's own tokens (the reference's when no prompt is padded)") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  std::vector<qwen::EngineRequest> reqs{{.prompt = {5, 6, 7}, .n = 2}, {.prompt = {9, 9, 4}, .n = 1}};
  qwen::EngineOptions options;
  options.max_new_tokens = 12;
  options.sampling = {.temperature = 0.0, .repetition_penalty = 1.8};
  options.max_num_seqs = 2;
  const auto reference = greedy_reference(model, reqs, options);
  const auto out = qwen::generate_requests(model, reqs, options);
  CHECK(out[0][0].tokens == row_of(reference.tokens, 0, 12));
  CHECK(out[0][1].tokens == row_of(reference.tokens, 1, 12));
  CHECK(out[1][0].tokens == row_of(reference.tokens, 2, 12));
}

TEST_CASE("engine: counts: prefill rows per prompt, decode rows within the check interval's bound, static batches") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  auto reqs = requests(4);  // 5 prompts x 4 samples
  qwen::EngineOptions options;
  options.max_new_tokens = 16;
  options.sampling.temperature = 1.0;
  options.max_num_seqs = 6;
  options.check_every = 4;
  // Budgets between 1 and 16 tokens (no stop ids: every sequence runs to its request's budget).
  const auto budget = [](int64_t request) { return 1 + (request * 7) % 16; };
  int64_t budget_tokens = 0, decodes_needed = 0;
  for (int64_t r = 0; r < 5; ++r) {
    reqs[static_cast<std::size_t>(r)].max_tokens = budget(r);
    budget_tokens += 4 * budget(r);
    decodes_needed += 4 * (budget(r) - 1);  // the first token comes from the prefill
  }
  qwen::EngineStats continuous;
  const auto out = qwen::generate_requests(model, reqs, options, &continuous);
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t i = 0; i < 4; ++i) {
      const auto& sequence = out[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
      CHECK(static_cast<int64_t>(sequence.tokens.size()) == budget(r));
      CHECK(sequence.finish_reason == qwen::FinishReason::kLength);
    }
  }
  CHECK(continuous.useful_tokens == budget_tokens);
  CHECK(continuous.prefill_rows ==
        5);  // one per prompt: a half-admitted prompt's prefill is kept for its other samples
  CHECK(continuous.rows_computed >= decodes_needed);
  CHECK(continuous.rows_computed <= decodes_needed + 20 * (options.check_every - 1));
  CHECK(continuous.sequences == 20);

  options.continuous = false;
  options.shared_prefill = false;
  qwen::EngineStats batches;
  const auto static_out = qwen::generate_requests(model, reqs, options, &batches);
  for (std::size_t r = 0; r < 5; ++r) {
    for (std::size_t i = 0; i < 4; ++i) CHECK(static_out[r][i].tokens.size() == out[r][i].tokens.size());
  }
  CHECK(batches.prefill_rows == 20);
  CHECK(batches.rows_computed > continuous.rows_computed);
}

TEST_CASE("engine: at the CUDA graphs' shapes (rows and window rounded up, padding rows) the sequences are the same") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  const auto reqs = requests(3);  // 15 sequences
  qwen::EngineOptions options;
  options.max_new_tokens = 12;
  options.sampling.temperature = 0.0;
  options.return_logprobs = true;
  options.stop_ids = {row_of(greedy_reference(model, reqs, options).tokens, 0, 3)[2]};
  CHECK_FALSE(qwen::DecodeGraphs(torch::kCPU, true).active());  // graphs are CUDA's; here only the shapes
  bool padded = false;
  for (const int64_t pool : {5, 6}) {
    // Checks every step, and fewer than the budget allows (the padding rows then run the longest between resets).
    for (const int64_t check_every : {1, 16}) {
      CAPTURE(pool);
      CAPTURE(check_every);
      options.max_num_seqs = pool;
      options.check_every = check_every;
      options.graph_shapes = false;
      qwen::EngineStats exact_stats, rounded_stats;
      const auto exact = qwen::generate_requests(model, reqs, options, &exact_stats);
      options.graph_shapes = true;
      const auto rounded = qwen::generate_requests(model, reqs, options, &rounded_stats);
      for (std::size_t r = 0; r < reqs.size(); ++r) {
        for (std::size_t i = 0; i < 3; ++i) {
          CHECK(rounded[r][i].tokens == exact[r][i].tokens);
          CHECK(rounded[r][i].finish_reason == exact[r][i].finish_reason);
          // The same rows through products of other shapes: float32 rounding apart.
          CHECK(
              torch::allclose(torch::tensor(rounded[r][i].logprobs), torch::tensor(exact[r][i].logprobs), 1e-4, 1e-4));
        }
      }
      CHECK(rounded_stats.decode_calls == exact_stats.decode_calls);
      CHECK(rounded_stats.rows_computed >= exact_stats.rows_computed);
      padded = padded || rounded_stats.rows_computed > exact_stats.rows_computed;
      CHECK(rounded_stats.graph_captures == 0);
      CHECK(rounded_stats.graph_replays == 0);
    }
  }
  CHECK(padded);  // 5 and 3 live rows of 6 slots round up to 6 and 4

  // Sampling with the repetition penalty and per-request budgets: the padding rows write the penalty's and the draws'
  // state of free slots too; every sequence still ends by its budget.
  options.sampling = {.temperature = 1.0, .top_k = 20, .repetition_penalty = 1.2};
  options.max_num_seqs = 6;
  options.check_every = 16;
  auto budgeted = reqs;
  for (std::size_t r = 0; r < budgeted.size(); ++r) budgeted[r].max_tokens = 1 + static_cast<int64_t>(r * 5) % 12;
  qwen::EngineStats stats;
  const auto sampled = qwen::generate_requests(model, budgeted, options, &stats);
  for (std::size_t r = 0; r < reqs.size(); ++r) {
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& sequence = sampled[r][i];
      CHECK(static_cast<int64_t>(sequence.tokens.size()) <= budgeted[r].max_tokens);
      CHECK(sequence.logprobs.size() == sequence.tokens.size());
      for (const float logprob : sequence.logprobs) CHECK(std::isfinite(logprob));
    }
  }
  CHECK(stats.sequences == 15);
}

TEST_CASE("engine: one engine serves many runs: each sampling's graphs are captured once, then only replayed") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir, torch::kFloat32);
  qwen::EngineOptions options;
  options.max_num_seqs = 6;  // 15 sequences through 6 slots: live rows 6, 3, ... rounded up with padding
  options.max_prompt_tokens = 5;
  options.max_new_tokens = 10;
  options.sampling = {.temperature = 1.0, .top_k = 20};
  options.return_logprobs = true;
  options.check_every = 4;
  const auto recorder = std::make_shared<StepRecorder>();
  qwen::GenerationEngine engine(model, options, recorder);
  // A rollout: every request of requests(3) with its seed moved by `shift`; its sequences, [request][sample].
  const auto rollout = [&](uint64_t shift, qwen::EngineStats& stats) {
    std::vector<qwen::EngineRequest> reqs = requests(3);
    for (auto& request : reqs) request.seed += shift;
    return qwen::generate_requests(engine, reqs, &stats);
  };
  qwen::EngineStats first, second, third;
  const auto run1 = rollout(0, first);
  const auto run2 = rollout(1000, second);
  const auto run3 = rollout(0, third);
  CHECK(first.graph_captures > 0);
  CHECK(first.graph_captures == recorder->captured);
  // Later runs meet only shapes the first captured: no capture, every step a replay.
  CHECK(second.graph_captures == 0);
  CHECK(third.graph_captures == 0);
  CHECK(second.graph_replays == second.decode_calls);
  CHECK(third.graph_replays == third.decode_calls);
  CHECK(recorder->replayed == first.graph_replays + second.graph_replays + third.graph_replays);
  CHECK(second.cache_bytes == first.cache_bytes);
  // Nothing of a run leaks into the next: the first run's seeds give its sequences again, bit for bit.
  CHECK(first.sequences == 15);
  CHECK(third.sequences == 15);
  bool differs = false;
  for (std::size_t r = 0; r < run1.size(); ++r) {
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(run3[r][i].tokens == run1[r][i].tokens);
      CHECK(run3[r][i].logprobs == run1[r][i].logprobs);
      differs = differs || run2[r][i].tokens != run1[r][i].tokens;
    }
  }
  CHECK(differs);                                   // other seeds, other draws
  CHECK(engine.kept_bytes() == first.cache_bytes);  // float32: no compute copy

  // A greedy run (an evaluation) on the same engine: its own graphs, captured once; its tokens a fresh engine's.
  const qwen::RunOptions greedy{.sampling = {.temperature = 0.0}, .return_logprobs = false};
  qwen::EngineStats evaluation, again;
  const auto greedy_run = [&](qwen::EngineStats& stats) {
    std::vector<std::vector<int64_t>> tokens;
    for (const auto& samples : qwen::generate_requests(engine, requests(1), &stats, greedy)) {
      tokens.push_back(samples[0].tokens);
    }
    return tokens;
  };
  const auto evaluated = greedy_run(evaluation);
  const auto evaluated_again = greedy_run(again);
  CHECK(evaluation.graph_captures > 0);
  CHECK(again.graph_captures == 0);
  CHECK(again.graph_replays == again.decode_calls);
  CHECK(evaluated_again == evaluated);
  qwen::EngineOptions fresh_options = options;
  fresh_options.sampling = greedy.sampling;
  fresh_options.return_logprobs = false;
  const auto fresh = qwen::generate_requests(model, requests(1), fresh_options);
  for (std::size_t r = 0; r < fresh.size(); ++r) CHECK(fresh[r][0].tokens == evaluated[r]);
  // The sampled runs' graphs are kept beside them: a fourth rollout captures nothing.
  qwen::EngineStats fourth;
  rollout(0, fourth);
  CHECK(fourth.sequences == 15);
  CHECK(fourth.graph_captures == 0);
}

TEST_CASE("engine: under bfloat16 autocast over float32 weights it computes as the bfloat16 model, refreshed per run") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir, torch::kFloat32);
  qwen::EngineOptions options;
  options.max_num_seqs = 4;
  options.max_prompt_tokens = 5;
  options.max_new_tokens = 8;
  options.sampling.temperature = 0.0;
  options.return_logprobs = true;
  const auto reqs = requests(2);
  // The float32 model's weights as a bfloat16 model holds them (round to nearest, as load_model converts), run with no
  // autocast: what the engine's compute copy must compute, bit for bit.
  const auto as_bfloat16 = [&] {
    auto converted = qwen::load_model(*dir, torch::kBFloat16);
    torch::NoGradGuard no_grad;
    const auto sources = model->named_parameters();
    for (auto& item : converted->named_parameters()) item.value().copy_(sources[item.key()]);
    return qwen::generate_requests(converted, reqs, options);
  };
  const qwen::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
  qwen::GenerationEngine kept(model, options);
  qwen::EngineStats first, second;
  const auto before = qwen::generate_requests(kept, reqs, &first);
  int64_t parameters = 0, buffers = 0;
  for (const auto& parameter : model->parameters()) parameters += parameter.numel();
  for (const auto& buffer : model->buffers()) buffers += static_cast<int64_t>(buffer.nbytes());
  // The pool, a bfloat16 copy of every weight and the float32 rotary frequencies.
  CHECK(kept.kept_bytes() == first.cache_bytes + 2 * parameters + buffers);
  {
    torch::NoGradGuard no_grad;  // an optimizer step: every weight changed in place
    for (auto& parameter : model->parameters()) parameter.mul_(0.75);
  }
  const auto after = qwen::generate_requests(kept, reqs, &second);
  std::vector<std::vector<qwen::EngineSequence>> reference;
  {
    const qwen::AutocastOff off(torch::kCPU);
    reference = as_bfloat16();
  }
  bool changed = false;
  for (std::size_t r = 0; r < reqs.size(); ++r) {
    for (std::size_t i = 0; i < 2; ++i) {
      CHECK(after[r][i].tokens == reference[r][i].tokens);  // the new weights, read through the refreshed copy
      CHECK(after[r][i].logprobs == reference[r][i].logprobs);
      changed = changed || after[r][i].logprobs != before[r][i].logprobs;
    }
  }
  CHECK(changed);
}

TEST_CASE("engine: the host's door: no read or copy inside a decode step, one read per check, outputs fetched") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir, torch::kFloat32);
  torch::NoGradGuard no_grad;
  for (const bool sampled : {false, true}) {
    CAPTURE(sampled);
    qwen::EngineOptions options;
    options.max_num_seqs = 4;
    options.max_prompt_tokens = 5;
    options.max_new_tokens = 12;
    options.return_logprobs = true;
    options.sampling.temperature = sampled ? 1.0 : 0.0;
    qwen::EngineStats stats;
    qwen::ModelRunner runner(model, options, torch::kFloat32, nullptr);
    runner.begin(stats,
                 {.sampling = options.sampling,
                  .return_logprobs =
                      options.return_logprobs});  // resets the pool's per-slot state on the device: no read, no copy
    const auto reqs = requests(2);
    std::size_t next = 0;
    const qwen::RequestSource source = [&]() -> std::optional<qwen::EngineRequest> {
      if (next == reqs.size()) return std::nullopt;
      return reqs[next++];
    };
    qwen::Scheduler scheduler(
        {.max_num_seqs = 4, .max_prompt_tokens = 5, .max_new_tokens = 12, .vocab_size = model->config().vocab_size},
        source, stats);
    const qwen::host_door::Counts start = qwen::host_door::counts();
    runner.admit(scheduler.admit());  // 2 prompts prefilled, each forked into 2 slots
    const qwen::host_door::Counts admitted = qwen::host_door::counts();
    CHECK(admitted.reads == start.reads);  // an admission reads nothing back
    // ids, mask and last positions of the prefill; slots and rows of the fork; positions (and uniforms when sampled)
    CHECK(admitted.copies - start.copies == (sampled ? 7 : 6));
    for (int64_t step = 0; step < 8; ++step) {
      const qwen::StepShape shape = scheduler.next_step();
      runner.decode(shape);
      scheduler.stepped(shape);
    }
    const qwen::host_door::Counts decoded = qwen::host_door::counts();
    CHECK(decoded.reads == admitted.reads);  // eight decode steps: no read, no copy
    CHECK(decoded.copies == admitted.copies);
    const std::vector<int64_t> flags = runner.finished_flags(scheduler.rows());
    CHECK(flags.size() == 4);
    const qwen::host_door::Counts checked = qwen::host_door::counts();
    CHECK(checked.reads == decoded.reads + 1);  // the check's one read
    // The finished rows' outputs: one copy (their rows' indices), two fetches (tokens, log-probs), no wait.
    qwen::ModelRunner::Outputs outputs = runner.fetch_outputs({0, 2});
    const qwen::host_door::Counts fetched = qwen::host_door::counts();
    CHECK(fetched.reads == checked.reads);
    CHECK(fetched.fetches == checked.fetches + 2);
    CHECK(fetched.copies == checked.copies + 1);
    const torch::Tensor tokens = outputs.tokens.get(), logprobs = outputs.logprobs.get();
    CHECK(tokens.sizes() == torch::IntArrayRef{2, 12});
    CHECK(logprobs.sizes() == torch::IntArrayRef{2, 12});
    CHECK(qwen::host_door::counts().reads == checked.reads);  // taking them reads nothing more
  }
  // A whole run: one wait per check, its flags; every finished row's outputs fetched.
  qwen::EngineOptions options;
  options.max_num_seqs = 3;
  options.max_prompt_tokens = 5;
  options.max_new_tokens = 12;
  options.return_logprobs = true;
  qwen::EngineStats stats;
  qwen::generate_requests(model, requests(2), options, &stats);  // 5 prompts x 2 samples in 3 slots
  CHECK(stats.sequences == 10);
  CHECK(stats.host_reads == stats.checks);
  CHECK(stats.host_fetches >= 2);
  CHECK(stats.host_fetches <= 2 * stats.checks);
}

TEST_CASE("engine: a sink that says stop ends the run and counts the sequences in flight as dropped") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  qwen::EngineOptions options;
  options.max_new_tokens = 8;
  options.max_prompt_tokens = 8;
  options.max_num_seqs = 4;
  options.check_every = 1;
  int64_t pulled = 0, received = 0;
  qwen::GenerationEngine engine(model, options);
  const auto stats = engine.run(
      [&]() -> std::optional<qwen::EngineRequest> {
        if (pulled == 100) return std::nullopt;
        const int64_t request = pulled++;
        return qwen::EngineRequest{
            .prompt = {5, 6, 7 + request % 10}, .n = 2, .seed = 1, .max_tokens = 2 + request % 5};
      },
      [&](qwen::EngineSequence&&) { return ++received < 7; });
  CHECK(received == 7);
  CHECK(stats.sequences == 7);
  CHECK(stats.dropped > 0);
  CHECK(stats.dropped <= options.max_num_seqs);
  CHECK(stats.requests < 100);  // prompts are taken as slots free up, not all at once
}

TEST_CASE("group stream: admission by the informative share, decisions in prompt order, the stop and the bound") {
  // Groups of 2 responses, 3 to keep. Before any decision every undecided group counts as informative: 3 admitted.
  qwen::GroupStream stream(2, 3, 0);
  CHECK(stream.admit());
  CHECK(stream.admit());
  CHECK(stream.admit());
  CHECK_FALSE(stream.admit());
  std::vector<int64_t> asked;
  const auto keep_even = [&](int64_t group) {
    asked.push_back(group);
    return group % 2 == 0;
  };
  // Group 1 completes first: it waits for group 0, which decides first.
  CHECK_FALSE(stream.response_done(1));
  CHECK(stream.response_done(1));
  CHECK(stream.decide(keep_even));
  CHECK(asked.empty());
  CHECK_FALSE(stream.response_done(0));
  CHECK(stream.response_done(0));
  CHECK(stream.decide(keep_even));
  CHECK(asked == std::vector<int64_t>{0, 1});
  CHECK(stream.decided() == 2);
  CHECK(stream.kept() == 1);
  // Share 1/2: kept 1 + 0.5 x undecided must stay under 3, so the undecided (group 2 so far) may grow to 4.
  CHECK(stream.admit());
  CHECK(stream.admit());
  CHECK(stream.admit());
  CHECK_FALSE(stream.admit());
  CHECK(stream.pulled() == 6);
  // Groups 2 and 4 are kept, 3 is not: the stop at the third kept group leaves group 5 undecided (dropped).
  for (const int64_t group : {2, 3, 4, 5}) {
    stream.response_done(group);
    stream.response_done(group);
  }
  CHECK_FALSE(stream.decide(keep_even));
  CHECK(asked == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(stream.done());
  CHECK(stream.kept() == 3);
  CHECK(stream.dropped() == 1);
  CHECK_FALSE(stream.admit());

  // Nothing informative: admission never holds back, and max_groups bounds the prompts.
  qwen::GroupStream bounded(1, 2, 4);
  int64_t admitted = 0;
  while (bounded.admit()) {
    ++admitted;
    bounded.response_done(admitted - 1);
    CHECK(bounded.decide([](int64_t) { return false; }));
  }
  CHECK(admitted == 4);
  CHECK_FALSE(bounded.done());

  // The stop drops the groups taken after the deciding one. Target 2: groups 0 and 1 fill it until group 0 is
  // decided as not informative (share 0), then 2 and 3 are taken up to the bound; 1 and 2 are kept, 3 is dropped.
  qwen::GroupStream dropping(1, 2, 4);
  CHECK(dropping.admit());
  CHECK(dropping.admit());
  CHECK_FALSE(dropping.admit());
  dropping.response_done(0);
  CHECK(dropping.decide([](int64_t) { return false; }));
  CHECK(dropping.admit());
  CHECK(dropping.admit());
  CHECK_FALSE(dropping.admit());  // the bound
  dropping.response_done(2);
  dropping.response_done(1);
  CHECK_FALSE(dropping.decide([](int64_t) { return true; }));
  CHECK(dropping.kept() == 2);
  CHECK(dropping.dropped() == 1);

  CHECK_THROWS_WITH_AS(stream.response_done(9), doctest::Contains("group 9 was never admitted"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(stream.response_done(0), doctest::Contains("group 0 has all its 2 responses"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(qwen::GroupStream(0, 1, 0), doctest::Contains("group_size 0"), std::invalid_argument);
}

TEST_CASE("engine: bad requests and options are refused, naming what and which") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  qwen::EngineOptions options;
  options.max_new_tokens = 4;
  const auto run = [&](std::vector<qwen::EngineRequest> reqs) { return qwen::generate_requests(model, reqs, options); };
  CHECK_THROWS_WITH_AS(run({{.prompt = {1, 2}}, {.prompt = {}}}), doctest::Contains("request 1 has an empty prompt"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(run({{.prompt = {1, 600}}}), doctest::Contains("request 0 holds token 600"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(run({{.prompt = {1}, .n = 0}}), doctest::Contains("request 0 asks for n = 0"),
                       std::invalid_argument);
  options.max_prompt_tokens = 2;
  CHECK_THROWS_WITH_AS(run({{.prompt = {1, 2, 3}}}), doctest::Contains("more than max_prompt_tokens 2"),
                       std::invalid_argument);
  options.max_num_seqs = 0;
  CHECK_THROWS_WITH_AS(run({{.prompt = {1}}}), doctest::Contains("max_num_seqs is 0"), std::invalid_argument);
}
